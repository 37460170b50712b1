// Tensor: a typed view into memory owned elsewhere (one allocation per category).
// The pointer is a host pointer on the CPU backend and a device pointer on CUDA.
#pragma once
#include <cstddef>
#include <cstdint>

#include "llmc/core/common.h"

// F16: IEEE half (precision "fp16" on CUDA; the CPU emulates it in F32 storage)
enum class DType : uint8_t { F32, BF16, E4M3, E5M2, F16 };

inline size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::BF16:
        case DType::F16: return 2;
        case DType::E4M3:
        case DType::E5M2: return 1;
    }
    return 0;
}

inline const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "fp32";
        case DType::BF16: return "bf16";
        case DType::F16: return "fp16";
        case DType::E4M3: return "e4m3";
        case DType::E5M2: return "e5m2";
    }
    return "?";
}

struct Tensor {
    void* ptr = nullptr;
    size_t n = 0;  // number of elements
    DType dtype = DType::F32;

    Tensor() = default;
    Tensor(void* p, size_t count, DType t) : ptr(p), n(count), dtype(t) {}

    explicit operator bool() const { return ptr != nullptr; }
    size_t bytes() const { return n * dtype_size(dtype); }
    // elements [offset, offset + count)
    Tensor slice(size_t offset, size_t count) const {
        LLMC_ASSERT(offset + count <= n, "tensor slice out of range");
        return Tensor(static_cast<char*>(ptr) + offset * dtype_size(dtype), count, dtype);
    }
    float* f32() const {
        LLMC_ASSERT(dtype == DType::F32 || ptr == nullptr, "tensor is not fp32");
        return static_cast<float*>(ptr);
    }
};
