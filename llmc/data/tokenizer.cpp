#include "llmc/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "llmc/core/common.h"
#include "llmc/core/utf8.h"

namespace {

#include "llmc/data/tokenizer_unicode.inc"

// ---------------------------------------------------------------- character classes

enum CharClass : unsigned char { kLetter, kNumber, kSpace, kOther };

template <size_t N>
bool in_ranges(const uint32_t (&r)[N][2], uint32_t c) {
    size_t lo = 0, hi = N;  // first range whose upper end >= c
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid][1] < c) lo = mid + 1; else hi = mid;
    }
    return lo < N && r[lo][0] <= c;
}

CharClass char_class(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return kLetter;
        if (c >= '0' && c <= '9') return kNumber;
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return kSpace;
        return kOther;
    }
    if (in_ranges(kUnicodeLetter, c)) return kLetter;
    if (in_ranges(kUnicodeNumber, c)) return kNumber;
    if (in_ranges(kUnicodeSpace, c)) return kSpace;
    return kOther;
}

// ---------------------------------------------------------------- GPT-2 byte <-> unicode

// GPT-2 maps every byte to a printable code point: the printable Latin-1 bytes
// ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) to themselves, the other 68 bytes, in increasing order,
// to 256, 257, ...
void byte_unicode_table(uint32_t (&to_cp)[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
    }
}

// ---------------------------------------------------------------- files

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UserError(strfmt("tokenizer file %s: cannot open: %s", path.c_str(), std::strerror(errno)));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw UserError(strfmt("tokenizer file %s: read error", path.c_str()));
    return ss.str();
}

// A flat JSON object of string keys and non-negative integer values, as encoder.json is.
class VocabJsonParser {
public:
    VocabJsonParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

    std::vector<std::pair<std::string, long>> parse() {
        std::vector<std::pair<std::string, long>> out;
        ws();
        expect('{');
        ws();
        if (peek() == '}') { i_++; }
        else {
            for (;;) {
                ws();
                std::string key = str();
                ws();
                expect(':');
                ws();
                long v = integer();
                out.emplace_back(std::move(key), v);
                ws();
                char c = get();
                if (c == '}') break;
                if (c != ',') fail("expected ',' or '}'");
            }
        }
        ws();
        if (i_ != s_.size()) fail("unexpected data after the JSON object");
        return out;
    }

private:
    [[noreturn]] void fail(const char* what) {
        throw UserError(strfmt("tokenizer file %s: malformed JSON at byte %zu: %s", path_.c_str(), i_, what));
    }
    char peek() { return i_ < s_.size() ? s_[i_] : '\0'; }
    char get() {
        if (i_ >= s_.size()) fail("unexpected end of file");
        return s_[i_++];
    }
    void expect(char c) {
        if (get() != c) { i_--; fail(strfmt("expected '%c'", c).c_str()); }
    }
    void ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) i_++;
    }
    uint32_t hex4() {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            char c = get();
            v <<= 4;
            if (c >= '0' && c <= '9') v |= c - '0';
            else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
            else fail("bad \\u escape");
        }
        return v;
    }
    std::string str() {
        expect('"');
        std::string out;
        for (;;) {
            char c = get();
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
            if (c != '\\') { out += c; continue; }
            char e = get();
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (get() != '\\' || get() != 'u') fail("unpaired surrogate escape");
                        uint32_t lo = hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate escape");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("unpaired surrogate escape");
                    }
                    append_utf8(out, cp);
                    break;
                }
                default: fail("bad escape");
            }
        }
    }
    long integer() {
        size_t start = i_;
        long v = 0;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            v = v * 10 + (s_[i_++] - '0');
            if (v > 0x7fffffff) fail("token id too large");
        }
        if (i_ == start) fail("expected a non-negative integer token id");
        return v;
    }

    const std::string& path_;
    const std::string& s_;
    size_t i_ = 0;
};

}  // namespace

// ---------------------------------------------------------------- pre-tokenization

