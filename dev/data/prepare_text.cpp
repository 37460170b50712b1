// prepare_text: UTF-8 text files -> GPT-2-style BPE token shards in llm.c's formats (train and val).
// Run with --help for usage. Exit codes: 0 done, 2 bad input or usage (message names the file).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/common.h"
#include "llmc/shard.h"
#include "llmc/tokenizer.h"

namespace {

const char* kUsage = R"(usage: prepare_text --out PREFIX [options] FILE...

Tokenizes UTF-8 text files with GPT-2's BPE (or another byte-level BPE in the same files) and
writes token shards in llm.c's format (1024-byte header: magic 20240520, version 1, token
count; then uint16 tokens), or, when the tokenizer has more than 65536 tokens, llm.c's uint32
format (magic 20240801, version 7, token count; then uint32 tokens):
    PREFIX_train_000000.bin, PREFIX_train_000001.bin, ...
    PREFIX_val_000000.bin, ...
Every document is preceded by the end-of-text token (50256 in GPT-2), as llm.c does; a shard
is filled to --shard-tokens and the rest spills into the next one. Shards of an earlier run
with the same PREFIX beyond the ones written now are removed.

options:
  --out PREFIX          output path prefix (folders are created)            [required]
  --tokenizer DIR       folder with encoder.json and vocab.bpe       [data/tokenizer]
  --val FILE            a validation file (repeatable); the FILE... arguments are then
                        all training data
  --val-frac F          without --val: the last F of the documents (in input order,
                        at least one, at most all but one) go to val; 0 = no val   [0.1]
  --shard-tokens N      tokens per shard                                  [100000000]
  --doc-sep file|blank  a document is a whole file, or each blank-line-separated
                        paragraph of a file                                    [file]
  --quiet               no progress lines (the summary is still printed)
  -h, --help            this help

example:
  dev/data/prepare_text --out data/kjv/kjv --val data/kjv/val/66_Revelation.txt data/kjv/train/*.txt
)";

struct Options {
    std::string out;
    std::string tokenizer = "data/tokenizer";
    std::vector<std::string> inputs, val_files;
    double val_frac = 0.1;
    bool val_frac_given = false;
    size_t shard_tokens = 100000000;
    bool blank_docs = false;
    bool quiet = false;
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
            std::fputs(kUsage, stdout);
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
        } else {
            usage_error("unknown option " + key);
        }
    }
    if (o.out.empty()) usage_error("--out PREFIX is required");
    if (o.inputs.empty()) usage_error("no input files");
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

    // The inputs in order, each marked train or val; pass 1 checks every file before any
    // shard is written and counts the documents (for --val-frac).
    struct Input { std::string path; bool val; size_t bytes; size_t docs; };
    std::vector<Input> inputs;
    for (const auto& p : o.inputs) inputs.push_back({p, false, 0, 0});
    for (const auto& p : o.val_files) inputs.push_back({p, true, 0, 0});
    size_t total_bytes = 0, total_docs = 0;
    for (auto& in : inputs) {
        std::string text = read_text_file(in.path);
        in.bytes = text.size();
        in.docs = split_docs(text, o.blank_docs).size();
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
        std::fprintf(stderr, "%sprepare_text: %5.1f%%  %sB of %sB read, %s tokens (train %s, val %s), %.1f MB/s%s",
                     tty ? "\r" : "", total_bytes ? 100.0 * bytes_done / total_bytes : 100.0,
                     human(bytes_done).c_str(), human(total_bytes).c_str(), human(train.tokens() + val.tokens()).c_str(),
                     human(train.tokens()).c_str(), human(val.tokens()).c_str(), bytes_done / 1e6 / std::max(secs, 1e-9),
                     (!tty || final_line) ? "\n" : "");
        std::fflush(stderr);
    };

    std::vector<int> ids;
    for (const auto& in : inputs) {
        const size_t file_base = bytes_done;
        std::string text = read_text_file(in.path);
        if (text.size() != in.bytes) throw UserError(strfmt("%s: changed while being read", in.path.c_str()));
        for (auto [b, e] : split_docs(text, o.blank_docs)) {
            bool to_val = in.val || (val_docs > 0 && doc_index >= total_docs - val_docs);
            doc_index++;
            ids.clear();
            ids.push_back(tok.eot());
            std::vector<int> doc = tok.encode(text.substr(b, e - b));
            ids.insert(ids.end(), doc.begin(), doc.end());
            (to_val ? val : train).add(ids);
            (to_val ? val_doc_count : train_docs)++;
            bytes_done = file_base + e;
            if (!o.quiet && Clock::now() - last_report > std::chrono::milliseconds(tty ? 200 : 2000)) {
                last_report = Clock::now();
                report(false);
            }
        }
        bytes_done = file_base + in.bytes;
    }
    train.finish();
    val.finish();
    if (!o.quiet) report(true);

    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "prepare_text: done in %.1f s: %zu files, %s bytes, %zu documents, %s tokens (vocabulary %d)\n",
                 secs, inputs.size(), human(total_bytes).c_str(), train_docs + val_doc_count, u32 ? "uint32" : "uint16",
                 tok.vocab_size());
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
