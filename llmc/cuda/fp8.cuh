// FP8 linear layers on CUDA (Ops::matmul_forward_fp8 / matmul_backward_fp8, llmc/backend/ops.h):
//  - scale_kernel: the cast's scale s and 1/s in device memory (from the host's delayed scale,
//    or from the tensor's amax for the current recipe: no host round trip);
//  - amax_kernel: the current recipe's amax pass;
//  - cast_kernel: fp32/bf16 -> e4m3/e5m2 (cvt with satfinite: round to nearest even, saturate),
//    fused with the amax of the unscaled tensor, writing the plain and/or the transposed copy;
//  - Fp8Gemm: cuBLASLt fp8 GEMM, fp32 accumulation, A/B scale pointers = 1/s.
// The fp8 tensor cores (compute capability >= 8.9) take only the "TN" form: in cuBLASLt's
// column-major terms A is transposed and B is not, both with the reduction dimension k
// contiguous. Every GEMM below is arranged so (the backward GEMMs read transposed casts).
//
// Amaxes are max-accumulated with atomicMax on the float bits of |x| (fp8_abs_bits order:
// non-negative floats order as unsigned integers, NaN > inf > finite): exact in any order.
#pragma once
#include <cuda_fp8.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "llmc/core/common.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/precision/fp8.h"
#include "llmc/core/tensor.h"

namespace fp8 {

__device__ __forceinline__ __nv_fp8_storage_t cvt(float x, Fp8Format f) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// *amax_bits = max(*amax_bits, max over x of fp8_abs_bits). Grid-stride; one atomic per warp.
template <class T>
__global__ void amax_kernel(unsigned* amax_bits, const T* x, long long n) {
    unsigned m = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        m = max(m, fp8_abs_bits(to_f32(x[i])));
    m = warp_max_u32(m);
    if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, m);
}

// One thread: sc[0] = s, sc[1] = 1/s, with s = the host's scale (amax_bits == nullptr) or
// fp8_scale_from_amax(*amax_bits, ...) (current recipe; the same function as the CPU's, so the
// same bits). `record` (the op's amax output, may be nullptr) max-accumulates *amax_bits.
__global__ void scale_kernel(float* sc, const unsigned* amax_bits, float host_scale, Fp8Format f, int margin,
                             unsigned* record) {
    float s = host_scale;
    if (amax_bits) {
        s = fp8_scale_from_amax(__uint_as_float(*amax_bits), f, margin, host_scale);
        if (record) atomicMax(record, *amax_bits);
    }
    sc[0] = s;
    sc[1] = 1.0f / s;
}

// x [rows, cols] row-major -> codes of x * sc[0]: out [rows, cols] and/or outT [cols, rows]
// (either may be nullptr); amax_bits (may be nullptr) max-accumulates |x|. Block (32, 8)
// handles a 32 x 32 tile; the transposed copy goes through shared memory so that both the
// reads and the writes are row-contiguous.
template <class T>
__global__ void cast_kernel(__nv_fp8_storage_t* out, __nv_fp8_storage_t* outT, unsigned* amax_bits, const T* x,
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
            const __nv_fp8_storage_t q = cvt(v * s, f);
            if (out) out[(long long)r * cols + c] = q;
            tile[i][threadIdx.x] = q;
        }
    }
    if (outT) {  // uniform over the block: the barrier is safe
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8) {
            const int c = c0 + i, r = r0 + threadIdx.x;
            if (c < cols && r < rows) outT[(long long)c * rows + r] = tile[threadIdx.x][i];
        }
    }
    if (amax_bits) {
        m = warp_max_u32(m);
        if (threadIdx.x == 0) atomicMax(amax_bits, m);
    }
}

// cuBLASLt fp8 GEMM. Column-major D[m, n] (ldd = m) = a_scale * b_scale * A^T B (+ bias[m])
// (+ beta * D), with A stored k x m (lda = k) and B stored k x n (ldb = k), fp8 (not both
// E5M2); D and bias bf16 or fp32 (fp32 D takes no bias here). As LtMatmul: the algorithm is
// cached per problem, and every split-K scheme is allowed (all deterministic: lt_preference).
class Fp8Gemm {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;

    void destroy() {
        if (workspace_) cudaFree(workspace_);
        if (handle_) cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }

