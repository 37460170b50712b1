#include "llmc/io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/io/piece_file.h"
#include "llmc/precision/bf16.h"
#include "llmc/precision/fp16.h"

namespace {

size_t dtype_bytes(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
    return 0;
}

// Up to `most` bytes of s around byte `at`, printable ASCII as is and every other byte as \xNN:
// a header of invalid UTF-8 (or binary) is shown, never echoed raw to the terminal.
std::string escaped_excerpt(const std::string& s, size_t at, size_t most = 48) {
    const size_t begin = at > most / 2 ? at - most / 2 : 0, end = std::min(s.size(), begin + most);
    std::string out = begin > 0 ? "..." : "";
    for (size_t i = begin; i < end; i++) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        out += c >= 0x20 && c < 0x7f && c != '\\' ? std::string(1, char(c)) : strfmt("\\x%02x", c);
    }
    return out + (end < s.size() ? "..." : "");
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
    const char* p = path.c_str();
    file_ = std::make_shared<PieceFile>(path, "safetensors file", std::make_shared<size_t>(0));
    struct stat st;
    if (stat(p, &st) != 0) throw UserError(strfmt("safetensors file %s: cannot open: %s", p, std::strerror(errno)));
    const uint64_t size = uint64_t(st.st_size);
    uint8_t lenb[8];
    if (size < 8)
        throw UserError(strfmt("safetensors file %s: truncated (%llu bytes; the format starts with an 8-byte header "
                               "length)", p, (unsigned long long)size));
    file_->read_bytes(0, lenb, 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n > size - 8 || n > (uint64_t(100) << 20))
        throw UserError(strfmt("safetensors file %s: header length %llu does not fit the file's %llu bytes (not a "
                               "safetensors file?)", p, (unsigned long long)n, (unsigned long long)size));
    std::string header(n, '\0');
    file_->read_bytes(8, &header[0], n);
    data_start_ = 8 + n;
    // nlohmann keeps the last of two equal keys silently: a tensor named twice is refused
    std::vector<std::set<std::string>> seen;  // the keys of each open object
    std::string dup;
    const nlohmann::json::parser_callback_t check_dup = [&](int, nlohmann::json::parse_event_t ev,
                                                            nlohmann::json& parsed) {
        if (ev == nlohmann::json::parse_event_t::object_start) seen.emplace_back();
        else if (ev == nlohmann::json::parse_event_t::object_end) seen.pop_back();
        else if (ev == nlohmann::json::parse_event_t::key && !seen.back().insert(parsed.get<std::string>()).second &&
                 dup.empty())
            dup = parsed.get<std::string>();
        return true;
    };
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(header, check_dup);
    } catch (const nlohmann::json::parse_error& e) {
        // nlohmann's message quotes the bytes it read: invalid UTF-8 would reach the terminal raw
        throw UserError(strfmt("safetensors file %s: the header is not valid JSON (byte %zu of the header: %s)", p,
                               e.byte, escaped_excerpt(header, e.byte > 0 ? e.byte - 1 : 0).c_str()));
    } catch (const nlohmann::json::exception& e) {
        throw UserError(strfmt("safetensors file %s: the header is not valid JSON: %s", p, e.what()));
    }
    if (!dup.empty())
        throw UserError(strfmt("safetensors file %s: the header names \"%s\" twice (the readers would keep only one)",
                               p, escaped_excerpt(dup, 0, 200).c_str()));
    if (!j.is_object()) throw UserError(strfmt("safetensors file %s: the header is not a JSON object", p));
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string& name = it.key();
        const auto& v = it.value();
        if (name == "__metadata__") {
            if (!v.is_object()) throw UserError(strfmt("safetensors file %s: __metadata__ is not an object", p));
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    throw UserError(strfmt("safetensors file %s: __metadata__.%s is not a string", p, m.key().c_str()));
                metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        SafetensorsEntry e;
        try {
            e.dtype = v.at("dtype").get<std::string>();
            // integers only: nlohmann would convert a float such as 1e127 to an integer (undefined)
            const auto ints = [](const nlohmann::json& a) {
                std::vector<uint64_t> out;
                for (const nlohmann::json& x : a) {
                    if (!x.is_number_unsigned()) throw UserError("");
                    out.push_back(x.get<uint64_t>());
                }
                return out;
            };
            for (uint64_t d : ints(v.at("shape"))) {
                if (d > uint64_t(INT64_MAX)) throw UserError("");
                e.shape.push_back(int64_t(d));
            }
            auto off = ints(v.at("data_offsets"));
            if (off.size() != 2) throw UserError("");
            e.begin = off[0];
            e.end = off[1];
        } catch (const std::exception&) {
            throw UserError(strfmt("safetensors file %s: tensor %s: needs \"dtype\" (string), \"shape\" (integers) "
                                   "and \"data_offsets\" ([begin, end])", p, name.c_str()));
        }
        uint64_t count = 1;
        for (int64_t d : e.shape) {
            if (d > 0 && count > (uint64_t(1) << 40) / uint64_t(d))  // 2^40 elements: no wrap in count * bytes
                throw UserError(strfmt("safetensors file %s: tensor %s: shape too large", p, name.c_str()));
            count *= uint64_t(d);
        }
        const size_t b = dtype_bytes(e.dtype);
        if (b == 0)
            throw UserError(strfmt("safetensors file %s: tensor %s: unknown dtype \"%s\"", p, name.c_str(), e.dtype.c_str()));
        if (e.end < e.begin || e.end - e.begin != count * b || data_start_ + e.end > size)
            throw UserError(strfmt("safetensors file %s: tensor %s: data_offsets [%llu, %llu) do not hold %llu %s "
                                   "elements inside the file (truncated?)", p, name.c_str(), (unsigned long long)e.begin,
                                   (unsigned long long)e.end, (unsigned long long)count, e.dtype.c_str()));
        entries_[name] = e;
    }
    // two tensors over the same bytes: a writer's bug or a crafted file; either way one of them is
    // not what its name says (empty tensors hold no bytes and overlap nothing)
    std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_begin;
    for (const auto& kv : entries_)
        if (kv.second.end > kv.second.begin) by_begin.push_back({&kv.first, &kv.second});
    std::sort(by_begin.begin(), by_begin.end(), [](const auto& a, const auto& b) {
        return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : *a.first < *b.first;
    });
    for (size_t i = 1; i < by_begin.size(); i++) {
        const SafetensorsEntry &a = *by_begin[i - 1].second, &b = *by_begin[i].second;
        if (b.begin < a.end)
            throw UserError(strfmt("safetensors file %s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap in the "
                                   "data section (data_offsets)",
                                   p, by_begin[i - 1].first->c_str(), (unsigned long long)a.begin,
                                   (unsigned long long)a.end, by_begin[i].first->c_str(), (unsigned long long)b.begin,
                                   (unsigned long long)b.end));
    }
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end())
        throw UserError(strfmt("safetensors file %s: has no tensor %s", path_.c_str(), name.c_str()));
    return it->second;
}

