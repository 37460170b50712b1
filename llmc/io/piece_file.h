// Reading a file in pieces, where each lies: what a rank reads of a checkpoint or a model file
// when it takes only the part of the model it holds.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/model/param_table.h"
#include "llmc/precision/bf16.h"

// A file read where each piece lies (pread), each piece as asked (pick_file_order joins pieces
// close together): a checkpoint's files, a model file. Every byte read is counted in *counter. A
// read that fails or comes short is a UserError "<what> <path>: ...".
class PieceFile {
public:
    PieceFile(const std::string& path, const char* what, std::shared_ptr<size_t> counter)
        : path_(path), what_(what), counter_(std::move(counter)) {
        fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) throw UserError(strfmt("%s %s: cannot open: %s", what, path.c_str(), std::strerror(errno)));
    }
    ~PieceFile() { ::close(fd_); }
    PieceFile(const PieceFile&) = delete;
    PieceFile& operator=(const PieceFile&) = delete;

    // n elements at byte offset at into out: fp32 (elem 4) or bf16 (elem 2, widened through
    // bf16_ of up to 512 KB: a span of pick_file_order in a few reads, not hundreds)
    void read(uint64_t at, size_t n, size_t elem, float* out) {
        if (elem == 4) return read_bytes(at, out, n * sizeof(float));
        bf16_.resize(std::min(n, size_t(1) << 18));
        for (size_t i = 0; i < n; i += bf16_.size()) {
            const size_t k = std::min(bf16_.size(), n - i);
            read_bytes(at + i * 2, bf16_.data(), k * 2);
            for (size_t j = 0; j < k; j++) out[i + j] = bf16_bits_to_f32(bf16_[j]);
        }
    }
    void read_bytes(uint64_t at, void* dst, size_t bytes) {
        char* d = static_cast<char*>(dst);
        while (bytes > 0) {
            const ssize_t r = ::pread(fd_, d, bytes, off_t(at));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0)
                throw UserError(strfmt("%s %s: cannot read: %s", what_, path_.c_str(), std::strerror(errno)));
            if (r == 0) throw UserError(strfmt("%s %s: truncated", what_, path_.c_str()));
            *counter_ += size_t(r);
            d += r, at += uint64_t(r), bytes -= size_t(r);
        }
    }

private:
    std::string path_;
    const char* what_;
    std::shared_ptr<size_t> counter_;
    int fd_ = -1;
    std::vector<uint16_t> bf16_;
};

// An array of n elements (fp32, elem 4; bf16, elem 2) at byte offset base of f, handed out in
// pieces as fp32 (a checkpoint's arrays, a model file's weights).
inline ReadFileOrder piece_array(std::shared_ptr<PieceFile> f, uint64_t base, size_t n, size_t elem) {
    return [f, base, n, elem](size_t first, size_t k, float* out) {
        LLMC_ASSERT(first <= n && k <= n - first, "a read past the end of an array in a file");
        f->read(base + first * elem, k, elem, out);
    };
}
