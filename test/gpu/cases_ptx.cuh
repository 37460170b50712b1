// test_gpu's `ptx` filter: llmc/cuda/ptx.cuh's instructions (on a device the PTX itself, under
// the emulator the CPU twins) against naive per-element products in double. One warp:
//  - A [16x16], Kt [16 n x 16 k] and V [16 k x 16 n] copied into shared memory by cp.async;
//  - A by ldmatrix.x4 (the mma's A registers), Kt by ldmatrix.x4 (B = Kt^T), V by ldmatrix.x4.trans;
//  - C1 = A Kt^T and C2 = A V + C1 (two n-tiles of mma.m16n8k16 each; C1 as the accumulator in);
//  - C3 = E(C1) V with E(C1) packed straight from C1's accumulators into A registers (the
//    flash kernels' P-from-registers reuse).
// E, the element type: bf16 and fp16 (the mma's two type suffixes; the values are drawn so that
// both types hold them exactly).
// Each output is written through the documented accumulator layout, so a wrong row or column
// of any layout shows as a wrong element.
// ptx.wgmma (test_ptx_wgmma): the warpgroup MMA of the wgmma flash forward, with its helpers
// (flash_forward_wgmma.cuh: the swizzled K tile by cp.async, V^T by wg_fetch_v/wg_store_vt):
// two warpgroups, A [128 x 64] (each warpgroup 64 rows, its registers filled straight from the
// documented layout, not by ldmatrix), Bt [64 n x 64 k], V [64 k x 128 n]: D1 = A Bt^T (m64n64k16,
// four k-steps, the descriptor advanced 32 bytes each), D2 = E(D1) V[:, :64] (P from D1's
// registers) and D3 = E(D1) V (m64n128k16: V^T's 128 rows in 16 atoms); D4 = D3 with V read as it
// lies, MN-major (imm-trans-b 1; not used by the kernels yet: on a GPU the check of ptx.cuh's
// reading of the ISA's MN-major layout, on the emulator only that the twin follows that reading);
// D5 = D1 with A from shared memory too (wgmma_m64n64k16_ss: A's swizzled tiles by cp.async, a
// warpgroup's 64 rows each, as the dK/dV kernel's K and V). Part of test_gpu.cu.
#pragma once
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/ptx.cuh"
#include "test/gpu/harness.h"

