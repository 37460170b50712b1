// Hugging Face safetensors, read and written without Python. The format: an 8-byte little-endian
// header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end)}, ...,
// "__metadata__": {string: string}}, then the raw little-endian tensor bytes (offsets are
// relative to the end of the header). We read F32, BF16 and F16 as float and write F32.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

class PieceFile;

struct SafetensorsEntry {
    std::string dtype;           // "F32", "BF16", "F16", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // bytes, relative to the data section
};

class SafetensorsReader {
public:
    // Reads and validates the header; throws UserError naming the file on any inconsistency.
    explicit SafetensorsReader(const std::string& path);
    const std::string& path() const { return path_; }
    bool has(const std::string& name) const { return entries_.count(name) != 0; }
    const SafetensorsEntry& entry(const std::string& name) const;  // throws UserError naming it
    const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // The tensor as float (F32, BF16 or F16); throws UserError naming the tensor otherwise.
    std::vector<float> read(const std::string& name) const;
    // Elements [first, first + n) of the tensor, flat in its row-major order, as float into out:
    // read where they lie (a rank's part of a model; one column of a transposed matrix).
    void read_range(const std::string& name, size_t first, size_t n, float* out) const;

private:
    std::string path_;
    std::shared_ptr<PieceFile> file_;  // the file, open for read_range (closed with the last copy)
    uint64_t data_start_ = 0;
    std::map<std::string, SafetensorsEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

// Writes F32 tensors, atomically (temp file, fsync, rename): the header from the names and shapes
// first, then each tensor as its fill writes it into a buffer of its size, one tensor at a time
// (a model's weights are never held twice for it).
class SafetensorsWriter {
public:
    using Fill = std::function<void(float* out)>;  // the tensor's elements, row-major
    void add(const std::string& name, std::vector<int64_t> shape, Fill fill);
    // the same from data in memory, copied now
    void add(const std::string& name, std::vector<int64_t> shape, const float* data);
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
    void write(const std::string& path) const;  // throws UserError naming the file

private:
    struct T {
        std::string name;
        std::vector<int64_t> shape;
        size_t n;
        Fill fill;
    };
    std::vector<T> tensors_;
    std::map<std::string, std::string> metadata_;
};