std::vector<float> SafetensorsReader::read(const std::string& name) const {
    const SafetensorsEntry& e = entry(name);
    std::vector<float> out(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16"
                               ? size_t(e.end - e.begin) / dtype_bytes(e.dtype) : 0);
    read_range(name, 0, out.size(), out.data());
    return out;
}

void SafetensorsReader::read_range(const std::string& name, size_t first, size_t n, float* out) const {
    const SafetensorsEntry& e = entry(name);
    if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
        throw UserError(strfmt("safetensors file %s: tensor %s is %s; F32, BF16 or F16 expected", path_.c_str(),
                               name.c_str(), e.dtype.c_str()));
    const size_t b = dtype_bytes(e.dtype), count = (e.end - e.begin) / b;
    LLMC_ASSERT(first <= count && n <= count - first, "safetensors read_range: past the tensor's end");
    // in pieces of up to 1 MB of the file's bytes (a 16-bit tensor widened through them)
    constexpr size_t piece = size_t(1) << 20;
    std::vector<uint8_t> raw(b == 4 ? 0 : std::min(n * b, piece));
    for (size_t done = 0; done < n;) {
        const size_t k = b == 4 ? n : std::min(n - done, piece / b);
        uint8_t* dst = b == 4 ? reinterpret_cast<uint8_t*>(out) : raw.data();
        try {
            file_->read_bytes(data_start_ + e.begin + (first + done) * b, dst, k * b);
        } catch (const UserError& err) {  // (the file changed after it was opened) the tensor named too
            throw UserError(strfmt("%s (reading tensor %s)", err.what(), name.c_str()));
        }
        if (b != 4)
            for (size_t i = 0; i < k; i++) {
                const uint16_t h = uint16_t(raw[2 * i] | (raw[2 * i + 1] << 8));
                out[done + i] = e.dtype == "BF16" ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
            }
        done += k;
    }
}

void SafetensorsWriter::add(const std::string& name, std::vector<int64_t> shape, Fill fill) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    tensors_.push_back({name, std::move(shape), n, std::move(fill)});
}

void SafetensorsWriter::add(const std::string& name, std::vector<int64_t> shape, const float* data) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    auto copy = std::make_shared<const std::vector<float>>(data, data + n);
    add(name, std::move(shape), [copy](float* out) { std::copy(copy->begin(), copy->end(), out); });
}

void SafetensorsWriter::write(const std::string& path) const {
    nlohmann::json h = nlohmann::json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    uint64_t off = 0;
    for (const T& t : tensors_) {
        const uint64_t bytes = t.n * 4;
        h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
        off += bytes;
    }
    std::string hs = h.dump();
    hs.append((8 - hs.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
    AtomicFile f(path);
    f.write(lenb, 8);
    f.write(hs.data(), hs.size());
    std::vector<float> buf;
    for (const T& t : tensors_) {
        buf.resize(t.n);
        t.fill(buf.data());
        f.write(buf.data(), t.n * 4);
    }
    f.commit();
}