namespace gpu_test {

constexpr int kPtxLD = 24;  // smem row pitch (elements): 48 bytes, 16-byte aligned rows

template <class E>
__global__ void ptx_test_kernel(float* c1, float* c2, float* c3, const E* A, const E* Kt, const E* V) {
    __shared__ __align__(128) E sA[16 * kPtxLD], sK[16 * kPtxLD], sV[16 * kPtxLD];
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const int r = lane / 2, c = (lane % 2) * 8;  // one 16-byte chunk of each matrix per lane
    ptx::cp_async_16(sA + r * kPtxLD + c, A + r * 16 + c);
    ptx::cp_async_16(sK + r * kPtxLD + c, Kt + r * 16 + c);
    ptx::cp_async_16(sV + r * kPtxLD + c, V + r * 16 + c);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncwarp();
    uint32_t a[4], k[4], v[4];
    ptx::ldmatrix_x4(a, sA + ((lane & 7) + ((lane >> 3) & 1) * 8) * kPtxLD + (lane >> 4) * 8);
    ptx::ldmatrix_x4(k, sK + ((lane >> 4) * 8 + (lane & 7)) * kPtxLD + ((lane >> 3) & 1) * 8);
    ptx::ldmatrix_x4_trans(v, sV + ((lane & 7) + ((lane >> 3) & 1) * 8) * kPtxLD + (lane >> 4) * 8);
    float s1[2][4], s2[2][4], s3[2][4];
    const float zero[4] = {0, 0, 0, 0};
    for (int n = 0; n < 2; n++) {
        const uint32_t bk[2] = {k[2 * n], k[2 * n + 1]}, bv[2] = {v[2 * n], v[2 * n + 1]};
        ptx::mma_16816<E>(s1[n], a, bk, zero);
        ptx::mma_16816<E>(s2[n], a, bv, s1[n]);
    }
    uint32_t p[4];
    ptx::acc_to_a<E>(p, s1[0], s1[1]);
    for (int n = 0; n < 2; n++) {
        const uint32_t bv[2] = {v[2 * n], v[2 * n + 1]};
        ptx::mma_16816<E>(s3[n], p, bv, zero);
    }
    for (int n = 0; n < 2; n++)
        for (int e = 0; e < 4; e++) {
            const int i = (g + (e >> 1) * 8) * 16 + n * 8 + 2 * t + (e & 1);
            c1[i] = s1[n][e];
            c2[i] = s2[n][e];
            c3[i] = s3[n][e];
        }
}

template <class E>
void test_ptx() {
    constexpr bool half = std::is_same<E, f16>::value;
    auto bits = [](float x) { return half ? f32_to_f16_bits(x) : f32_to_bf16_bits(x); };
    auto f = [](uint16_t b) { return (double)(half ? f16_bits_to_f32(b) : bf16_bits_to_f32(b)); };
    std::vector<uint16_t> hA(256), hK(256), hV(256);
    uint32_t st = 12345;
    auto rnd = [&] {
        st = st * 1664525u + 1013904223u;
        // 8 significant bits and |x| < 2: exact in bf16 and in fp16
        return bits(std::ldexp(std::round(((st >> 8) / 16777216.0f - 0.5f) * 256.0f), -6));
    };
    for (int i = 0; i < 256; i++) hA[i] = rnd(), hK[i] = rnd(), hV[i] = rnd();
    E *dA, *dK, *dV;
    float* dC;
    CUDA_CHECK(cudaMalloc(&dA, 3 * 256 * sizeof(E)));
    CUDA_CHECK(cudaMalloc(&dC, 3 * 256 * sizeof(float)));
    dK = dA + 256;
    dV = dA + 512;
    CUDA_CHECK(cudaMemcpy(dA, hA.data(), 512, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dK, hK.data(), 512, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dV, hV.data(), 512, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dC, 0xff, 3 * 256 * sizeof(float)));  // NaN: an unwritten element fails
    auto kernel = ptx_test_kernel<E>;
    LLMC_LAUNCH(kernel, 1, 32, 0, (cudaStream_t)0, dC, dC + 256, dC + 512, (const E*)dA, (const E*)dK, (const E*)dV);
    CUDA_CHECK_LAUNCH();
    std::vector<float> c(768);
    CUDA_CHECK(cudaMemcpy(c.data(), dC, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dC));
    // reference; the bound: fp32 accumulation of 16 exact products (32 for C2)
    double worst[3] = {0, 0, 0};
    int bad[3] = {-1, -1, -1};
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double r1 = 0, r2 = 0, r3 = 0, m1 = 0, m2 = 0, m3 = 0;
            for (int k = 0; k < 16; k++) {
                r1 += f(hA[i * 16 + k]) * f(hK[j * 16 + k]);
                m1 += std::fabs(f(hA[i * 16 + k]) * f(hK[j * 16 + k]));
                r2 += f(hA[i * 16 + k]) * f(hV[k * 16 + j]);
                m2 += std::fabs(f(hA[i * 16 + k]) * f(hV[k * 16 + j]));
                const double pk = f(bits(c[i * 16 + k]));  // E(C1), C1 checked below
                r3 += pk * f(hV[k * 16 + j]);
                m3 += std::fabs(pk * f(hV[k * 16 + j]));
            }
            const double got[3] = {c[i * 16 + j], c[256 + i * 16 + j], c[512 + i * 16 + j]};
            const double ref[3] = {r1, r2 + r1, r3}, mag[3] = {m1, m2 + m1, m3};
            for (int o = 0; o < 3; o++) {
                const double e = std::fabs(got[o] - ref[o]) / (mag[o] + 1e-30);
                if (!(e <= worst[o])) worst[o] = std::isnan(e) ? INFINITY : e, bad[o] = i * 16 + j;
            }
        }
    const char* names[3] = {"ptx.mma_ldmatrix", "ptx.mma_ldmatrix_trans_acc", "ptx.mma_p_from_registers"};
    for (int o = 0; o < 3; o++)
        report(worst[o] <= 1e-5, names[o], half ? "[fp16 16x16x16]" : "[bf16 16x16x16]",
               strfmt("worst element %d: err/sum|terms|=%.3g tol=1e-05", bad[o], worst[o]));
}