namespace {

// Calls piece(begin, end) for each match of GPT-2's pattern in s, in order (byte offsets).
// s must be valid UTF-8.
template <class F>
void for_each_piece(const std::string& s, F&& piece) {
    const size_t n = s.size();
    auto class_at = [&](size_t p, size_t& len) {
        uint32_t c = 0;  // s is valid UTF-8 (checked before): next_utf8 always sets it
        len = next_utf8(s, p, c);
        return char_class(c);
    };
    size_t i = 0, len;
    while (i < n) {
        // 's|'t|'re|'ve|'m|'ll|'d  (ASCII, case-sensitive)
        if (s[i] == '\'' && i + 1 < n) {
            char a = s[i + 1];
            size_t m = 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd') m = 2;
            else if (i + 2 < n && ((a == 'r' && s[i + 2] == 'e') || (a == 'v' && s[i + 2] == 'e') || (a == 'l' && s[i + 2] == 'l'))) m = 3;
            if (m) {
                piece(i, i + m);
                i += m;
                continue;
            }
        }
        //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+   (the optional prefix is an ASCII space only)
        size_t k = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
        CharClass c = class_at(k, len);
        size_t e = k + len;
        if (c != kSpace) {
            while (e < n && class_at(e, len) == c) e += len;
            piece(i, e);
            i = e;
            continue;
        }
        // \s+(?!\S) | \s+ : a whitespace run from i; when a non-space follows it, its last
        // whitespace character is left to start the next piece (unless it is the only one).
        size_t last = i;
        for (e = i; e < n && class_at(e, len) == kSpace; e += len) last = e;
        if (e < n && last > i) e = last;
        piece(i, e);
        i = e;
    }
}

void check_utf8(const std::string& s) {
    size_t bad = utf8_invalid_at(s);
    if (bad != std::string::npos) throw UserError(strfmt("invalid UTF-8 at byte %zu", bad));
}

}  // namespace

std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(const std::string& s) {
    check_utf8(s);
    std::vector<std::pair<size_t, size_t>> out;
    for_each_piece(s, [&](size_t b, size_t e) { out.emplace_back(b, e); });
    return out;
}

// ---------------------------------------------------------------- Tokenizer

