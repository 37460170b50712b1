// The fp8 casts around CudaFp8's GEMMs (llmc/cuda/fp8.cuh): bf16 -> e4m3 with the amax of the
// input, into the plain copy, the transposed copy (the backward's TN operands) or both.
// ./fp8_cast <version> [rows cols]   (default: GPT-2 1.5B's fc output at B 8 x T 1024: 8192 x 6400)
//   1: one 32 x 32 tile a block, one amax atomic per warp (the backend's until 2026-11-27: on an
//      H200 the 1.5B shape in fp8 ran at 0.81x bf16, its casts the suspect: 8 same-address
//      atomics per 1024 elements, 400K for one cast of this shape)
//   2: fp8::cast_kernel: tiles walked grid-stride by at most kCastBlocks blocks, one amax atomic
//      per block (the backend's for shapes or pointers version 3 does not take)
//   3: fp8::cast_vec_kernel: version 2's grid, 64 x 64 tiles, 8 elements a thread (16-byte loads
//      of bf16, one 8-byte store of codes; the transposed copy gathered 8 rows down a column in
//      shared memory, one 8-byte store). Why it should be faster: version 2 moves 2 bytes a thread
//      per load and 1 per store (a warp's load 64 bytes, its store 32), version 3 16 and 8 (512
//      and 256). Not yet measured (written 2026-11-27 without a GPU).
// Each version runs the three forms (plain, transposed, both) and is checked against version 1's
// codes and amax bit for bit (version 1 against the host's conversion).
#include "dev/cuda/common.h"
#include "llmc/cuda/fp8.cuh"

// version 1, kept here: one tile a block, an atomic per warp
template <class T>
__global__ void cast_v1(__nv_fp8_storage_t* out, __nv_fp8_storage_t* outT, unsigned* amax_bits, const T* x,
                        const float* sc, int rows, int cols, Fp8Format f) {
    __shared__ __nv_fp8_storage_t tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    const float s = sc[0];
    unsigned m = 0;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            const float v = to_f32(x[(long long)r * cols + c]);
            m = max(m, fp8_abs_bits(v));
            const __nv_fp8_storage_t q = fp8::cvt(v * s, f);
            if (out) out[(long long)r * cols + c] = q;
            tile[i][threadIdx.x] = q;
        }
    }
    if (outT) {
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8) {
            const int c = c0 + i, r = r0 + threadIdx.x;
            if (c < cols && r < rows) outT[(long long)c * rows + r] = tile[threadIdx.x][i];
        }
    }
    if (amax_bits) {
        m = fp8::warp_max_u32(m);
        if (threadIdx.x == 0) atomicMax(amax_bits, m);
    }
}

int main(int argc, char** argv) {
    const int version = kernel_arg(argc, argv, 2);
    int rows = 8192, cols = 6400;
    if (argc > 3) rows = std::atoi(argv[2]), cols = std::atoi(argv[3]);
    if (version < 1 || version > 3 || rows < 1 || cols < 1) {
        std::printf("usage: fp8_cast <version 1-3> [rows cols]\n");
        return 2;
    }
    std::printf("fp8_cast v%d rows=%d cols=%d (bf16 -> e4m3, scale 0.5)\n", version, rows, cols);
    const size_t n = (size_t)rows * cols;
    std::vector<float> hx = rand_vec(n, 3.0f, 7);
    round_bf16(hx);
    bf16* x = to_dev<bf16>(hx);
    float* sc;
    CUDA_CHECK(cudaMalloc(&sc, 64));
    const float hs[2] = {0.5f, 2.0f};
    CUDA_CHECK(cudaMemcpy(sc, hs, sizeof(hs), cudaMemcpyHostToDevice));
    __nv_fp8_storage_t *q[3], *qT[3];
    unsigned* amax;
    for (int v = 0; v < 3; v++) {
        CUDA_CHECK(cudaMalloc(&q[v], n));
        CUDA_CHECK(cudaMalloc(&qT[v], n));
    }
    CUDA_CHECK(cudaMalloc(&amax, 3 * sizeof(unsigned)));
    const long long tiles = (long long)ceil_div(cols, 32) * ceil_div(rows, 32);
    const long long vtiles = (long long)ceil_div(cols, fp8::kVecTile) * ceil_div(rows, fp8::kVecTile);
    if (version == 3 && !fp8::cast_vec_fits(x, q[2], qT[2], rows, cols)) {
        std::printf("version 3 needs rows and cols multiples of 8\n");
        return 2;
    }
    auto launch = [&](int v, bool plain, bool trans) {
        __nv_fp8_storage_t* o = plain ? q[v] : nullptr;
        __nv_fp8_storage_t* oT = trans ? qT[v] : nullptr;
        if (v == 0)
            cast_v1<bf16><<<dim3(ceil_div(cols, 32), ceil_div(rows, 32)), dim3(32, 8)>>>(o, oT, amax, x, sc, rows, cols,
                                                                                        Fp8Format::E4M3);
        else if (v == 1)
            fp8::cast_kernel<bf16><<<(int)std::min<long long>(tiles, fp8::kCastBlocks), dim3(32, 8)>>>(
                o, oT, amax + 1, x, sc, rows, cols, Fp8Format::E4M3, false);
        else
            fp8::cast_vec_kernel<bf16><<<(int)std::min<long long>(vtiles, fp8::kCastBlocks), fp8::kVecThreads>>>(
                o, oT, amax + 2, x, sc, rows, cols, Fp8Format::E4M3, false);
        CUDA_CHECK(cudaGetLastError());
    };
    // reference: version 1, itself checked against the host's conversion
    CUDA_CHECK(cudaMemset(amax, 0, 3 * sizeof(unsigned)));
    launch(0, true, true);
    launch(version - 1, true, true);
    std::vector<uint8_t> a(n), b(n), aT(n), bT(n);
    unsigned am[3];
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(a.data(), q[0], n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(aT.data(), qT[0], n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b.data(), q[version - 1], n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(bT.data(), qT[version - 1], n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(am, amax, sizeof(am), cudaMemcpyDeviceToHost));
    size_t bad_host = 0, bad = 0;
    float host_amax = 0;
    for (size_t i = 0; i < n; i++) {
        host_amax = std::max(host_amax, std::fabs(hx[i]));
        if (a[i] != fp8_encode(hx[i] * 0.5f, Fp8Format::E4M3)) bad_host++;
        const size_t r = i / cols, c = i % cols;
        if (a[i] != b[i] || aT[c * rows + r] != bT[c * rows + r] || aT[c * rows + r] != a[i]) bad++;
    }
    const unsigned want = fp8_abs_bits(host_amax);
    std::printf("  codes: v1 vs host %zu differ, v%d vs v1 (plain and transposed) %zu differ; amax v1 %s, v%d %s\n",
                bad_host, version, bad, am[0] == want ? "OK" : "WRONG", version,
                am[version - 1] == want ? "OK" : "WRONG");
    const bool ok = bad_host == 0 && bad == 0 && am[0] == want && am[version - 1] == want;
    const char* names[3] = {"plain", "transposed", "both"};
    for (int form = 0; form < 3; form++) {
        const bool plain = form != 1, trans = form != 0;
        const float ms = bench_ms([&] { launch(version - 1, plain, trans); });
        const double bytes = n * (2.0 + (plain ? 1 : 0) + (trans ? 1 : 0));
        std::printf("%-10s time %.4f ms, %.1f GB/s (x read, codes written)\n", names[form], ms, bytes / (ms * 1e6));
    }
    std::printf("%s\n", ok ? "OK" : "FAIL");
    return ok ? 0 : 1;
}