// ptx::exp2_ftz (ex2.approx.ftz.f32) against 2^x in double: relative error within 2^-21 (the PTX
// ISA gives ex2.approx a maximum relative error of 2^-22.5 or so: 2 ulp) where 2^x is normal, 0
// exactly where it is subnormal (x < -126: the flush), 0 at -inf, NaN at NaN.
__global__ void ptx_exp2_kernel(float* y, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = ptx::exp2_ftz(x[i]);
}

void test_ptx_exp2() {
    std::vector<float> x;
    for (float v = -150.0f; v <= 100.0f; v += 0.3125f) x.push_back(v);  // 800 inputs, exact in fp32
    for (float v : {-125.99f, -126.01f, 0.0f, -0.0f, 1e-40f, 0.5f, -INFINITY, NAN}) x.push_back(v);
    const int n = (int)x.size();
    float *dx, *dy;
    CUDA_CHECK(cudaMalloc(&dx, 2 * n * sizeof(float)));
    dy = dx + n;
    CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dy, 0xff, n * sizeof(float)));
    LLMC_LAUNCH(ptx_exp2_kernel, (n + 127) / 128, 128, 0, (cudaStream_t)0, dy, dx, n);
    CUDA_CHECK_LAUNCH();
    std::vector<float> y(n);
    CUDA_CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dx));
    double worst = 0;
    int bad = -1;
    std::string why;
    for (int i = 0; i < n && why.empty(); i++) {
        const double ref = std::exp2((double)x[i]);
        if (std::isnan(x[i])) {
            if (!std::isnan(y[i])) why = strfmt("2^NaN gave %g", y[i]);
        } else if (ref < FLT_MIN) {  // subnormal (or 0) in fp32: flushed
            if (y[i] != 0.0f) why = strfmt("2^%g gave %g, not 0", x[i], y[i]);
        } else {
            const double e = std::fabs(y[i] - ref) / ref;
            if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e, bad = i;
        }
    }
    if (why.empty() && worst > std::ldexp(1.0, -21))
        why = strfmt("2^%g: relative error %.3g above 2^-21", x[bad], worst);
    report(why.empty(), "ptx.exp2_ftz", strfmt("[%d inputs]", n).c_str(),
           why.empty() ? strfmt("worst relative error %.3g (input %g) tol=2^-21", worst, bad >= 0 ? x[bad] : 0.0f)
                       : why);
}