    // false when cuBLASLt has no algorithm for the problem (nothing was run)
    bool matmul(void* D, bool d_bf16, const void* bias, const void* A, Fp8Format fa, const float* a_scale,
                const void* B, Fp8Format fb, const float* b_scale, int m, int n, int k, float beta,
                cudaStream_t stream) {
        if (!handle_) {  // created on first use: runs without fp8 pay nothing
            CUBLAS_CHECK(cublasLtCreate(&handle_));
            CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
        }
        const cudaDataType_t ta = lt_type(fa), tb = lt_type(fb), td = d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        Key key{m, n, k, (int)fa, (int)fb, (int)d_bf16, beta != 0.0f, bias != nullptr, align_of(A), align_of(B),
                align_of(D), bias ? align_of(bias) : 256};

        cublasLtMatmulDesc_t op;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                    sizeof(a_scale)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                    sizeof(b_scale)));
        if (bias) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = CUDA_R_16BF;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        }
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, ta, k, m, k));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, tb, k, n, k));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, td, m, n, m));

        auto it = cache_.find(key);
        if (it == cache_.end()) {
            cublasLtMatmulHeuristicResult_t res;
            int nres = 0;
            cublasLtMatmulPreference_t pref = lt_preference(kWorkspaceBytes, key.alA, key.alB, key.alD);
            // an unsupported combination is an error status here, not a crash: the caller decides
            const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, op, la, lb, ld, ld, pref, 1, &res, &nres);
            cublasLtMatmulPreferenceDestroy(pref);
            const bool found = st == CUBLAS_STATUS_SUCCESS && nres > 0 && res.state == CUBLAS_STATUS_SUCCESS;
            if (found) it = cache_.emplace(key, res.algo).first;
        }
        const bool found = it != cache_.end();
        if (found) {
            const float alpha = 1.0f;
            CUBLAS_CHECK(cublasLtMatmul(handle_, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &it->second,
                                        workspace_, kWorkspaceBytes, stream));
        }
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        return found;
    }

private:
    static cudaDataType_t lt_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
    static int align_of(const void* p) {
        const uintptr_t u = (uintptr_t)p;
        int a = 256;
        while (a > 1 && (u % a) != 0) a >>= 1;
        return a;
    }
    struct Key {
        int m, n, k, fa, fb, bf, beta, bias, alA, alB, alD, alBias;
        bool operator<(const Key& o) const {
            return std::tie(m, n, k, fa, fb, bf, beta, bias, alA, alB, alD, alBias) <
                   std::tie(o.m, o.n, o.k, o.fa, o.fb, o.bf, o.beta, o.bias, o.alA, o.alB, o.alD, o.alBias);
        }
    };
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::map<Key, cublasLtMatmulAlgo_t> cache_;
};

// The fp8 ops of CudaOps: the casts into grow-only scratch, the GEMMs, and GELU/bias around
// them (the kernels of matmul.cuh). All on the backend's stream.
class CudaFp8 {
public:
    CudaFp8() = default;
    CudaFp8(const CudaFp8&) = delete;
    CudaFp8& operator=(const CudaFp8&) = delete;
    ~CudaFp8() {  // after the owner's stream is gone: cudaFree waits for the device
        for (GrowBuffer& b : buf_) b.release();
        if (small_) cudaFree(small_);
        gemm_.destroy();
    }

    // Compute capability >= 8.9 (the first with fp8 tensor cores). Asked once per device.
    bool supported(int device, std::string* why) {
        if (device != queried_device_) {
            cudaDeviceProp prop;
            CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
            supported_ = prop.major * 10 + prop.minor >= 89;
            why_ = supported_ ? "" : strfmt("fp8 matmuls need a GPU of compute capability 8.9 or newer (Ada, Hopper); "
                                            "%s is %d.%d", prop.name, prop.major, prop.minor);
            queried_device_ = device;
        }
        if (why) *why = why_;
        return supported_;
    }

