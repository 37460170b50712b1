// The work around the matmuls (llmc/cuda/matmul.cuh): the bias gradient and the GELU as kernels,
// and cuBLASLt's epilogues in their place. bf16.
// ./matmul_epilogue <version> [N IC OC]   (default: the matmul Bench case, GPT-2 124M's fc at B 8 x T 1024)
//   1: bias gradient in one pass, 32 x 32 threads a block over 32 columns (bias_backward_kernel:
//      what CudaOps ran before; ceil(OC / 32) blocks, 96 for OC 3072)
//   2: bias gradient, launch_bias_grad: chunks of 256 rows by 256 columns (16-byte loads), then
//      the chunks' sums in order (H200, GPT-2 124M B 32: version 1 took 6.0 ms of the step's 48 calls)
//   3: GELU forward and backward, one element per thread (the kernels before, kept here)
//   4: GELU forward and backward, 16-byte grid-stride (gelu_forward_kernel, gelu_backward_inplace_kernel)
//   5: forward GEMM: BIAS epilogue + gelu_forward_kernel (CudaOps's fallback) against GELU_AUX_BIAS
//   6: dweight GEMM (k = N): plain + launch_bias_grad against BGRADB + the add into dbias
//   7: the GELU backward and the bias gradient: gelu_backward_inplace_kernel then launch_bias_grad
//      (the backend's two passes until 2026-11-27) against launch_gelu_bias_grad (one pass; now the
//      backend's), which must give the same dout and dbias bit for bit
//   8: the GELU's backward for the next linear's input gradient (GPT-2's fc_proj: dinp [N, OC] =
//      dout [N, IC] w, the fc's pre-activation [N, OC]) and the fc's bias gradient: the GEMM, then
//      launch_gelu_bias_grad (the backend's until 2026-11-27), against cuBLASLt's DGELU epilogue on
//      the GEMM, then launch_bias_grad (now the backend's: one pass less over N x OC)
// 1-4 are checked against the CPU; 5, 6 and 8 compare the epilogue's results with the fallback's.
// Measured, H200, 2026-11-27 (main 791cfe5), this default shape: 5: BIAS + kernel 0.1008 ms,
// GELU_AUX_BIAS 0.0863 (the backend's); 6: GEMM + launch_bias_grad 0.0748 ms, BGRADB + add
// 0.0864: the backend now takes launch_bias_grad (it took BGRADB before).
#include "dev/cuda/common.h"
#include "llmc/cuda/matmul.cuh"

// y[i] += x[i] (the BGRADB gradient into dbias, as CudaOps adds it)
__global__ void add_into(bf16* y, const bf16* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f32<bf16>(to_f32(y[i]) + to_f32(x[i]));
}

// version 1 (the backend's until issue 29, kept here): dbias[c] += sum_n dout[n, c] in one pass,
// block = 32 x 32 threads over 32 columns, thread (x, y) sums rows y, y+32, ... of column x in
// order, the 32 sums of a column added in y order.
template <class T>
__global__ void bias_backward_kernel(T* dbias, const T* dout, int N, int OC) {
    __shared__ float s[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < OC)
        for (int n = threadIdx.y; n < N; n += 32) acc += to_f32(dout[(long long)n * OC + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) t += s[y][threadIdx.x];
        dbias[c] = from_f32<T>(to_f32(dbias[c]) + t);
    }
}

template <class T>
__global__ void gelu_forward_v1(T* out, const T* inp, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(gelu_tanh(to_f32(inp[i])));
}
template <class T>
__global__ void gelu_backward_v1(T* dout, const T* pre, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dout[i] = from_f32<T>(to_f32(dout[i]) * gelu_tanh_grad(to_f32(pre[i])));
}

