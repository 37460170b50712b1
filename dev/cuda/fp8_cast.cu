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
//      and 256). Measured (H200, 2026-11-27, 8192 x 6400): plain 0.0488 ms, transposed 0.0589, both
//      0.0688, 5.2-6.9x version 1.
//   4: the output-gradient cast of a linear with a bias, with and without a GELU before it (fc's
//      and fc_proj's backward in fp8): launch_gelu_bias_grad (dout *= gelu'(pre) in place, the
//      bias gradient) then version 3's cast into both copies (CudaFp8::backward until 2026-11-27),
//      against version 3 with `pre` and `colsum` (the GELU backward and the bias gradient's first
//      pass in the cast) and column_sum_add. Why it should be faster: one read of dout (and pre)
//      instead of two reads and a write (with the GELU) or two reads (without): at 8192 x 6400
//      with the GELU, 6 + 4 bytes an element become 6. Codes checked bit for bit, dbias to 1e-5.
//      Not yet measured (written 2026-11-27 without a GPU).
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

// version 4: the output-gradient cast with the GELU backward and the bias gradient, separate and fused
int grad_cast(int rows, int cols) {
    if (rows % 8 || cols % 8) {
        std::printf("version 4 needs rows and cols multiples of 8\n");
        return 2;
    }
    std::printf("fp8_cast v4 rows=%d cols=%d (bf16 dout -> e5m2 plain and transposed, bias gradient)\n", rows, cols);
    const size_t n = (size_t)rows * cols;
    std::vector<float> hd = rand_vec(n, 1.0f, 11), hp = rand_vec(n, 2.0f, 12), hb(cols, 0.0f);
    round_bf16(hd), round_bf16(hp);
    bf16 *d0 = to_dev<bf16>(hd), *d = to_dev<bf16>(hd), *pre = to_dev<bf16>(hp);
    bf16 *db[2] = {to_dev<bf16>(hb), to_dev<bf16>(hb)};
    float* sc;
    CUDA_CHECK(cudaMalloc(&sc, 64));
    const float hs[2] = {0.5f, 2.0f};
    CUDA_CHECK(cudaMemcpy(sc, hs, sizeof(hs), cudaMemcpyHostToDevice));
    __nv_fp8_storage_t *q[2], *qT[2];
    for (int v = 0; v < 2; v++) CUDA_CHECK(cudaMalloc(&q[v], n)), CUDA_CHECK(cudaMalloc(&qT[v], n));
    float *part, *colsum;
    CUDA_CHECK(cudaMalloc(&part, std::max<size_t>(1, bias_grad_partial_floats(rows, cols)) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&colsum, fp8::colsum_floats(rows, cols) * sizeof(float)));
    const int blocks = (int)std::min<long long>((long long)ceil_div(cols, fp8::kVecTile) * ceil_div(rows, fp8::kVecTile),
                                                fp8::kCastBlocks);
    auto separate = [&](bool gelu, bool copy) {  // (copy: a fresh dout for the GELU to write)
        if (gelu && copy) CUDA_CHECK(cudaMemcpyAsync(d, d0, n * sizeof(bf16), cudaMemcpyDeviceToDevice));
        launch_gelu_bias_grad(db[0], gelu ? d : d0, gelu ? (const bf16*)pre : nullptr, rows, cols, part, 0);
        fp8::cast_vec_kernel<bf16><<<blocks, fp8::kVecThreads>>>(q[0], qT[0], nullptr, gelu ? d : d0, nullptr, nullptr,
                                                                 sc, rows, cols, Fp8Format::E5M2, false);
    };
    auto fused = [&](bool gelu) {
        fp8::cast_vec_kernel<bf16><<<blocks, fp8::kVecThreads>>>(q[1], qT[1], nullptr, d0, gelu ? pre : nullptr, colsum,
                                                                 sc, rows, cols, Fp8Format::E5M2, false);
        launch_column_sum_add(0, db[1], (bf16*)nullptr, colsum, fp8::colsum_rows(rows), cols, 1);
    };
    bool ok = true;
    for (int gelu = 1; gelu >= 0; gelu--) {
        for (int v = 0; v < 2; v++) CUDA_CHECK(cudaMemset(db[v], 0, cols * sizeof(bf16)));
        separate(gelu, true);
        fused(gelu);
        CUDA_CHECK(cudaGetLastError());
        std::vector<uint8_t> a(n), b(n), aT(n), bT(n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(a.data(), q[0], n, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(b.data(), q[1], n, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(aT.data(), qT[0], n, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(bT.data(), qT[1], n, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += a[i] != b[i] || aT[i] != bT[i];
        std::printf("%s: codes fused vs separate %zu differ\n", gelu ? "with the GELU" : "bias only", bad);
        ok = ok && bad == 0 && validate("dbias", to_host(db[1], cols), to_host(db[0], cols), 1e-5);
        const double elems = (double)n;
        // (the timed separate runs rewrite d in place again and again: the same work on drifting values)
        const float ms_s = bench_ms([&] { separate(gelu, false); });
        const float ms_f = bench_ms([&] { fused(gelu); });
        std::printf("  separate %.4f ms, fused %.4f ms (%.1f GB/s: %s read, both codes written): %.2fx\n", ms_s, ms_f,
                    elems * (gelu ? 6.0 : 4.0) / (ms_f * 1e6), gelu ? "dout and pre" : "dout", ms_s / ms_f);
    }
    std::printf("%s\n", ok ? "OK" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    const int version = kernel_arg(argc, argv, 2);
    int rows = 8192, cols = 6400;
    if (argc > 3) rows = std::atoi(argv[2]), cols = std::atoi(argv[3]);
    if (version < 1 || version > 4 || rows < 1 || cols < 1) {
        std::printf("usage: fp8_cast <version 1-4> [rows cols]\n");
        return 2;
    }
    if (version == 4) return grad_cast(rows, cols);
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
                o, oT, amax + 2, x, nullptr, nullptr, sc, rows, cols, Fp8Format::E4M3, false);
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
