// bf16 on the host, and the stochastic rounding of AdamW's bf16 parameter copy, which the CUDA
// kernel (llmc/cuda/adamw.cuh) and the host update of optimizer offload (llmc/model/optimizer.cpp) share
// so that both round alike.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LLMC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LLMC_HOST_DEVICE inline
#endif

// The random bits of element idx: a few rounds of a multiply-xorshift mixer (deterministic, no state).
LLMC_HOST_DEVICE uint32_t hash_u32(uint32_t seed, uint32_t idx) {
    uint32_t h = idx * 0x9E3779B1u ^ (seed + 0x7F4A7C15u);
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    h += seed * 0x27D4EB2Fu;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return h;
}

// The bf16 bits of the finite fp32 with bits u rounded stochastically: the low 16 random bits
// carry into the kept bits with probability = the dropped fraction.
LLMC_HOST_DEVICE uint16_t bf16_stochastic_bits(uint32_t u, uint32_t rnd) {
    return (uint16_t)((u + (rnd & 0xffffu)) >> 16);
}

inline float bf16_bits_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays (a quiet) NaN.
inline uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Stochastic rounding on the host (inf and NaN as f32_to_bf16_bits).
inline uint16_t f32_to_bf16_stochastic(float f, uint32_t rnd) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f32_to_bf16_bits(f);
    return bf16_stochastic_bits(u, rnd);
}
