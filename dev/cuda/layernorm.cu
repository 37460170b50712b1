// LayerNorm forward / backward (fp32 statistics).
// ./layernorm <version> [N C]      (make -C dev/cuda layernorm)
//   1: naive forward, one thread per row (baseline), fp32
//   2: forward one warp per row with element loads; backward one block (256) per row at a time,
//      two block reductions (four barriers) per row, dw/db in shared memory (2C floats), then a
//      reduce kernel with one thread per column adding 512 block partials. llmc until issue 29. fp32
//   3: same as 2 in bf16. H200 (ncu, GPT-2 124M B=32 T=1024: N=32768 C=768, 2026-11): forward
//      66 us, backward 224 us + reduce 38 us per call, where moving the tensors once at 4.8 TB/s
//      takes ~21 us (forward) and ~42 us (backward)
//   4: llmc/cuda/layernorm.cuh (issue 29): 16-byte packs (8 bf16 / 4 floats; element by element
//      where C or a pointer does not allow them), packs loaded ahead of the stores; backward one
//      warp per row (shuffles only), each warp's dw/db in its own shared-memory accumulators laid
//      out one bank per lane, warps summed in order into 1024 block partials, then a reduce of
//      32 columns x 16 thread rows per block (fixed order). fp32
//   5: same as 4 in bf16. To measure (v3 beside it, same card):
//        ./dev/cuda/layernorm 3 32768 768 && ./dev/cuda/layernorm 5 32768 768
//      and under ncu: ncu -k regex:layernorm ./dev/cuda/layernorm 5 32768 768
//      Measured since (H200, ncu of the trainer, fourth window, main b24a415): the backward 66 us
//      a call at N=32768 C=768 (124M B=32; ~42 us moves its tensors once) and 90 us at N=8192
//      C=1600 (the 1.5B shape, 4-layer fp8 profile; ~30 us to move them once): 1.6x and 3x the
//      bound. At C=1600 a block holds 2 warps (28 KiB of accumulators: 8 blocks, 224 KiB of shared
//      memory an SM, little L1 left), each lane one pack of dout, inp and w in flight per pass,
//      and the second pass reads dout and inp again.
//   6: the backward keeps the row in registers (the backend's since 2026-11-27, where a row is at
//      most 256 packs: C <= 2048 in bf16; keep_rows = false gives version 5's kernel):
//      each lane loads its w packs once for all its rows, and a row's dout, inp and dinp packs at
//      once (3 x 7 16-byte loads in flight a lane at C=1600 instead of 2-3), then computes: no
//      second read of dout and inp. Same arithmetic in the same order: the same bits as version 5
//      (test_gpu layernorm and rmsnorm check it). Not yet measured (written without a GPU).
#include "dev/cuda/common.h"
#include "llmc/cuda/layernorm.cuh"

__global__ void ln_naive(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* r = x + (size_t)n * C;
    float m = 0, v = 0;
    for (int c = 0; c < C; c++) m += r[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
    float rs = rsqrtf(v / C + 1e-5f);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (r[c] - m) * rs * w[c] + b[c];
    mean[n] = m, rstd[n] = rs;
}

// ---- version 2/3 ----
template <class T>
__global__ void ln_forward_v2(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* bias, int N, int C) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* x = inp + (long long)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += to_f32(x[c]);
    const float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) v += (to_f32(x[c]) - m) * (to_f32(x[c]) - m);
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
    for (int c = lane; c < C; c += 32)
        out[(long long)row * C + c] = from_f32<T>((to_f32(x[c]) - m) * r * to_f32(w[c]) + to_f32(bias[c]));
    if (lane == 0) mean[row] = m, rstd[row] = r;
}
// block g: rows [g*rpb, (g+1)*rpb), the whole block on one row; dynamic smem 2C + 32 floats
// Sum over the block (blockDim.x a multiple of 32); every thread gets it. `scratch`: >= 32 floats of
// shared memory; the first barrier keeps a previous call's readers ahead of this call's writers.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? scratch[lane] : 0.0f);
}

template <class T>
__global__ void ln_backward_v2(T* dinp, float* partial, const T* dout, const T* inp, const T* w, const float* mean,
                               const float* rstd, int N, int C, int rows_per_block) {
    extern __shared__ float smem[];
    float *s_dw = smem, *s_db = smem + C, *scratch = smem + 2 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s_dw[c] = s_db[c] = 0.0f;
    const int r1 = min(N, (int)(blockIdx.x + 1) * rows_per_block);
    for (int row = blockIdx.x * rows_per_block; row < r1; row++) {
        const long long off = (long long)row * C;
        const float m = mean[row], rs = rstd[row];
        float sum_dn = 0.0f, sum_dn_n = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float n = (to_f32(inp[off + c]) - m) * rs, dn = to_f32(w[c]) * to_f32(dout[off + c]);
            sum_dn += dn, sum_dn_n += dn * n;
        }
        const float mean_dn = block_sum(sum_dn, scratch) / (float)C;
        const float mean_dn_n = block_sum(sum_dn_n, scratch) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float n = (to_f32(inp[off + c]) - m) * rs, d = to_f32(dout[off + c]), dn = to_f32(w[c]) * d;
            dinp[off + c] = from_f32<T>(to_f32(dinp[off + c]) + rs * (dn - mean_dn - n * mean_dn_n));
            s_dw[c] += d * n, s_db[c] += d;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        partial[(long long)blockIdx.x * 2 * C + c] = s_dw[c];
        partial[(long long)blockIdx.x * 2 * C + C + c] = s_db[c];
    }
}
template <class T>
__global__ void ln_backward_reduce_v2(T* dw, T* db, const float* partial, int G, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int g = 0; g < G; g++) sw += partial[(long long)g * 2 * C + c], sb += partial[(long long)g * 2 * C + C + c];
    dw[c] = from_f32<T>(to_f32(dw[c]) + sw);
    db[c] = from_f32<T>(to_f32(db[c]) + sb);
}

