// prepare_text: UTF-8 text and JSONL files -> GPT-2-style BPE token shards in llm.c's formats
// (train and val), tokenized in parallel with a deterministic output.
// Run with --help for usage. Exit codes: 0 done, 2 bad input or usage (message names the file).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/data/shard.h"
#include "llmc/core/utf8.h"
#include "llmc/data/tokenizer.h"

namespace {

const char* kUsage = R"(usage: prepare_text --out PREFIX [options] FILE|FOLDER...

Tokenizes UTF-8 text and JSON lines with GPT-2's BPE (or another byte-level BPE in the same
files) and writes token shards in llm.c's format (1024-byte header: magic 20240520, version 1,
token count; then uint16 tokens), or, when the tokenizer has more than 65536 tokens, llm.c's
uint32 format (magic 20240801, version 7, token count; then uint32 tokens):
    PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...
    PREFIX_val_000000.bin, ...
Every document is preceded by the end-of-text token (50256 in GPT-2), as llm.c does; a shard
is filled to --shard-tokens and the rest spills into the next one. Shards of an earlier run
with the same PREFIX beyond the ones written now are removed.

Inputs, by name (--format overrides): NAME.jsonl holds one JSON object per line, its --field
string a document (blank lines skipped); NAME.json one JSON array of such objects (TinyStories'
data files); anything else is plain text (--doc-sep). A FOLDER stands for every .txt, .jsonl
and .json file under it, recursively, in byte order of their paths. Each file is read whole.
The documents keep the order of the inputs whatever --jobs is: the shards are the same bytes.

options:
  --out PREFIX          output path prefix (folders are created)            [required]
  --tokenizer DIR       folder with encoder.json and vocab.bpe       [data/tokenizer]
  --val FILE|FOLDER     validation data (repeatable); the FILE|FOLDER... arguments are
                        then all training data
  --val-frac F          without --val: the last F of the documents (in input order,
                        at least one, at most all but one) go to val; 0 = no val   [0.1]
  --shard-tokens N      tokens per shard                                  [100000000]
  --doc-sep file|blank  text files: a document is a whole file, or each blank-line-
                        separated paragraph of a file                          [file]
  --field NAME          JSON inputs: the string field holding a document's text [text]
  --format auto|text|jsonl|json
                        how to read every input (auto: by its name, see above) [auto]
  --jobs N              tokenizer threads                    [hardware threads: %u]
  --quiet               no progress lines (the summary is still printed)
  -h, --help            this help

