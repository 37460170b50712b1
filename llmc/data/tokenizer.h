// GPT-2's byte-level BPE tokenizer, loaded from the standard `encoder.json` + `vocab.bpe`.
//
// encode() reproduces GPT-2's reference encoder exactly: the text is split with GPT-2's
// pre-tokenization pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Unicode letters/numbers/White_Space from llmc/data/tokenizer_unicode.inc), each piece's UTF-8
// bytes are mapped through GPT-2's byte->unicode table and merged by BPE rank.
// The text "<|endoftext|>" in the input is encoded as ordinary text, as GPT-2's encoder does;
// the end-of-text id is only ever inserted by the caller (eot()).
//
// Decoding returns raw bytes: a sequence of ids that splits a multi-byte character
// (e.g. a single sampled token) yields incomplete UTF-8, exactly as the bytes are.
// An id outside [0, vocab_size()) is a UserError ("token id N out of range").
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

class Tokenizer {
public:
    // Loads DIR/encoder.json and DIR/vocab.bpe. Throws UserError naming the file when one is
    // missing, unreadable or malformed (bad JSON, unknown symbols, merges outside the vocabulary).
    static Tokenizer load(const std::string& dir);

    // Token ids of UTF-8 text. Throws UserError("...invalid UTF-8 at byte N...") on bad input.
    // Thread-safe (the cache of merged words is per thread).
    std::vector<int> encode(const std::string& utf8) const;
    // Bytes of a sequence of ids (see above for partial characters and invalid ids).
    std::string decode(const std::vector<int>& ids) const;
    std::string decode_token(int id) const;

    int eot() const { return eot_; }  // id of <|endoftext|>: 50256 for GPT-2
    int vocab_size() const { return static_cast<int>(token_bytes_.size()); }

private:
    Tokenizer() = default;
    void bpe(const std::string& piece, std::vector<int>& out) const;

    std::vector<std::string> token_bytes_;  // id -> raw bytes
    int byte_token_[256] = {};              // byte -> id of its single-byte token
    // (left id << 32 | right id) -> (merge rank << 32 | merged id)
    std::unordered_map<uint64_t, uint64_t> merges_;
    int eot_ = -1;
    uint64_t uid_ = 0;  // tells loaded vocabularies apart (encode's per-thread cache)
};

// Pre-tokenization alone: the [begin, end) byte ranges of GPT-2's regex matches in UTF-8 text.
// Exposed for tests. Throws UserError on invalid UTF-8.
std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(const std::string& utf8);