    void forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC, bool gelu,
                 const Fp8Cast& ci, const Fp8Cast& cw, int device, cudaStream_t stream) {
        check(device, N, IC, OC, {&out, &pre_gelu, &inp, &w, &bias}, "matmul_forward_fp8");
        LLMC_ASSERT(!gelu || pre_gelu.ptr, "matmul_forward_fp8: gelu needs pre_gelu");
        if (!N || !OC) return;
        const bool bf = out.dtype == DType::BF16;
        auto* qi = (__nv_fp8_storage_t*)buf(0, (size_t)N * IC, stream);
        auto* qw = (__nv_fp8_storage_t*)buf(1, (size_t)OC * IC, stream);
        const float* si = cast(ci, inp, N, IC, qi, nullptr, 0, stream);
        const float* sw = cast(cw, w, OC, IC, qw, nullptr, 1, stream);
        void* dst = gelu ? pre_gelu.ptr : out.ptr;
        // column-major dst^T[OC, N] = w (IC x OC, transposed) x inp^T (IC x N): TN with k = IC
        const bool epi = bf && bias.ptr && ((uintptr_t)bias.ptr % 16 == 0);
        bool ok = gemm_.matmul(dst, bf, epi ? bias.ptr : nullptr, qw, cw.format, sw + 1, qi, ci.format, si + 1, OC, N,
                               IC, 0.0f, stream);
        const bool bias_kernel = bias.ptr && (!epi || !ok);
        if (!ok && epi)  // no fp8 algorithm with the bias epilogue: plain GEMM, bias below
            ok = gemm_.matmul(dst, bf, nullptr, qw, cw.format, sw + 1, qi, ci.format, si + 1, OC, N, IC, 0.0f, stream);
        if (!ok) no_algorithm("matmul_forward_fp8", OC, N, IC);
        const long long n = (long long)N * OC;
        const int blocks = (int)((n + 255) / 256);
        with_type(out.dtype, [&](auto tag) {
            using T = decltype(tag);
            if (bias_kernel) {
                LLMC_LAUNCH(add_bias_kernel<T>, blocks, 256, 0, stream, (T*)dst, (const T*)bias.ptr, N, OC);
                CUDA_CHECK_LAUNCH();
            }
            if (gelu) {
                LLMC_LAUNCH(gelu_forward_kernel<T>, blocks, 256, 0, stream, (T*)out.ptr, (const T*)pre_gelu.ptr, n);
                CUDA_CHECK_LAUNCH();
            }
        });
    }

    void backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu, int N,
                  int IC, int OC, const Fp8Cast& cd, const Fp8Cast& ci, const Fp8Cast& cw, int device,
                  cudaStream_t stream) {
        check(device, N, IC, OC, {&dinp, &dw, &dbias, &dout, &inp, &w, &pre_gelu}, "matmul_backward_fp8");
        if (!N || !OC) return;
        const bool bf = dout.dtype == DType::BF16;
        const long long n = (long long)N * OC;
        with_type(dout.dtype, [&](auto tag) {
            using T = decltype(tag);
            if (pre_gelu.ptr) {
                LLMC_LAUNCH(gelu_backward_inplace_kernel<T>, (int)((n + 255) / 256), 256, 0, stream, (T*)dout.ptr,
                            (const T*)pre_gelu.ptr, n);
                CUDA_CHECK_LAUNCH();
            }
            if (dbias.ptr) {
                LLMC_LAUNCH(bias_backward_kernel<T>, ceil_div(OC, 32), dim3(32, 32), 0, stream, (T*)dbias.ptr,
                            (const T*)dout.ptr, N, OC);
                CUDA_CHECK_LAUNCH();
            }
        });
        auto* qiT = (__nv_fp8_storage_t*)buf(0, (size_t)N * IC, stream);
        auto* qwT = (__nv_fp8_storage_t*)buf(1, (size_t)OC * IC, stream);
        auto* qd = (__nv_fp8_storage_t*)buf(2, (size_t)N * OC, stream);
        auto* qdT = (__nv_fp8_storage_t*)buf(3, (size_t)N * OC, stream);
        const float* sd = cast(cd, dout, N, OC, dinp.ptr ? qd : nullptr, qdT, 2, stream);
        const float* si = cast(ci, inp, N, IC, nullptr, qiT, 0, stream);
        if (dinp.ptr) {
            const float* sw = cast(cw, w, OC, IC, nullptr, qwT, 1, stream);
            // column-major dinp^T[IC, N] = w^T stored [IC][OC] (k = OC) x dout^T (OC x N)
            if (!gemm_.matmul(dinp.ptr, bf, nullptr, qwT, cw.format, sw + 1, qd, cd.format, sd + 1, IC, N, OC, 0.0f,
                              stream))
                no_algorithm("matmul_backward_fp8 (dinp)", IC, N, OC);
        }
        // column-major dw (IC x OC) += inp^T stored [IC][N] (k = N) x dout stored [OC][N]
        if (!gemm_.matmul(dw.ptr, bf, nullptr, qiT, ci.format, si + 1, qdT, cd.format, sd + 1, IC, OC, N, 1.0f, stream))
            no_algorithm("matmul_backward_fp8 (dw)", IC, OC, N);
    }

