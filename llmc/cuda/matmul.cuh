// Matmuls through cuBLASLt (forward with bias, backward dinp / dweight), plus the small
// kernels around them: GELU forward/backward and a deterministic bias-gradient column sum.
#pragma once
#include <map>
#include <tuple>

#include "llmc/cuda/common.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

__device__ __forceinline__ float gelu_tanh(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(gelu_tanh(to_f32(inp[i])));
}
// dout[i] *= gelu'(pre[i]) in place
template <class T>
__global__ void gelu_backward_inplace_kernel(T* dout, const T* pre, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dout[i] = from_f32<T>(to_f32(dout[i]) * gelu_tanh_grad(to_f32(pre[i])));
}

// dbias[c] += sum_n dout[n, c]. Block = 32 x 32 threads covering 32 columns; thread (x, y)
// sums rows y, y+32, ... of column x in order, then the 32 partial sums of a column are
// added in y order. Deterministic, no atomics.
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

// ---- cuBLASLt ----
// One handle and one workspace; the chosen algorithm is cached per problem so that the
// same problem always runs the same algorithm (cuBLASLt is then bitwise reproducible).
// Split-K reductions of every scheme have a fixed order (lt_preference). The caller passes a bias pointer only when it
// is 16-byte aligned (else it adds the bias with its own kernel).
class LtMatmul {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;

    void init() {
        CUBLAS_CHECK(cublasLtCreate(&handle_));
        CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    }
    void destroy() {
        if (workspace_) cudaFree(workspace_);
        if (handle_) cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }

    // Column-major D[m, n] = alpha * op(A) op(B) + beta * D (+ bias[m] broadcast over n).
    // A is m x k (transA=false, lda >= m) or k x m (transA=true); B is k x n or n x k.
    // bf16: all of A, B, D, bias are bf16 with fp32 compute; fp32: strict fp32 (no TF32).
    void matmul(void* D, const void* A, const void* B, const void* bias, int m, int n, int k, bool transA,
                bool transB, int lda, int ldb, int ldd, float beta, bool is_bf16, cudaStream_t stream) {
        const cudaDataType_t dt = is_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        auto align_of = [](const void* p) -> int {
            uintptr_t u = (uintptr_t)p;
            int a = 256;
            while (a > 1 && (u % a) != 0) a >>= 1;
            return a;
        };
        Key key{m, n, k, (int)transA, (int)transB, lda, ldb, ldd, beta != 0.0f, (int)is_bf16, bias != nullptr,
                align_of(A), align_of(B), align_of(D), bias ? align_of(bias) : 256};

        cublasLtMatmulDesc_t op;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = transA ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        if (bias) {
            cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof(dt)));
            CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        }
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, dt, transA ? k : m, transA ? m : k, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, dt, transB ? n : k, transB ? k : n, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));

        auto it = cache_.find(key);
        if (it == cache_.end()) {
            cublasLtMatmulPreference_t pref = lt_preference(kWorkspaceBytes, key.alA, key.alB, key.alD);
            cublasLtMatmulHeuristicResult_t res;
            int nres = 0;
            CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, op, la, lb, ld, ld, pref, 1, &res, &nres));
            cublasLtMatmulPreferenceDestroy(pref);
            if (nres == 0 || res.state != CUBLAS_STATUS_SUCCESS) {
                std::fprintf(stderr,
                             "cuBLASLt: no algorithm for m=%d n=%d k=%d transA=%d transB=%d lda=%d ldb=%d ldd=%d "
                             "bf16=%d bias=%d\n",
                             m, n, k, (int)transA, (int)transB, lda, ldb, ldd, (int)is_bf16, bias != nullptr);
                std::abort();
            }
            it = cache_.emplace(key, res.algo).first;
        }
        const float alpha = 1.0f;
        CUBLAS_CHECK((LLMC_LAUNCH cublasLtMatmul(handle_, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &it->second, workspace_,
                                    kWorkspaceBytes, stream)));
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
    }

private:
    struct Key {
        int m, n, k, ta, tb, lda, ldb, ldd, beta, bf, bias, alA, alB, alD, alBias;
        bool operator<(const Key& o) const {
            return std::tie(m, n, k, ta, tb, lda, ldb, ldd, beta, bf, bias, alA, alB, alD, alBias) <
                   std::tie(o.m, o.n, o.k, o.ta, o.tb, o.lda, o.ldb, o.ldd, o.beta, o.bf, o.bias, o.alA, o.alB, o.alD,
                            o.alBias);
        }
    };
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::map<Key, cublasLtMatmulAlgo_t> cache_;
};

// out[n, c] += bias[c] (fallback when the bias pointer cannot go to the cuBLASLt epilogue)
template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, long long N, int OC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % OC]));
}