static bool keep_rows = false;  // launch_norm_backward's (main: the version's)

template <class T>
static bool run_version(bool llmc, int N, int C, const std::vector<float>& x, const std::vector<float>& w,
                        const std::vector<float>& b, const std::vector<float>& dout, double tol) {
    std::vector<float> out((size_t)N * C), mean(N), rstd(N);
    cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    auto dx0 = rand_vec((size_t)N * C, 1.0f, 5), dw0 = rand_vec(C, 1.0f, 6), db0 = rand_vec(C, 1.0f, 7);
    if (std::is_same<T, bf16>::value) round_bf16(dx0), round_bf16(dw0), round_bf16(db0);
    auto dx = dx0, dw = dw0, db = db0;
    cpu::layernorm_backward<float>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    T *gx = to_dev<T>(x), *gw = to_dev<T>(w), *gb = to_dev<T>(b), *go = dev_poisoned<T>((size_t)N * C);
    float *gm = dev_poisoned<float>(N), *gr = dev_poisoned<float>(N);
    std::function<void()> fwd = [=] {
        if (llmc)
            launch_layernorm_forward<T>(0, go, gm, gr, nullptr, gx, nullptr, nullptr, gw, gb, N, C);
        else
            ln_forward_v2<T><<<ceil_div(N, 8), 256>>>(go, gm, gr, gx, gw, gb, N, C);
    };
    fwd();
    bool ok = validate("out", to_host(go, (size_t)N * C), out, tol);
    ok &= validate("mean", to_host(gm, N), mean, 1e-4);
    ok &= validate("rstd", to_host(gr, N), rstd, 1e-4);
    const size_t tensor = (size_t)N * C * sizeof(T);
    float ms = bench_ms(fwd);
    std::printf("forward time %.4f ms, %.1f GB/s (inp read, out written)\n", ms, 2 * tensor / ms * 1e-6);
    // backward: give the GPU the CPU's statistics
    CUDA_CHECK(cudaMemcpy(gm, mean.data(), N * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(gr, rstd.data(), N * 4, cudaMemcpyHostToDevice));
    T *gdo = to_dev<T>(dout), *gdx = to_dev<T>(dx0), *gdw = to_dev<T>(dw0), *gdb = to_dev<T>(db0);
    const int rpb = ceil_div(N, 512), G = ceil_div(N, rpb);
    float* partial = dev_poisoned<float>(std::max((size_t)G * 2 * C, layernorm_backward_partial_floats(N, C)));
    std::function<void()> bwd = [=] {
        if (llmc) {
            launch_norm_backward<T>(0, gdx, gdw, gdb, partial, gdo, gx, gw, gm, gr, N, C, keep_rows);
        } else {
            ln_backward_v2<T><<<G, 256, (2 * C + 32) * 4>>>(gdx, partial, gdo, gx, gw, gm, gr, N, C, rpb);
            ln_backward_reduce_v2<T><<<ceil_div(C, 256), 256>>>(gdw, gdb, partial, G, C);
        }
    };
    bwd();
    ok &= validate("dinp", to_host(gdx, (size_t)N * C), dx, tol);
    ok &= validate("dw", to_host(gdw, C), dw, tol);
    ok &= validate("db", to_host(gdb, C), db, tol);
    ms = bench_ms(bwd);
    std::printf("backward time %.4f ms (accumulating repeatedly), %.1f GB/s (dout, inp, dinp read, dinp written)\n",
                ms, 4 * tensor / ms * 1e-6);
    return ok;
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 5);
    const std::vector<int> d = bench_case("layernorm", argc, argv, 2);
    int N = d[0], C = d[1];
    std::printf("layernorm v%d N=%d C=%d\n", version, N, C);
    keep_rows = version == 6;  // (versions 4 and 5: every row streamed twice)
    auto x = rand_vec((size_t)N * C, 2.0f, 1), w = rand_vec(C, 1.0f, 2), b = rand_vec(C, 1.0f, 3),
         dout = rand_vec((size_t)N * C, 1.0f, 4);
    bool ok = true;
    if (version == 1) {
        std::vector<float> out((size_t)N * C), mean(N), rstd(N);
        cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
        float *gx = to_dev<float>(x), *gw = to_dev<float>(w), *gb = to_dev<float>(b);
        float *go = dev_poisoned<float>((size_t)N * C), *gm = dev_poisoned<float>(N), *gr = dev_poisoned<float>(N);
        auto fwd = [=] { ln_naive<<<ceil_div(N, 128), 128>>>(go, gm, gr, gx, gw, gb, N, C); };
        fwd();
        ok &= validate("out", to_host(go, (size_t)N * C), out, 1e-4);
        std::printf("forward time %.4f ms\n", bench_ms(fwd));
    } else if (version == 2 || version == 4) {
        ok = run_version<float>(version == 4, N, C, x, w, b, dout, 1e-4);
    } else {
        round_bf16(x), round_bf16(w), round_bf16(b), round_bf16(dout);
        ok = run_version<bf16>(version >= 5, N, C, x, w, b, dout, 2e-2);
    }
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