Tokenizer Tokenizer::load(const std::string& dir) {
    const std::string enc_path = dir + "/encoder.json";
    const std::string bpe_path = dir + "/vocab.bpe";
    Tokenizer t;
    static std::atomic<uint64_t> next_uid{1};
    t.uid_ = next_uid++;

    uint32_t to_cp[256];
    byte_unicode_table(to_cp);
    std::unordered_map<uint32_t, int> from_cp;  // mapped code point -> byte
    for (int b = 0; b < 256; b++) from_cp[to_cp[b]] = b;

    // encoder.json: symbol string -> id. Symbols are written in GPT-2's byte->unicode alphabet.
    std::string enc_text = read_file(enc_path);
    auto entries = VocabJsonParser(enc_path, enc_text).parse();
    if (entries.empty()) throw UserError(strfmt("tokenizer file %s: empty vocabulary", enc_path.c_str()));
    std::unordered_map<std::string, int> sym_to_id;
    t.token_bytes_.assign(entries.size(), std::string());
    std::vector<bool> seen(entries.size(), false);
    for (auto& [sym, id] : entries) {
        if (id >= static_cast<long>(entries.size()) || seen[id])
            throw UserError(strfmt("tokenizer file %s: token ids are not 0..%zu each used once (id %ld)",
                                   enc_path.c_str(), entries.size() - 1, id));
        seen[id] = true;
        std::string bytes;
        for (size_t i = 0; i < sym.size();) {
            uint32_t c;
            size_t len = next_utf8(sym, i, c);
            auto it = len ? from_cp.find(c) : from_cp.end();
            if (it == from_cp.end())
                throw UserError(strfmt("tokenizer file %s: token %ld has a character outside GPT-2's byte alphabet",
                                       enc_path.c_str(), id));
            bytes += static_cast<char>(it->second);
            i += len;
        }
        if (!sym_to_id.emplace(sym, static_cast<int>(id)).second)
            throw UserError(strfmt("tokenizer file %s: duplicate token string (id %ld)", enc_path.c_str(), id));
        t.token_bytes_[id] = std::move(bytes);
    }
    for (int b = 0; b < 256; b++) {
        std::string sym;
        append_utf8(sym, to_cp[b]);
        auto it = sym_to_id.find(sym);
        if (it == sym_to_id.end())
            throw UserError(strfmt("tokenizer file %s: no token for byte 0x%02X", enc_path.c_str(), b));
        t.byte_token_[b] = it->second;
    }
    auto eot_it = sym_to_id.find("<|endoftext|>");
    if (eot_it == sym_to_id.end())
        throw UserError(strfmt("tokenizer file %s: no <|endoftext|> token", enc_path.c_str()));
    t.eot_ = eot_it->second;

    // vocab.bpe: "#version: ..." then one merge "LEFT RIGHT" per line, highest priority first.
    std::string bpe_text = read_file(bpe_path);
    size_t pos = 0, line_no = 0;
    uint32_t rank = 0;
    while (pos < bpe_text.size()) {
        size_t nl = bpe_text.find('\n', pos);
        if (nl == std::string::npos) nl = bpe_text.size();
        std::string line = bpe_text.substr(pos, nl - pos);
        pos = nl + 1;
        line_no++;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
        size_t sp = line.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
            throw UserError(strfmt("tokenizer file %s: line %zu is not a merge 'LEFT RIGHT'", bpe_path.c_str(), line_no));
        std::string left = line.substr(0, sp), right = line.substr(sp + 1);
        auto l = sym_to_id.find(left), r = sym_to_id.find(right), m = sym_to_id.find(left + right);
        if (l == sym_to_id.end() || r == sym_to_id.end() || m == sym_to_id.end())
            throw UserError(strfmt("tokenizer file %s: line %zu merges symbols missing from encoder.json",
                                   bpe_path.c_str(), line_no));
        uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
        uint64_t val = (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(m->second);
        t.merges_.emplace(key, val);  // a repeated pair keeps its first (best) rank, as GPT-2 does
        rank++;
    }
    if (rank == 0) throw UserError(strfmt("tokenizer file %s: no merges", bpe_path.c_str()));
    return t;
}

void Tokenizer::bpe(const std::string& piece, std::vector<int>& out) const {
    std::vector<int> word;
    word.reserve(piece.size());
    for (unsigned char b : piece) word.push_back(byte_token_[b]);
    std::vector<int> next;
    while (word.size() > 1) {
        // The adjacent pair with the lowest merge rank...
        uint64_t best = UINT64_MAX;
        for (size_t i = 0; i + 1 < word.size(); i++) {
            uint64_t key = (static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]);
            auto it = merges_.find(key);
            if (it != merges_.end() && it->second < best) best = it->second;
        }
        if (best == UINT64_MAX) break;
        // ...is merged everywhere it occurs, left to right, without overlaps.
        int merged = static_cast<int>(best & 0xffffffffu);
        next.clear();
        for (size_t i = 0; i < word.size();) {
            if (i + 1 < word.size()) {
                uint64_t key = (static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]);
                auto it = merges_.find(key);
                if (it != merges_.end() && it->second == best) {
                    next.push_back(merged);
                    i += 2;
                    continue;
                }
            }
            next.push_back(word[i]);
            i++;
        }
        word.swap(next);
    }
    out.insert(out.end(), word.begin(), word.end());
}

std::vector<int> Tokenizer::encode(const std::string& utf8) const {
    check_utf8(utf8);
    std::vector<int> ids;
    ids.reserve(utf8.size() / 3 + 1);
    // Repeated words are merged once: a per-thread cache, kept across calls, of this
    // vocabulary's pieces (uid_ tells loaded vocabularies apart).
    struct Cache {
        uint64_t uid = 0;
        std::unordered_map<std::string, std::vector<int>> map;
    };
    static thread_local Cache tl_cache;
    if (tl_cache.uid != uid_) {
        tl_cache.map.clear();
        tl_cache.uid = uid_;
    }
    auto& cache = tl_cache.map;
    std::vector<int> tmp;
    std::string piece;
    for_each_piece(utf8, [&](size_t b, size_t e) {
        piece.assign(utf8, b, e - b);
        auto it = cache.find(piece);
        if (it == cache.end()) {
            tmp.clear();
            bpe(piece, tmp);
            if (cache.size() >= (1u << 18)) cache.clear();
            it = cache.emplace(piece, tmp).first;
        }
        ids.insert(ids.end(), it->second.begin(), it->second.end());
    });
    return ids;
}

std::string Tokenizer::decode_token(int id) const {
    if (id < 0 || id >= vocab_size())
        throw UserError(strfmt("tokenizer: token id %d out of range [0, %d)", id, vocab_size()));
    return token_bytes_[id];
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += decode_token(id);
    return out;
}