private:
    template <class F>
    static void with_type(DType dt, F&& f) {
        if (dt == DType::BF16)
            f(bf16{});
        else
            f(float{});
    }

    // Shapes and dtypes the fp8 GEMM takes; UserError otherwise (the trainer checks at start-up).
    void check(int device, int N, int IC, int OC, std::initializer_list<const Tensor*> ts, const char* op) {
        std::string why;
        if (!supported(device, &why)) throw UserError(std::string("precision fp8: ") + why);
        if (N % 16 || IC % 16 || OC % 16)
            throw UserError(strfmt("precision fp8 on CUDA: %s needs dimensions that are multiples of 16 "
                                   "(rows N = micro_batch * seq_len = %d, in = %d, out = %d)",
                                   op, N, IC, OC));
        DType d = DType::F32;
        bool first = true;
        for (const Tensor* t : ts) {
            if (!t->ptr) continue;
            LLMC_ASSERT(t->dtype == DType::F32 || t->dtype == DType::BF16, "fp8 ops: tensors must be fp32 or bf16");
            LLMC_ASSERT(first || t->dtype == d, "fp8 ops: tensors of one op must share the dtype");
            d = t->dtype;
            first = false;
        }
    }
    [[noreturn]] static void no_algorithm(const char* op, int m, int n, int k) {
        throw UserError(strfmt("precision fp8: cuBLASLt has no fp8 GEMM for %s (m=%d n=%d k=%d) on this GPU", op,
                               m, n, k));
    }

    // Casts x [rows, cols] into out and/or outT with cast c; `slot` (0..2) owns the scale pair
    // and amax scratch. Returns the device pointer to {s, 1/s}.
    const float* cast(const Fp8Cast& c, Tensor x, int rows, int cols, __nv_fp8_storage_t* out,
                      __nv_fp8_storage_t* outT, int slot, cudaStream_t stream) {
        LLMC_ASSERT(x.n >= (size_t)rows * cols && x.ptr, "fp8 cast: tensor too small");
        if (!small_) CUDA_CHECK(cudaMalloc(&small_, 64));
        float* sc = static_cast<float*>(small_) + 2 * slot;            // floats 0..5
        unsigned* amax = static_cast<unsigned*>(small_) + 8 + slot;  // words 8..10
        unsigned* record = reinterpret_cast<unsigned*>(c.amax);
        LLMC_ASSERT(c.scale > 0.0f && fp8_is_finite(c.scale), strfmt("fp8: scale must be finite and positive, got %g",
                                                                      c.scale));
        const long long n = (long long)rows * cols;
        with_type(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            const T* xp = (const T*)x.ptr;
            if (c.current) {
                CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
                const int blocks = (int)std::min<long long>(1024, (n + 255) / 256);
                LLMC_LAUNCH(amax_kernel<T>, std::max(1, blocks), 256, 0, stream, amax, xp, n);
                CUDA_CHECK_LAUNCH();
            }
            LLMC_LAUNCH(scale_kernel, 1, 1, 0, stream, sc, c.current ? amax : nullptr, c.scale, c.format, c.margin,
                        record);
            CUDA_CHECK_LAUNCH();
            const dim3 grid(ceil_div(cols, 32), ceil_div(rows, 32));
            LLMC_LAUNCH(cast_kernel<T>, grid, dim3(32, 8), 0, stream, out, outT, c.current ? nullptr : record, xp, sc,
                        rows, cols, c.format);
            CUDA_CHECK_LAUNCH();
        });
        return sc;
    }

    // grow-only scratch, one per slot: 0 inp casts, 1 weight casts, 2/3 dout casts
    void* buf(int slot, size_t bytes, cudaStream_t stream) { return buf_[slot].get(bytes, stream); }

    Fp8Gemm gemm_;
    GrowBuffer buf_[4];
    void* small_ = nullptr;
    int queried_device_ = -1;
    bool supported_ = false;
    std::string why_;
};

}  // namespace fp8
