// CpuOps: memory operations and the factory.
#include "llmc/cpu/cpu_ops.h"

#include <cstdlib>
#include <cstring>

#include "llmc/precision/bf16.h"
#include "llmc/comm/device_sim.h"

namespace {
constexpr size_t kAlign = 64;
}  // namespace

void* CpuOps::alloc(size_t bytes) {
    counters_.allocs += bytes > 0;
    void* p = Ops::alloc_host(bytes);
    if (sim_device()) sim_device_register(p, bytes);
    return p;
}

void CpuOps::release(void* p) {
    counters_.allocs += p != nullptr;
    if (sim_device()) sim_device_unregister(p);
    Ops::release_host(p);
}

// The host memory of the base class: aligned for the vector kernels (every backend's host side).
void* Ops::alloc_host(size_t bytes) {
    const size_t sz = ((bytes + kAlign - 1) / kAlign) * kAlign;
    if (sz == 0) return nullptr;
    void* p = std::aligned_alloc(kAlign, sz);
    if (!p) throw UserError(strfmt("out of host memory allocating %zu bytes", bytes));
    std::memset(p, 0, sz);
    return p;
}

void Ops::release_host(void* p) { std::free(p); }

// (an empty tensor is no launch, as on CUDA)
void CpuOps::zero(Tensor t) {
    if (!t.ptr || !t.n) return;
    ++counters_.launches;
    std::memset(t.ptr, 0, t.bytes());
}

void CpuOps::copy(Tensor dst, Tensor src) {
    LLMC_ASSERT(dst.dtype == src.dtype && dst.n == src.n, "copy: tensors differ in dtype or size");
    if (!dst.n) return;
    ++counters_.launches;
    std::memmove(dst.ptr, src.ptr, dst.bytes());
}

// The accounting a device would see (llmc/backend/ops.h: OpsCounters).
void CpuOps::count_down(size_t bytes) {
    if (!bytes) return;
    counters_.d2h_bytes += bytes;
    ++counters_.host_syncs;
}

void CpuOps::count_up(size_t bytes) {
    if (!bytes) return;
    counters_.h2d_bytes += bytes;
    if (bytes > kUploadNoSync) ++counters_.host_syncs;
}

void CpuOps::to_host_f32(float* dst, Tensor src) {
    count_down(src.bytes());
    if (src.dtype == DType::F32) {
        if (src.n) std::memcpy(dst, src.ptr, src.bytes());
    } else if (src.dtype == DType::BF16) {
        const uint16_t* s = static_cast<const uint16_t*>(src.ptr);
        for (size_t i = 0; i < src.n; ++i) dst[i] = bf16_bits_to_f32(s[i]);
    } else {
        LLMC_ASSERT(false, std::string("to_host_f32: unsupported dtype on the cpu backend: ") + dtype_name(src.dtype));
    }
}

void CpuOps::from_host_f32(Tensor dst, const float* src) {
    count_up(dst.bytes());
    if (dst.dtype == DType::F32) {
        if (dst.n) std::memcpy(dst.ptr, src, dst.bytes());
    } else if (dst.dtype == DType::BF16) {
        uint16_t* d = static_cast<uint16_t*>(dst.ptr);
        for (size_t i = 0; i < dst.n; ++i) d[i] = f32_to_bf16_bits(src[i]);
    } else {
        LLMC_ASSERT(false,
                    std::string("from_host_f32: unsupported dtype on the cpu backend: ") + dtype_name(dst.dtype));
    }
}

void CpuOps::to_host_bytes(void* dst, const void* src, size_t bytes) {
    count_down(bytes);
    if (bytes) std::memcpy(dst, src, bytes);
}

void CpuOps::from_host_bytes(void* dst, const void* src, size_t bytes) {
    count_up(bytes);
    if (bytes) std::memcpy(dst, src, bytes);
}

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

// (after the factory: the asynchronous copies run at once, but count as a device's, with an id
// whose wait_copy is a wait)
uint64_t CpuOps::copy_to_host_async(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    counters_.d2h_bytes += bytes;
    return ++copies_;
}

uint64_t CpuOps::copy_from_host_async(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
    counters_.h2d_bytes += bytes;
    return ++copies_;
}
