// GPT-2 tokenizer and prepare_text tests.
// Needs data/tokenizer/{encoder.json,vocab.bpe} (scripts/get_tokenizer.sh) and, for the
// prepare_text tests, the built tool dev/data/prepare_text (make). Run from the repository root.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/data/shard.h"
#include "llmc/data/tokenizer.h"
#include "test/temp_dir.h"

namespace {

const char* kTokDir = "data/tokenizer";
const char* kCases = "test/data/tokenizer_cases.json";
// the tool as make built it: LLMC_BIN (set by `make test`) prefixes it, "build-asan/" under SANITIZE=1
const std::string kPrepareTool = std::string(std::getenv("LLMC_BIN") ? std::getenv("LLMC_BIN") : "") + "dev/data/prepare_text";
const char* kPrepare = kPrepareTool.c_str();

bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

// Loaded once for all tests; a missing tokenizer is a failure, not a skip.
const Tokenizer& tokenizer() {
    static const Tokenizer* tok = nullptr;
    if (!tok) {
        std::string enc = std::string(kTokDir) + "/encoder.json", bpe = std::string(kTokDir) + "/vocab.bpe";
        if (!file_exists(enc) || !file_exists(bpe))
            FAIL("GPT-2 tokenizer files missing: " << enc << " and " << bpe
                 << " are needed; run scripts/get_tokenizer.sh from the repository root");
        tok = new Tokenizer(Tokenizer::load(kTokDir));
    }
    return *tok;
}

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_all(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    REQUIRE(f.good());
}

struct Case {
    std::string text;
    std::vector<int> ids;
};

// Reads the table written by dev/data/make_tokenizer_cases.js: one case per line, with the
// text as UTF-8 hex in "utf8_hex" and the reference ids in "ids".
std::vector<Case> load_cases(size_t& declared) {
    std::string json = read_all(kCases);
    if (json.empty()) FAIL("reference table " << kCases << " missing or empty");
    size_t c = json.find("\"count\": ");
    REQUIRE(c != std::string::npos);
    declared = std::strtoul(json.c_str() + c + 9, nullptr, 10);
    std::vector<Case> cases;
    std::istringstream lines(json);
    std::string line;
    while (std::getline(lines, line)) {
        size_t h = line.find("\"utf8_hex\":\"");
        if (h == std::string::npos) continue;
        h += 12;
        size_t he = line.find('"', h);
        size_t i = line.find("\"ids\":[", he);
        REQUIRE(he != std::string::npos);
        REQUIRE(i != std::string::npos);
        Case cs;
        for (size_t k = h; k + 1 < he; k += 2) cs.text += static_cast<char>(std::stoi(line.substr(k, 2), nullptr, 16));
        const char* p = line.c_str() + i + 7;
        while (*p && *p != ']') {
            char* end;
            cs.ids.push_back(static_cast<int>(std::strtol(p, &end, 10)));
            p = end;
            if (*p == ',') p++;
        }
        cases.push_back(std::move(cs));
    }
    return cases;
}

std::string show(const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

std::vector<uint16_t> read_shard_tokens(const std::string& path) {
    size_t n = shard_read_header(path);
    std::ifstream f(path, std::ios::binary);
    f.seekg(SHARD_HEADER_BYTES);
    std::vector<uint16_t> t(n);
    f.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(n * sizeof(uint16_t)));
    REQUIRE(f.good());
    return t;
}

// Runs a shell command; returns its exit status, its stderr/stdout go to *output.
int run_cmd(const std::string& cmd, std::string* output) {
    std::string full = cmd + " 2>&1";
    FILE* p = popen(full.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("tokenizer: reference table from the independent JS encoder", "[tokenizer]") {
    const Tokenizer& tok = tokenizer();
    size_t declared = 0;
    std::vector<Case> cases = load_cases(declared);
    REQUIRE(cases.size() == declared);
    REQUIRE(cases.size() >= 100);
    size_t mismatches = 0;
    for (const Case& cs : cases) {
        std::vector<int> got = tok.encode(cs.text);
        if (got != cs.ids) {
            mismatches++;
            UNSCOPED_INFO("text " << Catch::Detail::stringify(cs.text) << ": got " << show(got) << ", want "
                                  << show(cs.ids));
        }
        CHECK(tok.decode(cs.ids) == cs.text);
    }
    CHECK(mismatches == 0);
}

TEST_CASE("tokenizer: basics", "[tokenizer]") {
    const Tokenizer& tok = tokenizer();
    CHECK(tok.vocab_size() == 50257);
    CHECK(tok.eot() == 50256);
    CHECK(tok.decode_token(50256) == "<|endoftext|>");
    CHECK(tok.encode("Hello world") == std::vector<int>{15496, 995});
    CHECK(tok.encode("").empty());
    // "<|endoftext|>" in the text is ordinary text, never the special id.
    for (int id : tok.encode("<|endoftext|>")) CHECK(id != tok.eot());
    // Ids outside the vocabulary are an error naming the id.
    CHECK_THROWS_WITH(tok.decode_token(50257), Catch::Contains("50257"));
    CHECK_THROWS_AS(tok.decode({-1}), UserError);
    // Invalid UTF-8 is an error, not silently replaced.
    CHECK_THROWS_WITH(tok.encode(std::string("ab\xff")), Catch::Contains("invalid UTF-8 at byte 2"));
    CHECK_THROWS_AS(tok.encode(std::string("\xc3")), UserError);          // truncated
    CHECK_THROWS_AS(tok.encode(std::string("\xc0\xaf")), UserError);      // overlong
    CHECK_THROWS_AS(tok.encode(std::string("\xed\xa0\x80")), UserError);  // surrogate
}

TEST_CASE("tokenizer: pre-tokenization follows GPT-2's pattern", "[tokenizer]") {
    auto pieces = [](const std::string& s) {
        std::vector<std::string> out;
        for (auto [b, e] : gpt2_pretokenize(s)) out.push_back(s.substr(b, e - b));
        return out;
    };
    using V = std::vector<std::string>;
    CHECK(pieces("Hello world") == V{"Hello", " world"});
    CHECK(pieces("it's they'RE") == V{"it", "'s", " they", "'", "RE"});
    CHECK(pieces("a   b") == V{"a", "  ", " b"});
    CHECK(pieces("a\n\nb") == V{"a", "\n", "\n", "b"});
    CHECK(pieces("a \n b") == V{"a", " \n", " b"});
    CHECK(pieces("end  ") == V{"end", "  "});
    CHECK(pieces("x\t!") == V{"x", "\t", "!"});
    CHECK(pieces(" 123abc") == V{" 123", "abc"});
    CHECK(pieces("?!'s") == V{"?!'", "s"});
    // U+0085 (NEL) is White_Space in GPT-2's regex engine (JavaScript's \s disagrees).
    CHECK(pieces("x \xc2\x85y") == V{"x", " ", "\xc2\x85", "y"});
    // U+FEFF is not White_Space: punctuation class.
    CHECK(pieces("x \xef\xbb\xbfy") == V{"x", " \xef\xbb\xbf", "y"});
    // Non-ASCII letters and numbers; a combining mark is neither (punctuation class).
    CHECK(pieces("caf\xc3\xa9 \xd9\xa3\xd9\xa4") == V{"caf\xc3\xa9", " \xd9\xa3\xd9\xa4"});
    CHECK(pieces("e\xcc\x81t") == V{"e", "\xcc\x81", "t"});
}

TEST_CASE("tokenizer: decode(encode(x)) == x", "[tokenizer]") {
    const Tokenizer& tok = tokenizer();
    std::vector<std::string> texts = {
        "", "plain ascii text.", "  \t\n\r\n  mixed   whitespace \n", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
        "\xc2\x85\xef\xbb\xbf odd spaces", std::string("nul\0byte", 8), "<|endoftext|>", "1,,2,,,3 \"\",\"\" ],[ ),\"",
    };
    // Every single byte-level character and a pseudo-random mix of UTF-8 fragments.
    std::string all;
    for (uint32_t c = 1; c < 0x800; c++) {
        if (c < 0x80) all += static_cast<char>(c);
        else { all += static_cast<char>(0xC0 | (c >> 6)); all += static_cast<char>(0x80 | (c & 0x3F)); }
    }
    texts.push_back(all);
    const char* frags[] = {"a", "Z", "'", "'s", " ", "  ", "\t", "\n", "9", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                           ",", "\"", ".", "\xc2\xa0", "\xe3\x80\x80", "\xcc\x81"};
    uint32_t r = 12345;
    for (int k = 0; k < 200; k++) {
        std::string s;
        int n = 1 + k % 30;
        for (int i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            s += frags[(r >> 16) % (sizeof(frags) / sizeof(frags[0]))];
        }
        texts.push_back(s);
    }
    for (const auto& t : texts) {
        INFO("text " << Catch::Detail::stringify(t));
        std::vector<int> ids = tok.encode(t);
        for (int id : ids) REQUIRE((id >= 0 && id < tok.eot()));
        CHECK(tok.decode(ids) == t);
    }
}

TEST_CASE("tokenizer: bad tokenizer files are errors naming the file", "[tokenizer]") {
    tokenizer();  // the real files must be there for the copies below
    const TempDir d("test_tokenizer");
    CHECK_THROWS_WITH(Tokenizer::load(d.path), Catch::Contains(d.path + "/encoder.json"));
    std::string enc = read_all(std::string(kTokDir) + "/encoder.json");
    std::string bpe = read_all(std::string(kTokDir) + "/vocab.bpe");
    write_all(d.path + "/encoder.json", enc);
    CHECK_THROWS_WITH(Tokenizer::load(d.path), Catch::Contains(d.path + "/vocab.bpe"));
    write_all(d.path + "/vocab.bpe", bpe + "nosuch symbol\n");
    CHECK_THROWS_WITH(Tokenizer::load(d.path), Catch::Contains(d.path + "/vocab.bpe") && Catch::Contains("line 50002"));
    write_all(d.path + "/vocab.bpe", bpe);
    write_all(d.path + "/encoder.json", enc.substr(0, enc.size() / 2));
    CHECK_THROWS_WITH(Tokenizer::load(d.path), Catch::Contains(d.path + "/encoder.json") && Catch::Contains("malformed"));
    write_all(d.path + "/encoder.json", enc);
    CHECK(Tokenizer::load(d.path).vocab_size() == 50257);
}

TEST_CASE("prepare_text: text files to train/val shards", "[tokenizer][prepare_text]") {
    const Tokenizer& tok = tokenizer();
    if (!file_exists(kPrepare)) FAIL(kPrepare << " is not built: run make first");
    const TempDir d("test_tokenizer");
    const std::string a = "In the beginning God created the heaven and the earth.\n";
    const std::string b = "And the earth was without form, and void.\n\nAnd darkness was upon the face of the deep.\n";
    const std::string c = "Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87, it's  done.\n";
    write_all(d.path + "/a.txt", a);
    write_all(d.path + "/b.txt", b);
    write_all(d.path + "/c.txt", c);
    auto doc = [&](const std::string& s) {
        std::vector<int> v{tok.eot()};
        for (int id : tok.encode(s)) v.push_back(id);
        return v;
    };
    auto shard_concat = [&](const std::string& pattern) {
        std::vector<int> all;
        for (const auto& f : glob_files(pattern))
            for (uint16_t t : read_shard_tokens(f)) all.push_back(t);
        return all;
    };
    std::string out;

    SECTION("--val FILE, small shards") {
        std::string cmd = strfmt("%s --tokenizer %s --out %s/x/data --shard-tokens 7 --val %s/c.txt %s/a.txt %s/b.txt",
                                 kPrepare, kTokDir, d.path.c_str(), d.path.c_str(), d.path.c_str(), d.path.c_str());
        INFO(cmd);
        REQUIRE(run_cmd(cmd, &out) == 0);
        INFO(out);
        std::vector<int> want_train = doc(a), db = doc(b);
        want_train.insert(want_train.end(), db.begin(), db.end());
        auto train_files = glob_files(d.path + "/x/data_train_*.bin");
        REQUIRE(train_files.size() == (want_train.size() + 6) / 7);
        CHECK(train_files[0] == d.path + "/x/data_train_000000.bin");
        for (size_t i = 0; i + 1 < train_files.size(); i++) CHECK(shard_read_header(train_files[i]) == 7);
        CHECK(shard_concat(d.path + "/x/data_train_*.bin") == want_train);
        CHECK(shard_concat(d.path + "/x/data_val_*.bin") == doc(c));
        CHECK(out.find("train") != std::string::npos);

        // A second run with bigger shards replaces the old ones: no stale shard is left.
        std::string out2;
        REQUIRE(run_cmd(strfmt("%s --tokenizer %s --out %s/x/data --val %s/c.txt %s/a.txt %s/b.txt", kPrepare, kTokDir,
                               d.path.c_str(), d.path.c_str(), d.path.c_str(), d.path.c_str()),
                        &out2) == 0);
        CHECK(glob_files(d.path + "/x/data_train_*.bin").size() == 1);
        CHECK(shard_concat(d.path + "/x/data_train_*.bin") == want_train);
    }
    SECTION("--val-frac with blank-line documents") {
        std::string cmd = strfmt("%s --tokenizer %s --out %s/p --val-frac 0.25 --doc-sep blank %s/a.txt %s/b.txt %s/c.txt",
                                 kPrepare, kTokDir, d.path.c_str(), d.path.c_str(), d.path.c_str(), d.path.c_str());
        REQUIRE(run_cmd(cmd, &out) == 0);
        INFO(out);
        // 4 documents: a, b's two paragraphs, c; the last one (25%) is val.
        std::vector<int> want;
        for (const std::string& s : {a, std::string("And the earth was without form, and void.\n"),
                                     std::string("And darkness was upon the face of the deep.\n")}) {
            auto v = doc(s);
            want.insert(want.end(), v.begin(), v.end());
        }
        CHECK(shard_concat(d.path + "/p_train_*.bin") == want);
        CHECK(shard_concat(d.path + "/p_val_*.bin") == doc(c));
    }
    SECTION("bad input: exit code 2 and a message naming the file") {
        write_all(d.path + "/bad.txt", std::string("ok\xff\xfe"));
        std::string cmd = strfmt("%s --tokenizer %s --out %s/q %s/a.txt %s/bad.txt", kPrepare, kTokDir,
                                 d.path.c_str(), d.path.c_str(), d.path.c_str());
        CHECK(run_cmd(cmd, &out) == 2);
        CHECK(out.find(d.path + "/bad.txt") != std::string::npos);
        CHECK(out.find("UTF-8") != std::string::npos);
        out.clear();
        CHECK(run_cmd(strfmt("%s --tokenizer %s --out %s/q %s/missing.txt", kPrepare, kTokDir, d.path.c_str(),
                             d.path.c_str()),
                      &out) == 2);
        CHECK(out.find(d.path + "/missing.txt") != std::string::npos);
        out.clear();
        CHECK(run_cmd(strfmt("%s --tokenizer %s/none --out %s/q %s/a.txt", kPrepare, d.path.c_str(), d.path.c_str(),
                             d.path.c_str()),
                      &out) == 2);
        CHECK(out.find(d.path + "/none/encoder.json") != std::string::npos);
        out.clear();
        CHECK(run_cmd(strfmt("%s --bogus", kPrepare), &out) == 2);
        CHECK(glob_files(d.path + "/q_*").empty());
    }
}

namespace {

// A shard's header ints and tokens, read from its bytes as the format documents them
// (llmc/data/shard.h), without the code under test. token_bytes: 2 or 4.
struct RawShard {
    int32_t magic = 0, version = 0, count = 0;
    std::vector<uint32_t> tokens;
};
RawShard read_raw_shard(const std::string& path, int token_bytes) {
    std::string b = read_all(path);
    REQUIRE(b.size() >= 1024);
    auto le = [&](size_t at, int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; k++) v |= uint32_t(static_cast<unsigned char>(b[at + k])) << (8 * k);
        return v;
    };
    RawShard s;
    s.magic = int32_t(le(0, 4));
    s.version = int32_t(le(4, 4));
    s.count = int32_t(le(8, 4));
    REQUIRE(b.size() == 1024 + size_t(s.count) * token_bytes);
    for (size_t at = 1024; at < b.size(); at += token_bytes) s.tokens.push_back(le(at, token_bytes));
    return s;
}

}  // namespace

TEST_CASE("prepare_text: a vocabulary past 65536 writes uint32 shards", "[tokenizer][prepare_text]") {
    const Tokenizer& gpt2 = tokenizer();
    if (!file_exists(kPrepare)) FAIL(kPrepare << " is not built: run make first");
    const TempDir d("test_tokenizer");
    // GPT-2's tokenizer grown to 70001 tokens: ids 50256..69999 are new symbols "<|fill_N|>" that
    // no merge makes, and <|endoftext|> moves to 70000. Text encodes as with GPT-2; only the
    // end-of-text id differs, and it needs more than 16 bits.
    std::string enc = read_all(std::string(kTokDir) + "/encoder.json");
    const std::string eot_entry = "\"<|endoftext|>\": 50256";
    size_t at = enc.find(eot_entry);
    REQUIRE(at != std::string::npos);
    std::string grown;
    for (int id = 50256; id < 70000; id++) grown += strfmt("\"<|fill_%d|>\": %d, ", id, id);
    grown += "\"<|endoftext|>\": 70000";
    enc.replace(at, eot_entry.size(), grown);
    REQUIRE(mkdir((d.path + "/tok").c_str(), 0755) == 0);
    write_all(d.path + "/tok/encoder.json", enc);
    write_all(d.path + "/tok/vocab.bpe", read_all(std::string(kTokDir) + "/vocab.bpe"));
    Tokenizer big = Tokenizer::load(d.path + "/tok");
    REQUIRE(big.vocab_size() == 70001);
    REQUIRE(big.eot() == 70000);

    const std::string a = "In the beginning God created the heaven and the earth.\n";
    const std::string b = "And the earth was without form, and void.\n";
    write_all(d.path + "/a.txt", a);
    write_all(d.path + "/b.txt", b);
    std::vector<uint32_t> want;
    for (const std::string& s : {a, b}) {
        want.push_back(70000);
        for (int id : gpt2.encode(s)) want.push_back(uint32_t(id));
    }

    std::string out;
    std::string cmd = strfmt("%s --tokenizer %s/tok --out %s/big --val-frac 0 --shard-tokens 7 %s/a.txt %s/b.txt",
                             kPrepare, d.path.c_str(), d.path.c_str(), d.path.c_str(), d.path.c_str());
    INFO(cmd);
    REQUIRE(run_cmd(cmd, &out) == 0);
    INFO(out);
    std::vector<uint32_t> got;
    auto files = glob_files(d.path + "/big_train_*.bin");
    REQUIRE(files.size() == (want.size() + 6) / 7);
    for (const auto& f : files) {
        RawShard s = read_raw_shard(f, 4);
        CHECK(s.magic == 20240801);
        CHECK(s.version == 7);
        got.insert(got.end(), s.tokens.begin(), s.tokens.end());
    }
    CHECK(got == want);

    // GPT-2's own vocabulary (50257) still gives uint16 shards, version 1
    out.clear();
    REQUIRE(run_cmd(strfmt("%s --tokenizer %s --out %s/small --val-frac 0 %s/a.txt", kPrepare, kTokDir,
                           d.path.c_str(), d.path.c_str()),
                    &out) == 0);
    RawShard s = read_raw_shard(d.path + "/small_train_000000.bin", 2);
    CHECK(s.magic == 20240520);
    CHECK(s.version == 1);
    CHECK(s.tokens.size() == 1 + gpt2.encode(a).size());
    CHECK(s.tokens[0] == 50256);
}

TEST_CASE("prepare_text: JSONL, JSON arrays and folders; every --jobs writes the same bytes", "[tokenizer][prepare_text]") {
    const Tokenizer& tok = tokenizer();
    if (!file_exists(kPrepare)) FAIL(kPrepare << " is not built: run make first");
    const TempDir d("test_tokenizer");
    auto doc = [&](const std::string& s) {
        std::vector<int> v{tok.eot()};
        for (int id : tok.encode(s)) v.push_back(id);
        return v;
    };
    auto cat = [](std::vector<int> a, const std::vector<int>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };
    auto shard_concat = [&](const std::string& pattern) {
        std::vector<int> all;
        for (const auto& f : glob_files(pattern))
            for (uint16_t t : read_shard_tokens(f)) all.push_back(t);
        return all;
    };
    auto run = [&](const std::string& args, std::string* out) {
        out->clear();
        const std::string cmd = strfmt("%s --tokenizer %s --quiet %s", kPrepare, kTokDir, args.c_str());
        INFO(cmd);
        return run_cmd(cmd, out);
    };
    std::string out;
    REQUIRE(mkdir((d.path + "/corpus").c_str(), 0755) == 0);
    REQUIRE(mkdir((d.path + "/corpus/sub").c_str(), 0755) == 0);

    SECTION("a folder of JSONL and text files, in path order; --field; JSON escapes decoded") {
        // records: text with a JSON escape (\u00e9 = é, \n), a blank line, an empty text (no
        // document), a record with other fields too
        write_all(d.path + "/corpus/a.jsonl",
                  "{\"text\": \"Caf\\u00e9 au lait.\\nSecond line.\", \"id\": 1}\n\n{\"text\": \"\"}\n"
                  "{\"id\": 3, \"text\": \"It's  done.\", \"meta\": {\"x\": [1, 2]}}\n");
        write_all(d.path + "/corpus/sub/c.txt", "Plain text in a sub-folder.\n");
        write_all(d.path + "/corpus/.hidden.txt", "not read\n");
        write_all(d.path + "/corpus/notes.md", "not read either\n");
        REQUIRE(run("--out " + d.path + "/f --val-frac 0 " + d.path + "/corpus", &out) == 0);
        INFO(out);
        const std::vector<int> want =
            cat(cat(doc("Caf\xc3\xa9 au lait.\nSecond line."), doc("It's  done.")), doc("Plain text in a sub-folder.\n"));
        CHECK(shard_concat(d.path + "/f_train_*.bin") == want);
        CHECK(glob_files(d.path + "/f_val_*.bin").empty());

        // another field, and TinyStories' layout: a .json file holding an array of records
        write_all(d.path + "/stories.json", "[{\"story\": \"Once upon a time.\"}, {\"story\": \"The end.\", \"n\": 2}]");
        write_all(d.path + "/s.jsonl", "{\"story\": \"A line.\"}\n");
        REQUIRE(run("--out " + d.path + "/s --field story --val " + d.path + "/s.jsonl " + d.path + "/stories.json",
                    &out) == 0);
        CHECK(shard_concat(d.path + "/s_train_*.bin") == cat(doc("Once upon a time."), doc("The end.")));
        CHECK(shard_concat(d.path + "/s_val_*.bin") == doc("A line."));
        // --format jsonl reads a file of another name as JSON lines
        write_all(d.path + "/lines.data", "{\"text\": \"x y\"}\n");
        REQUIRE(run("--out " + d.path + "/l --val-frac 0 --format jsonl " + d.path + "/lines.data", &out) == 0);
        CHECK(shard_concat(d.path + "/l_train_*.bin") == doc("x y"));
    }
    SECTION("1, 2 and 3 jobs give byte-identical shards") {
        // 400 documents of varied lengths over 3 files, 97-token shards: many shards, val by fraction
        std::string first_text;
        for (int f = 0; f < 3; f++) {
            std::string lines;
            for (int i = 0; i < 400 / 3 + 1; i++) {
                nlohmann::json rec = {{"text", strfmt("Record %d.%d: the quick brown fox %s jumps over %d lazy dogs. "
                                                      "Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 %s\n",
                                                      f, i, std::string(size_t(i % 13), 'z').c_str(), i * 7919 % 1000,
                                                      std::string(size_t(i % 5) * 20, 'a' + char(i % 26)).c_str())}};
                lines += rec.dump() + "\n";
                if (f == 0 && i == 0) first_text = rec["text"];
            }
            write_all(d.path + strfmt("/corpus/part_%d.jsonl", f), lines);
        }
        std::vector<std::string> files1;
        for (int jobs : {1, 2, 3}) {
            const std::string prefix = d.path + strfmt("/j%d", jobs);
            REQUIRE(run(strfmt("--out %s --jobs %d --shard-tokens 97 --val-frac 0.05 %s/corpus", prefix.c_str(), jobs,
                               d.path.c_str()),
                        &out) == 0);
            std::vector<std::string> files = glob_files(prefix + "_*.bin");
            REQUIRE(files.size() > 20);
            if (jobs == 1) {
                files1 = files;
                continue;
            }
            REQUIRE(files.size() == files1.size());
            for (size_t i = 0; i < files.size(); i++) {
                INFO(files[i] << " vs " << files1[i]);
                CHECK(read_all(files[i]) == read_all(files1[i]));
            }
        }
        // and the tokens start with the first record
        const std::vector<int> train = shard_concat(d.path + "/j1_train_*.bin");
        const std::vector<int> first = doc(first_text);
        REQUIRE(train.size() > first.size());
        CHECK(std::vector<int>(train.begin(), train.begin() + long(first.size())) == first);
    }
    SECTION("bad JSON input: exit code 2 naming the file and line") {
        write_all(d.path + "/corpus/a.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n");
        CHECK(run("--out " + d.path + "/q " + d.path + "/corpus/a.jsonl", &out) == 2);
        CHECK_THAT(out, Catch::Contains(d.path + "/corpus/a.jsonl:2") && Catch::Contains("--field"));
        write_all(d.path + "/corpus/a.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"cut\n");
        CHECK(run("--out " + d.path + "/q " + d.path + "/corpus/a.jsonl", &out) == 2);
        CHECK_THAT(out, Catch::Contains(d.path + "/corpus/a.jsonl:2") && Catch::Contains("JSON"));
        write_all(d.path + "/corpus/a.jsonl", "{\"text\": 5}\n");
        CHECK(run("--out " + d.path + "/q " + d.path + "/corpus/a.jsonl", &out) == 2);
        CHECK_THAT(out, Catch::Contains("a.jsonl:1") && Catch::Contains("not a string"));
        CHECK(run("--out " + d.path + "/q " + d.path + "/corpus/sub", &out) == 2);
        CHECK_THAT(out, Catch::Contains(d.path + "/corpus/sub") && Catch::Contains("folder"));
        CHECK(run("--out " + d.path + "/q --jobs 0 " + d.path + "/corpus", &out) == 2);
        CHECK_THAT(out, Catch::Contains("--jobs"));
        CHECK(glob_files(d.path + "/q_*").empty());
    }
}