int main(int argc, char** argv) {
    const int version = kernel_arg(argc, argv, 2);
    const std::vector<int> d = bench_case("matmul", argc, argv, 3);
    const int N = d[0], IC = d[1], OC = d[2];
    const long long n = (long long)N * OC;
    std::printf("matmul_epilogue v%d N=%d IC=%d OC=%d (bf16)\n", version, N, IC, OC);
    auto dout = rand_vec(n, 1.0f, 1), pre = rand_vec(n, 3.0f, 2), db0 = rand_vec(OC, 1.0f, 3);
    round_bf16(dout), round_bf16(pre), round_bf16(db0);
    bool ok = true;
    if (version == 1 || version == 2) {
        std::vector<float> want(OC);
        for (int c = 0; c < OC; c++) {
            double s = db0[c];
            for (int r = 0; r < N; r++) s += dout[(size_t)r * OC + c];
            want[c] = (float)s;
        }
        bf16 *gd = to_dev<bf16>(dout), *gb = to_dev<bf16>(db0);
        float* part = dev_poisoned<float>(std::max<size_t>(1, bias_grad_partial_floats(N, OC)));
        auto run = [=] {
            if (version == 1) bias_backward_kernel<bf16><<<ceil_div(OC, 32), dim3(32, 32)>>>(gb, gd, N, OC);
            else launch_bias_grad(gb, (const bf16*)gd, N, OC, part, nullptr);
        };
        run();
        ok &= validate("dbias", to_host(gb, OC), want, 2e-2);
        std::printf("time %.4f ms (accumulating repeatedly)\n", bench_ms(run));
    } else if (version == 3 || version == 4) {
        std::vector<float> out(n), dpre(n);
        cpu::gelu_forward(out.data(), pre.data(), (size_t)n);
        for (long long i = 0; i < n; i++) dpre[i] = dout[i] * cpu::gelu_grad(pre[i]);
        bf16 *gp = to_dev<bf16>(pre), *go = dev_poisoned<bf16>(n), *gd = to_dev<bf16>(dout);
        auto fwd = [=] {
            if (version == 3) gelu_forward_v1<bf16><<<ceil_div(n, 256), 256>>>(go, gp, n);
            else gelu_forward_kernel<bf16><<<elementwise_blocks(n, 2), 256>>>(go, gp, n);
        };
        auto bwd = [=] {
            if (version == 3) gelu_backward_v1<bf16><<<ceil_div(n, 256), 256>>>(gd, gp, n);
            else gelu_backward_inplace_kernel<bf16><<<elementwise_blocks(n, 2), 256>>>(gd, gp, n);
        };
        fwd();
        bwd();
        ok &= validate("out", to_host(go, n), out, 2e-2);
        ok &= validate("dpre", to_host(gd, n), dpre, 2e-2);
        std::printf("forward time %.4f ms, backward time %.4f ms (in place, repeatedly)\n", bench_ms(fwd),
                    bench_ms(bwd));
    } else if (version == 7) {
        bf16 *gp = to_dev<bf16>(pre), *gd_a = to_dev<bf16>(dout), *gd_b = to_dev<bf16>(dout);
        bf16 *db_a = to_dev<bf16>(db0), *db_b = to_dev<bf16>(db0);
        float* part = dev_poisoned<float>(std::max<size_t>(1, bias_grad_partial_floats(N, OC)));
        auto two = [=] {
            gelu_backward_inplace_kernel<bf16><<<elementwise_blocks(n, 2), 256>>>(gd_a, gp, n);
            launch_bias_grad(db_a, (const bf16*)gd_a, N, OC, part, nullptr);
        };
        auto one = [=] { launch_gelu_bias_grad(db_b, gd_b, (const bf16*)gp, N, OC, part, nullptr); };
        two();
        one();
        const std::vector<float> da = to_host(gd_a, n), dbb = to_host(gd_b, n), ba = to_host(db_a, OC),
                                 bb = to_host(db_b, OC);
        const bool same = std::equal(da.begin(), da.end(), dbb.begin()) && std::equal(ba.begin(), ba.end(), bb.begin());
        std::printf("  dout and dbias %s\n", same ? "bitwise equal" : "DIFFER");
        ok &= same;
        // (timed repeatedly in place: dout shrinks towards 0 and dbias moves; the traffic is the same)
        std::printf("gelu kernel + launch_bias_grad %.4f ms, launch_gelu_bias_grad %.4f ms\n", bench_ms(two),
                    bench_ms(one));
    } else {
        LtMatmul lt;
        lt.init();
        auto inp = rand_vec((size_t)N * IC, 1.0f, 4), w = rand_vec((size_t)OC * IC, 0.036f, 5);
        round_bf16(inp), round_bf16(w);
        bf16 *gi = to_dev<bf16>(inp), *gw = to_dev<bf16>(w), *gbias = to_dev<bf16>(db0);
        if (version == 8) {
            // fc_proj's input gradient: its in = OC (the fc's out), its out = IC; dinp^T[OC, N] =
            // w(as stored: OC x IC col-major) dout^T[IC, N], as CudaOps::matmul_backward
            bf16 *gdo = to_dev<bf16>(rand_vec((size_t)N * IC, 1.0f, 7)), *gpre = to_dev<bf16>(pre);
            bf16 *dinp_a = dev_poisoned<bf16>(n), *dinp_b = dev_poisoned<bf16>(n);
            bf16 *db_a = to_dev<bf16>(db0), *db_b = to_dev<bf16>(db0);
            float* part = dev_poisoned<float>(std::max<size_t>(1, bias_grad_partial_floats(N, OC)));
            LtGemm g{dinp_a, gw, gdo, OC, N, IC, false, false, OC, IC, OC, 0.0f, CUDA_R_16BF};
            LtGemm f = g;
            f.D = dinp_b, f.dgelu_aux = gpre, f.aux_ld = OC;
            auto before = [&] {
                lt.matmul(g, nullptr);
                launch_gelu_bias_grad(db_a, dinp_a, (const bf16*)gpre, N, OC, part, nullptr);
            };
            auto now = [&] {
                ok &= lt.run(f, nullptr);
                launch_bias_grad(db_b, (const bf16*)dinp_b, N, OC, part, nullptr);
            };
            before();
            now();
            ok &= validate("dpre", to_host(dinp_b, n), to_host(dinp_a, n), 2e-2);
            ok &= validate("dbias", to_host(db_b, OC), to_host(db_a, OC), 2e-2);
            std::printf("GEMM + launch_gelu_bias_grad %.4f ms, DGELU GEMM + launch_bias_grad %.4f ms (dbias accumulating)\n",
                        bench_ms(before), bench_ms(now));
        } else if (version == 5) {
            bf16 *out_a = dev_poisoned<bf16>(n), *pre_a = dev_poisoned<bf16>(n);
            bf16 *out_b = dev_poisoned<bf16>(n), *pre_b = dev_poisoned<bf16>(n);
            // column-major pre^T[OC, N] = w^T-as-stored[IC, OC]^T inp^T[IC, N], as CudaOps::matmul_forward
            LtGemm g{pre_a, gw, gi, OC, N, IC, true, false, IC, IC, OC, 0.0f, CUDA_R_16BF};
            g.bias = gbias;
            LtGemm f = g;
            f.D = out_b, f.gelu_aux = pre_b, f.aux_ld = OC;
            auto fallback = [&] {
                lt.matmul(g, nullptr);
                gelu_forward_kernel<bf16><<<elementwise_blocks(n, 2), 256>>>(out_a, pre_a, n);
            };
            auto fused = [&] { ok &= lt.run(f, nullptr); };
            fallback();
            fused();
            ok &= validate("pre", to_host(pre_b, n), to_host(pre_a, n), 1e-2);
            ok &= validate("out", to_host(out_b, n), to_host(out_a, n), 1e-2);
            std::printf("BIAS + kernel %.4f ms, GELU_AUX_BIAS %.4f ms\n", bench_ms(fallback), bench_ms(fused));
        } else {
            bf16 *gd = to_dev<bf16>(dout), *dw = to_dev<bf16>(rand_vec((size_t)OC * IC, 0.01f, 6));
            bf16 *db_a = to_dev<bf16>(db0), *db_b = to_dev<bf16>(db0), *bgrad = dev_poisoned<bf16>(OC);
            float* part = dev_poisoned<float>(std::max<size_t>(1, bias_grad_partial_floats(N, OC)));
            // dw(as stored: IC x OC col-major) += inp^T[IC, N] (dout^T[OC, N])^T, as CudaOps::matmul_backward
            LtGemm g{dw, gi, gd, IC, OC, N, false, true, IC, OC, IC, 1.0f, CUDA_R_16BF};
            LtGemm b = g;
            b.bgrad = bgrad;
            auto fallback = [&] {
                launch_bias_grad(db_a, (const bf16*)gd, N, OC, part, nullptr);
                lt.matmul(g, nullptr);
            };
            auto fused = [&] {
                ok &= lt.run(b, nullptr);
                add_into<<<ceil_div(OC, 256), 256>>>(db_b, bgrad, OC);
            };
            fallback();
            fused();
            ok &= validate("dbias", to_host(db_b, OC), to_host(db_a, OC), 1e-2);
            std::printf("GEMM + launch_bias_grad %.4f ms, GEMM with BGRADB + add %.4f ms (accumulating)\n",
                        bench_ms(fallback), bench_ms(fused));
        }
        lt.destroy();
    }
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
