// Matmuls through cuBLASLt (forward with bias, backward dinp / dweight), plus the small
// kernels around them: GELU forward/backward and a deterministic bias-gradient column sum.
#pragma once
#include <map>
#include <string>

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
// Algorithm choice for every cuBLASLt call (bf16/fp32 here, fp8 in fp8.cuh). The heuristic's
// first answer is not always runnable: on an H200 it returned an fp8 algorithm (tile 64x8,
// cluster 1x4x1) that cublasLtMatmul then refused with CUBLAS_STATUS_NOT_SUPPORTED. So at a
// problem's first use up to kCandidates answers are asked for and tried in the heuristic's
// order; the first that cublasLtMatmul accepts runs (that is the real call, nothing runs twice)
// and is cached under a key that holds everything the descriptors and the preference were
// built from. The same problem then always runs the same algorithm (cuBLASLt is bitwise
// reproducible per algorithm; split-K reductions of every scheme have a fixed order).
class LtAlgoCache {
public:
    static constexpr int kCandidates = 16;

    // Runs D = alpha op(A) op(B) + beta C with the algorithm cached for `key`, or chooses it.
    // false when no candidate was accepted (nothing ran; remembered too): the caller names the
    // GEMM or takes another way.
    bool run(const std::string& key, cublasLtHandle_t h, cublasLtMatmulDesc_t op, const float* alpha, const void* A,
             cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const float* beta, const void* C,
             cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld, void* ws, size_t ws_bytes,
             uint32_t align_a, uint32_t align_b, uint32_t align_cd, cudaStream_t stream) {
        auto it = cache_.find(key);
        if (it != cache_.end()) {  // decided once: a refusal now is a broken invariant
            tried_ = it->second.tried;
            if (!it->second.ok) return false;
            CUBLAS_CHECK(cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &it->second.algo, ws,
                                        ws_bytes, stream));
            count_launch();
            return true;
        }
        cublasLtMatmulPreference_t pref = lt_preference(ws_bytes, align_a, align_b, align_cd);
        cublasLtMatmulHeuristicResult_t res[kCandidates];
        int nres = 0;
        const cublasStatus_t hs =
            cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, kCandidates, res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (hs != CUBLAS_STATUS_SUCCESS) nres = 0;  // NOT_SUPPORTED: no algorithm for the problem
        tried_ = 0;
        for (int i = 0; i < nres; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            tried_++;
            const cublasStatus_t st =
                cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &res[i].algo, ws, ws_bytes, stream);
            if (st == CUBLAS_STATUS_SUCCESS) {
                count_launch();
                cache_.emplace(key, Entry{true, res[i].algo, tried_});
                if (tried_ > 1)  // once per problem: shows on a GPU where the first answer was refused
                    std::fprintf(stderr, "cuBLASLt: %s runs heuristic candidate %d (the %d before it refused)\n",
                                 key.c_str(), tried_, tried_ - 1);
                return true;
            }
            // a refusal (checked on the host, before any launch) moves on; anything else is fatal
            if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE &&
                st != CUBLAS_STATUS_ARCH_MISMATCH)
                CUBLAS_CHECK(st);
        }
        cache_.emplace(key, Entry{false, {}, tried_});  // refused: later calls do not ask again
        return false;
    }
    // candidates tried when the last run()'s problem was first seen (for the no-algorithm message)
    int tried() const { return tried_; }

private:
    struct Entry {
        bool ok;
        cublasLtMatmulAlgo_t algo;
        int tried;
    };
    std::map<std::string, Entry> cache_;
    int tried_ = 0;
};

// Largest power of two (<= 256) that divides the address: a preference and a cache-key input.
inline uint32_t lt_align_of(const void* p) {
    const uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a) != 0) a >>= 1;
    return a;
}

// One handle and one workspace for the bf16/fp32 matmuls. The caller passes a bias pointer only
// when it is 16-byte aligned (else it adds the bias with its own kernel).
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
    // No runnable algorithm: UserError naming the GEMM (exit code 2 in the trainer).
    void matmul(void* D, const void* A, const void* B, const void* bias, int m, int n, int k, bool transA,
                bool transB, int lda, int ldb, int ldd, float beta, bool is_bf16, cudaStream_t stream) {
        const cudaDataType_t dt = is_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        const uint32_t alA = lt_align_of(A), alB = lt_align_of(B), alD = lt_align_of(D);
        const std::string key =
            strfmt("%s m=%d n=%d k=%d transA=%d transB=%d lda=%d ldb=%d ldd=%d beta=%d bias=%d align=%u/%u/%u/%u",
                   is_bf16 ? "bf16" : "fp32", m, n, k, (int)transA, (int)transB, lda, ldb, ldd, beta != 0.0f,
                   bias != nullptr, alA, alB, alD, bias ? lt_align_of(bias) : 0u);

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
        const float alpha = 1.0f;
        const bool ok = algos_.run(key, handle_, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, workspace_,
                                   kWorkspaceBytes, alA, alB, alD, stream);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        if (!ok)
            throw UserError(strfmt("cuBLASLt has no runnable algorithm for the GEMM %s (column-major D[m, n] = "
                                   "op(A) op(B), A %s, B %s, C = D; %d candidates refused)",
                                   key.c_str(), transA ? "k x m" : "m x k", transB ? "n x k" : "k x n",
                                   algos_.tried()));
    }

private:
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    LtAlgoCache algos_;
};

// out[n, c] += bias[c] (fallback when the bias pointer cannot go to the cuBLASLt epilogue)
template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, long long N, int OC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % OC]));
}