examples:
  dev/data/prepare_text --out data/kjv/kjv --val data/kjv/val/66_Revelation.txt data/kjv/train/*.txt
  dev/data/prepare_text --out data/fineweb10B/fineweb --val-frac 0.01 --jobs 16 data/fineweb_jsonl/
  (scripts/get_data.md: FineWeb, TinyStories and other corpora)
)";

enum class Format { Auto, Text, Jsonl, Json };

struct Options {
    std::string out;
    std::string tokenizer = "data/tokenizer";
    std::vector<std::string> inputs, val_files;
    double val_frac = 0.1;
    bool val_frac_given = false;
    size_t shard_tokens = 100000000;
    bool blank_docs = false;
    bool quiet = false;
    std::string field = "text";
    Format format = Format::Auto;
    unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
};

[[noreturn]] void usage_error(const std::string& msg) {
    throw UserError(msg + " (see --help)");
}

Options parse_args(int argc, char** argv) {
    Options o;
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (options_done || a.empty() || a[0] != '-' || a == "-") {
            o.inputs.push_back(a);
            continue;
        }
        if (a == "--") { options_done = true; continue; }
        if (a == "-h" || a == "--help") {
            std::printf(kUsage, std::max(1u, std::thread::hardware_concurrency()));
            std::exit(0);
        }
        if (a == "--quiet") { o.quiet = true; continue; }
        std::string key = a, value;
        size_t eq = a.find('=');
        if (eq != std::string::npos) {
            key = a.substr(0, eq);
            value = a.substr(eq + 1);
        } else {
            if (i + 1 >= argc) usage_error("option " + a + " needs a value");
            value = argv[++i];
        }
        char* end = nullptr;
        if (key == "--out") o.out = value;
        else if (key == "--tokenizer") o.tokenizer = value;
        else if (key == "--val") o.val_files.push_back(value);
        else if (key == "--val-frac") {
            o.val_frac = std::strtod(value.c_str(), &end);
            if (value.empty() || *end || !(o.val_frac >= 0 && o.val_frac < 1))
                usage_error("--val-frac must be a number in [0, 1), got '" + value + "'");
            o.val_frac_given = true;
        } else if (key == "--shard-tokens") {
            long long n = std::strtoll(value.c_str(), &end, 10);
            if (value.empty() || *end || n < 1 || n > 0x7fffffffLL)
                usage_error("--shard-tokens must be an integer in [1, 2^31), got '" + value + "'");
            o.shard_tokens = static_cast<size_t>(n);
        } else if (key == "--doc-sep") {
            if (value == "blank") o.blank_docs = true;
            else if (value == "file") o.blank_docs = false;
            else usage_error("--doc-sep must be 'file' or 'blank', got '" + value + "'");
        } else if (key == "--field") {
            if (value.empty()) usage_error("--field needs a name");
            o.field = value;
        } else if (key == "--format") {
            if (value == "auto") o.format = Format::Auto;
            else if (value == "text") o.format = Format::Text;
            else if (value == "jsonl") o.format = Format::Jsonl;
            else if (value == "json") o.format = Format::Json;
            else usage_error("--format must be auto, text, jsonl or json, got '" + value + "'");
        } else if (key == "--jobs") {
            long n = std::strtol(value.c_str(), &end, 10);
            if (value.empty() || *end || n < 1 || n > 1024)
                usage_error("--jobs must be an integer in [1, 1024], got '" + value + "'");
            o.jobs = unsigned(n);
        } else {
            usage_error("unknown option " + key);
        }
    }
    if (o.out.empty()) usage_error("--out PREFIX is required");
    if (o.inputs.empty()) usage_error("no input files or folders");
    if (!o.val_files.empty() && o.val_frac_given) usage_error("give either --val or --val-frac, not both");
    if (!o.val_files.empty()) o.val_frac = 0;
    return o;
}

std::string read_text_file(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0)
        throw UserError(strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
    if (S_ISDIR(st.st_mode)) throw UserError(strfmt("%s: is a folder, not a text file", path.c_str()));
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UserError(strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw UserError(strfmt("%s: read error", path.c_str()));
    std::string s = ss.str();
    size_t bad = utf8_invalid_at(s);
    if (bad != std::string::npos)
        throw UserError(strfmt("%s: not UTF-8 text: invalid byte sequence at byte %zu", path.c_str(), bad));
    return s;
}

// [begin, end) byte ranges of the documents in a file's text.
std::vector<std::pair<size_t, size_t>> split_docs(const std::string& text, bool blank) {
    std::vector<std::pair<size_t, size_t>> docs;
    if (text.empty()) return docs;
    if (!blank) {
        docs.emplace_back(0, text.size());
        return docs;
    }
    size_t para_begin = std::string::npos;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        size_t next = nl == std::string::npos ? text.size() : nl + 1;
        bool is_blank = true;
        for (size_t k = pos; k < next && is_blank; k++)
            is_blank = text[k] == ' ' || text[k] == '\t' || text[k] == '\r' || text[k] == '\n';
        if (is_blank) {
            if (para_begin != std::string::npos) docs.emplace_back(para_begin, pos);
            para_begin = std::string::npos;
        } else if (para_begin == std::string::npos) {
            para_begin = pos;
        }
        pos = next;
    }
    if (para_begin != std::string::npos) docs.emplace_back(para_begin, text.size());
    return docs;
}

bool ends_with(const std::string& s, const std::string& e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

Format format_of(const std::string& path, Format forced) {
    if (forced != Format::Auto) return forced;
    if (ends_with(path, ".jsonl")) return Format::Jsonl;
    if (ends_with(path, ".json")) return Format::Json;
    return Format::Text;
}

// The files the arguments name: files as given, folders as their .txt, .jsonl and .json files
// (recursively, sorted by path; with --format, those of that format's extension).
std::vector<std::string> expand_inputs(const std::vector<std::string>& args, Format forced) {
    namespace fs = std::filesystem;
    std::vector<std::string> out;
    for (const std::string& a : args) {
        std::error_code ec;
        if (!fs::is_directory(a, ec)) {
            out.push_back(a);  // read_text_file names it if it is missing
            continue;
        }
        std::vector<std::string> found;
        for (fs::recursive_directory_iterator it(a, ec), end; !ec && it != end; it.increment(ec)) {
            const std::string p = it->path().string();
            if (!it->is_regular_file() || it->path().filename().string()[0] == '.') continue;
            const bool txt = ends_with(p, ".txt"), jsonl = ends_with(p, ".jsonl"), json = ends_with(p, ".json");
            if ((forced == Format::Auto && (txt || jsonl || json)) || (forced == Format::Text && txt) ||
                (forced == Format::Jsonl && jsonl) || (forced == Format::Json && json))
                found.push_back(p);
        }
        if (ec) throw UserError(strfmt("%s: cannot list the folder: %s", a.c_str(), ec.message().c_str()));
        if (found.empty()) throw UserError(strfmt("%s: a folder without .txt, .jsonl or .json files", a.c_str()));
        std::sort(found.begin(), found.end());
        out.insert(out.end(), found.begin(), found.end());
    }
    return out;
}

// The string field `field` of one JSON record; where: "FILE:LINE" or "FILE: element N".
std::string record_text(const nlohmann::json& rec, const std::string& field, const std::string& where) {
    if (!rec.is_object()) throw UserError(strfmt("%s: not a JSON object", where.c_str()));
    auto it = rec.find(field);
    if (it == rec.end())
        throw UserError(strfmt("%s: the record has no field \"%s\" (choose the text field with --field)", where.c_str(),
                               field.c_str()));
    if (!it->is_string())
        throw UserError(strfmt("%s: field \"%s\" is not a string", where.c_str(), field.c_str()));
    return it->get<std::string>();
}

// The documents of one input file, in order (empty texts skipped). Throws UserError naming the
// file (and line or element) for unreadable files, invalid UTF-8 and malformed JSON.
std::vector<std::string> load_docs(const std::string& path, const Options& o) {
    const std::string text = read_text_file(path);
    std::vector<std::string> docs;
    switch (format_of(path, o.format)) {
        case Format::Auto:
        case Format::Text:
            for (auto [b, e] : split_docs(text, o.blank_docs)) docs.push_back(text.substr(b, e - b));
            return docs;
        case Format::Jsonl: {
            size_t line = 0;
            for (size_t pos = 0; pos < text.size(); line++) {
                size_t nl = text.find('\n', pos);
                if (nl == std::string::npos) nl = text.size();
                const std::string_view l(text.data() + pos, nl - pos);
                pos = nl + 1;
                if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
                const std::string where = strfmt("%s:%zu", path.c_str(), line + 1);
                nlohmann::json rec;
                try {
                    rec = nlohmann::json::parse(l);
                } catch (const nlohmann::json::parse_error& e) {
                    throw UserError(strfmt("%s: not a JSON object (%s)", where.c_str(), e.what()));
                }
                std::string doc = record_text(rec, o.field, where);
                if (!doc.empty()) docs.push_back(std::move(doc));
            }
            return docs;
        }
        case Format::Json: {
            nlohmann::json all;
            try {
                all = nlohmann::json::parse(text);
            } catch (const nlohmann::json::parse_error& e) {
                throw UserError(strfmt("%s: not JSON (%s)", path.c_str(), e.what()));
            }
            if (!all.is_array()) throw UserError(strfmt("%s: not a JSON array of records", path.c_str()));
            for (size_t i = 0; i < all.size(); i++) {
                std::string doc = record_text(all[i], o.field, strfmt("%s: element %zu", path.c_str(), i));
                if (!doc.empty()) docs.push_back(std::move(doc));
            }
            return docs;
        }
    }
    return docs;
}

// Runs f(i) for i in [0, n) on `jobs` threads. The first failure by index is rethrown, so the
// error reported does not depend on the threads' timing.
template <class F>
void parallel_for(size_t n, unsigned jobs, F f) {
    std::vector<std::exception_ptr> errors(n);
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next++) < n;) {
            try {
                f(i);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 1; t < std::min<size_t>(jobs, n); t++) threads.emplace_back(work);
    work();
    for (auto& t : threads) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

// Accumulates one split's tokens and writes full shards (uint16 or uint32 tokens) as they fill.
class ShardWriter {
public:
    ShardWriter(std::string prefix, std::string split, size_t shard_tokens, bool u32)
        : prefix_(std::move(prefix)), split_(std::move(split)), shard_tokens_(shard_tokens), u32_(u32) {}

    void add(const std::vector<int>& ids) {
        buf_.insert(buf_.end(), ids.begin(), ids.end());
        tokens_ += ids.size();
        size_t done = 0;
        while (buf_.size() - done >= shard_tokens_) {
            write(buf_.data() + done, shard_tokens_);
            done += shard_tokens_;
        }
        buf_.erase(buf_.begin(), buf_.begin() + done);
    }
    // Writes the last partial shard and removes stale shards of an earlier run.
    void finish() {
        if (!buf_.empty()) write(buf_.data(), buf_.size());
        buf_.clear();
        for (const std::string& f : glob_files(prefix_ + "_" + split_ + "_*.bin")) {
            if (std::find(written_.begin(), written_.end(), f) == written_.end()) {
                std::remove(f.c_str());
                std::fprintf(stderr, "prepare_text: removed stale shard %s\n", f.c_str());
            }
        }
    }
    size_t tokens() const { return tokens_; }
    const std::vector<std::string>& written() const { return written_; }

private:
    void write(const uint32_t* t, size_t n) {
        std::string path = strfmt("%s_%s_%06zu.bin", prefix_.c_str(), split_.c_str(), written_.size());
        if (u32_) {
            shard_write(path, t, n);
        } else {
            std::vector<uint16_t> t16(t, t + n);
            shard_write(path, t16.data(), n);
        }
        written_.push_back(path);
    }
    std::string prefix_, split_;
    size_t shard_tokens_;
    bool u32_;
    std::vector<uint32_t> buf_;
    size_t tokens_ = 0;
    std::vector<std::string> written_;
};

std::string human(double x) {
    if (x >= 1e9) return strfmt("%.2fG", x / 1e9);
    if (x >= 1e6) return strfmt("%.2fM", x / 1e6);
    if (x >= 1e3) return strfmt("%.1fk", x / 1e3);
    return strfmt("%.0f", x);
}

int run(const Options& o) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    Tokenizer tok = [&] {
        try {
            return Tokenizer::load(o.tokenizer);
        } catch (const UserError& e) {
            throw UserError(std::string(e.what()) + " (scripts/get_tokenizer.sh DIR fetches GPT-2's files)");
        }
    }();

    // The inputs in order, each marked train or val; pass 1 reads every file (in parallel) before
    // any shard is written, checking it and counting its documents (for --val-frac).
    struct Input { std::string path; bool val; size_t bytes; size_t docs; };
    std::vector<Input> inputs;
    for (const auto& p : expand_inputs(o.inputs, o.format)) inputs.push_back({p, false, 0, 0});
    for (const auto& p : expand_inputs(o.val_files, o.format)) inputs.push_back({p, true, 0, 0});
    parallel_for(inputs.size(), o.jobs, [&](size_t i) {
        for (const std::string& d : load_docs(inputs[i].path, o)) inputs[i].bytes += d.size(), inputs[i].docs++;
    });
    size_t total_bytes = 0, total_docs = 0;
    for (const auto& in : inputs) {
        total_bytes += in.bytes;
        total_docs += in.docs;
        if (in.docs == 0) std::fprintf(stderr, "prepare_text: warning: %s has no text, skipped\n", in.path.c_str());
    }
    size_t val_docs = 0;  // with --val-frac: the last val_docs documents go to val
    if (o.val_frac > 0) {
        if (total_docs < 2)
            throw UserError(strfmt("--val-frac %g needs at least 2 documents but the input has %zu; give --val FILE, "
                                   "more files, or --doc-sep blank", o.val_frac, total_docs));
        val_docs = static_cast<size_t>(std::llround(o.val_frac * total_docs));
        val_docs = std::min(std::max<size_t>(val_docs, 1), total_docs - 1);
    }

    std::string dir = std::filesystem::path(o.out).parent_path().string();
    if (!dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) throw UserError(strfmt("--out %s: cannot create folder %s: %s", o.out.c_str(), dir.c_str(),
                                       ec.message().c_str()));
    }
    const bool u32 = tok.vocab_size() > SHARD_U16_MAX_VOCAB;
    ShardWriter train(o.out, "train", o.shard_tokens, u32), val(o.out, "val", o.shard_tokens, u32);
    size_t train_docs = 0, val_doc_count = 0, bytes_done = 0, doc_index = 0;

    const bool tty = isatty(fileno(stderr));
    auto last_report = t0;
    auto report = [&](bool final_line) {
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "%sprepare_text: %5.1f%%  %sB of %sB of text, %s tokens (train %s, val %s), %.1f MB/s%s",
                     tty ? "\r" : "", total_bytes ? 100.0 * bytes_done / total_bytes : 100.0,
                     human(bytes_done).c_str(), human(total_bytes).c_str(), human(train.tokens() + val.tokens()).c_str(),
                     human(train.tokens()).c_str(), human(val.tokens()).c_str(), bytes_done / 1e6 / std::max(secs, 1e-9),
                     (!tty || final_line) ? "\n" : "");
        std::fflush(stderr);
    };

    // Pass 2: documents gathered in input order into batches of about kBatchBytes of text, each
    // batch tokenized on o.jobs threads and appended in order.
    constexpr size_t kBatchBytes = size_t(8) << 20;
    struct Doc { std::string text; bool val; };
    std::vector<Doc> batch;
    std::vector<std::vector<int>> ids;
    size_t batch_bytes = 0;
    auto flush = [&] {
        ids.assign(batch.size(), {});
        parallel_for(batch.size(), o.jobs, [&](size_t i) {
            ids[i].push_back(tok.eot());
            const std::vector<int> t = tok.encode(batch[i].text);
            ids[i].insert(ids[i].end(), t.begin(), t.end());
        });
        for (size_t i = 0; i < batch.size(); i++) {
            (batch[i].val ? val : train).add(ids[i]);
            (batch[i].val ? val_doc_count : train_docs)++;
            bytes_done += batch[i].text.size();
        }
        batch.clear();
        batch_bytes = 0;
        if (!o.quiet && Clock::now() - last_report > std::chrono::milliseconds(tty ? 200 : 2000)) {
            last_report = Clock::now();
            report(false);
        }
    };
    for (const auto& in : inputs) {
        std::vector<std::string> docs = load_docs(in.path, o);
        if (docs.size() != in.docs) throw UserError(strfmt("%s: changed while being read", in.path.c_str()));
        for (std::string& d : docs) {
            const bool to_val = in.val || (val_docs > 0 && doc_index >= total_docs - val_docs);
            doc_index++;
            batch_bytes += d.size();
            batch.push_back({std::move(d), to_val});
            if (batch_bytes >= kBatchBytes) flush();
        }
    }
    flush();
    train.finish();
    val.finish();
    if (!o.quiet) report(true);

    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr,
                 "prepare_text: done in %.1f s: %zu files, %s bytes of text, %zu documents, %s tokens (vocabulary %d); "
                 "%.2f MB/s on %u thread%s\n",
                 secs, inputs.size(), human(total_bytes).c_str(), train_docs + val_doc_count, u32 ? "uint32" : "uint16",
                 tok.vocab_size(), total_bytes / 1e6 / std::max(secs, 1e-9), o.jobs, o.jobs == 1 ? "" : "s");
    auto summary = [](const char* name, const ShardWriter& w, size_t docs) {
        std::fprintf(stderr, "  %-5s %zu documents, %zu tokens in %zu shard(s)%s%s\n", name, docs, w.tokens(),
                     w.written().size(), w.written().empty() ? "" : ": ",
                     w.written().empty() ? ""
                         : (w.written().size() == 1 ? w.written()[0]
                                                    : w.written().front() + " .. " + w.written().back()).c_str());
    };
    summary("train", train, train_docs);
    summary("val", val, val_doc_count);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse_args(argc, argv));
    } catch (const UserError& e) {
        std::fprintf(stderr, "%sprepare_text: error: %s\n", isatty(fileno(stderr)) ? "\n" : "", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%sprepare_text: internal error: %s\n", isatty(fileno(stderr)) ? "\n" : "", e.what());
        return 1;
    }
}
