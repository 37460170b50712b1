// UTF-8 decoding shared by the tokenizer, the config reader and the data tools.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

inline void append_utf8(std::string& s, uint32_t c) {
    if (c < 0x80) {
        s += static_cast<char>(c);
    } else if (c < 0x800) {
        s += static_cast<char>(0xC0 | (c >> 6));
        s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        s += static_cast<char>(0xE0 | (c >> 12));
        s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (c >> 18));
        s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (c & 0x3F));
    }
}

// Decodes one code point at s[i]; returns its length in bytes, or 0 if the bytes there are not
// well-formed UTF-8 (truncated, overlong, surrogate, beyond U+10FFFF).
inline size_t next_utf8(const std::string& s, size_t i, uint32_t& cp) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
    size_t avail = s.size() - i;
    unsigned char b = p[0];
    if (b < 0x80) { cp = b; return 1; }
    size_t len;
    uint32_t c, min;
    if ((b & 0xE0) == 0xC0) { len = 2; c = b & 0x1F; min = 0x80; }
    else if ((b & 0xF0) == 0xE0) { len = 3; c = b & 0x0F; min = 0x800; }
    else if ((b & 0xF8) == 0xF0) { len = 4; c = b & 0x07; min = 0x10000; }
    else return 0;
    if (avail < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (p[k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    cp = c;
    return len;
}

// Byte offset of the first ill-formed UTF-8 sequence in s (truncated, overlong, surrogate,
// beyond U+10FFFF), or std::string::npos when s is valid UTF-8.
inline size_t utf8_invalid_at(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        uint32_t c;
        size_t len = next_utf8(s, i, c);
        if (len == 0) return i;
        i += len;
    }
    return std::string::npos;
}