template <class E>
__global__ void ptx_wgmma_kernel(float* d1, float* d2, float* d3, float* d4, float* d5, const E* A, const E* Bt,
                                 const E* V) {
    char* smem = flash::smem_1024();
    char* sB = smem;
    char* sVt = smem + 8192;      // V[:, :64]^T, 64 rows
    char* sVt2 = smem + 2 * 8192;  // V^T, 128 rows
    char* sVmn = smem + 4 * 8192;  // V as it lies: [64 k][64 n] swizzled, n 64-127 8 KiB on
    char* sA = smem + 6 * 8192;    // A's rows 0-63, then 64-127 (8 KiB on)
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    flash::wg_load_k<64>(sB, Bt, 64, 0, 64);
    flash::wg_load_k<128>(sVmn, V, 128, 0, 64);
    flash::wg_load_k<64>(sA, A, 64, 0, 64);
    flash::wg_load_k<64>(sA + 8192, A + 64 * 64, 64, 0, 64);
    ptx::cp_async_commit();
    uint4 v[1][2], v2[2][2];
    flash::wg_fetch_v<64>(v, V, 128, 0, 64);
    flash::wg_store_vt<64>(sVt, v);
    flash::wg_fetch_v<128>(v2, V, 128, 0, 64);
    flash::wg_store_vt<128>(sVt2, v2);
    uint32_t a[4][4];
    auto pair = [&](int r, int c) {  // A[r][c], A[r][c + 1] in one register
        uint32_t x;
        std::memcpy(&x, A + r * 64 + c, 4);
        return x;
    };
    for (int kc = 0; kc < 4; kc++) {
        const int r = 16 * w + g, c = 16 * kc + 2 * t;
        a[kc][0] = pair(r, c), a[kc][1] = pair(r + 8, c), a[kc][2] = pair(r, c + 8), a[kc][3] = pair(r + 8, c + 8);
    }
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async();
    __syncthreads();
    float s[8][4], o[8][4];
    ptx::wgmma_fence();
    for (int kc = 0; kc < 4; kc++) ptx::wgmma_m64k16<E, 64>(s, a[kc], ptx::wgmma_desc_sw128(sB, kc * 32), kc > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(s);
    uint32_t p[4][4];
    for (int kc = 0; kc < 4; kc++) ptx::acc_to_a<E>(p[kc], s[2 * kc], s[2 * kc + 1]);
    ptx::wgmma_fence();
    for (int kc = 0; kc < 4; kc++) ptx::wgmma_m64k16<E, 64>(o, p[kc], ptx::wgmma_desc_sw128(sVt, kc * 32), kc > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(o);
    float o2[16][4];
    ptx::wgmma_fence();
    for (int kc = 0; kc < 4; kc++) ptx::wgmma_m64k16<E, 128>(o2, p[kc], ptx::wgmma_desc_sw128(sVt2, kc * 32), kc > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(o2);
    float o3[16][4];
    ptx::wgmma_fence();  // (k-step kc: V's rows 16 kc.., two 8-row groups 1024 bytes apart)
    for (int kc = 0; kc < 4; kc++)
        ptx::wgmma_m64k16<E, 128, true>(o3, p[kc], ptx::wgmma_desc_sw128_mn(sVmn, kc * 2048, 8192), kc > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(o3);
    float s5[8][4];
    ptx::wgmma_fence();
    for (int kc = 0; kc < 4; kc++)
        ptx::wgmma_m64n64k16_ss<E>(s5, flash::wg_kdesc(sA + (w / 4) * 8192, kc), flash::wg_kdesc(sB, kc), kc > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(s5);
    for (int i = 0; i < 16; i++)
        for (int e = 0; e < 4; e++) {
            const int r = 16 * w + g + 8 * (e >> 1), c = 8 * i + 2 * t + (e & 1);
            if (i < 8) {
                d1[r * 64 + c] = s[i][e];
                d2[r * 64 + c] = o[i][e];
                d5[r * 64 + c] = s5[i][e];
            }
            d3[r * 128 + c] = o2[i][e];
            d4[r * 128 + c] = o3[i][e];
        }
}

template <class E>
void test_ptx_wgmma() {
    constexpr bool half = std::is_same<E, f16>::value;
    const char* what = half ? "[fp16, two warpgroups]" : "[bf16, two warpgroups]";
    if (!flash::wgmma_available()) {
        std::printf("SKIP ptx.wgmma %s: not an sm_90 device with sm_90a code\n", what);
        return;
    }
    auto bits = [](float x) { return half ? f32_to_f16_bits(x) : f32_to_bf16_bits(x); };
    auto f = [](uint16_t b) { return (double)(half ? f16_bits_to_f32(b) : bf16_bits_to_f32(b)); };
    std::vector<uint16_t> hA(128 * 64), hB(64 * 64), hV(64 * 128);
    uint32_t st = 777;
    auto rnd = [&] {  // 8 significant bits, |x| < 2: exact in both types
        st = st * 1664525u + 1013904223u;
        return bits(std::ldexp(std::round(((st >> 8) / 16777216.0f - 0.5f) * 256.0f), -6));
    };
    for (auto& x : hA) x = rnd();
    for (auto& x : hB) x = rnd();
    for (auto& x : hV) x = rnd();
    E* dA;
    float* dD;
    CUDA_CHECK(cudaMalloc(&dA, (hA.size() + hB.size() + hV.size()) * sizeof(E)));
    const size_t nd = 3 * 128 * 64 + 2 * 128 * 128;
    CUDA_CHECK(cudaMalloc(&dD, nd * sizeof(float)));
    E* dB = dA + hA.size();
    E* dV = dB + hB.size();
    CUDA_CHECK(cudaMemcpy(dA, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dV, hV.data(), hV.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dD, 0xff, nd * sizeof(float)));  // NaN: an unwritten element fails
    auto kernel = ptx_wgmma_kernel<E>;
    const size_t bytes = 8 * 8192 + flash::kWgSlack;
    int optin = 0;
    if (!opt_in_smem((const void*)kernel, bytes, &optin)) throw std::runtime_error("ptx.wgmma: shared memory");
    float* d5 = dD + 2 * 128 * 64 + 2 * 128 * 128;
    LLMC_LAUNCH(kernel, 1, 256, bytes, (cudaStream_t)0, dD, dD + 128 * 64, dD + 2 * 128 * 64,
                dD + 2 * 128 * 64 + 128 * 128, d5, (const E*)dA, (const E*)dB, (const E*)dV);
    CUDA_CHECK_LAUNCH();
    std::vector<float> d(nd);
    CUDA_CHECK(cudaMemcpy(d.data(), dD, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dD));
    // the worst element of each output, err / sum|terms| (as the mma's check)
    double worst[5] = {0, 0, 0, 0, 0};
    int bad_r[5] = {-1, -1, -1, -1, -1}, bad_c[5] = {-1, -1, -1, -1, -1};
    auto note = [&](int o, int r, int c, double got, double ref, double mag) {
        const double e = std::fabs(got - ref) / (mag + 1e-30);
        if (!(e <= worst[o])) worst[o] = std::isnan(e) ? INFINITY : e, bad_r[o] = r, bad_c[o] = c;
    };
    for (int r = 0; r < 128; r++)
        for (int n = 0; n < 128; n++) {
            double r1 = 0, m1 = 0, r2 = 0, m2 = 0;
            for (int k = 0; k < 64; k++) {
                if (n < 64) {
                    r1 += f(hA[r * 64 + k]) * f(hB[n * 64 + k]);
                    m1 += std::fabs(f(hA[r * 64 + k]) * f(hB[n * 64 + k]));
                }
                const double pk = f(bits(d[r * 64 + k]));  // E(D1), D1 checked here too
                r2 += pk * f(hV[k * 128 + n]);
                m2 += std::fabs(pk * f(hV[k * 128 + n]));
            }
            if (n < 64) {
                note(0, r, n, d[r * 64 + n], r1, m1);
                note(4, r, n, d[2 * 128 * 64 + 2 * 128 * 128 + r * 64 + n], r1, m1);
                note(1, r, n, d[128 * 64 + r * 64 + n], r2, m2);
            }
            note(2, r, n, d[2 * 128 * 64 + r * 128 + n], r2, m2);
            note(3, r, n, d[2 * 128 * 64 + 128 * 128 + r * 128 + n], r2, m2);
        }
    const char* names[5] = {"ptx.wgmma_swizzled_k", "ptx.wgmma_p_from_registers_vt", "ptx.wgmma_n128",
                            "ptx.wgmma_mn_major", "ptx.wgmma_a_from_shared"};
    for (int o = 0; o < 5; o++)
        report(worst[o] <= 1e-5, names[o], what,
               bad_r[o] < 0 ? std::string("every element exact")
                            : strfmt("worst: row %d col %d, err/sum|terms|=%.3g tol=1e-05", bad_r[o], bad_c[o],
                                     worst[o]));
}

}  // namespace gpu_test
