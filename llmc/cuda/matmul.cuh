// Matmuls through cuBLASLt (forward with bias, backward dinp / dweight), plus the small
// kernels around them: GELU forward/backward and a deterministic bias-gradient column sum.
#pragma once
#include <cstring>
#include <string>
#include <unordered_map>

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
inline std::string lt_status_text(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "cublasStatus_t " + std::to_string((int)s);
    }
}
inline const char* lt_type_text(int t) {
    switch ((cudaDataType_t)t) {
        case CUDA_R_32F: return "fp32";
        case CUDA_R_16BF: return "bf16";
        case CUDA_R_8F_E4M3: return "e4m3";
        case CUDA_R_8F_E5M2: return "e5m2";
        default: return "?";
    }
}
inline const char* lt_epilogue_text(int e) {
    switch ((cublasLtEpilogue_t)e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "none";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        default: return "?";
    }
}

// Largest power of two (<= 256) that divides the address: a preference and a cache-key input.
inline uint32_t lt_align_of(const void* p) {
    const uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a) != 0) a >>= 1;
    return a;
}

// Everything a cuBLASLt call's descriptors and heuristic preference are built from: the key of its
// algorithm in LtAlgoCache. Only 32-bit fields, so no padding: compared and hashed as bytes.
// Start from LtKey{} (what a call does not use stays 0).
struct LtKey {
    int32_t type_a, type_b, type_d, type_bias;  // cudaDataType_t; type_bias: the bias's or its gradient's
    int32_t m, n, k, lda, ldb, ldd, aux_ld;
    int32_t trans_a, trans_b, beta_nonzero, fast_accum, epilogue;  // epilogue: cublasLtEpilogue_t
    uint32_t align_a, align_b, align_d, align_bias, align_aux;     // lt_align_of, bytes
    bool operator==(const LtKey& o) const { return std::memcmp(this, &o, sizeof o) == 0; }
    std::string text() const {
        return strfmt("%s x %s -> %s, m=%d n=%d k=%d, transA=%d transB=%d, lda=%d ldb=%d ldd=%d, beta=%d%s, "
                      "epilogue %s%s, align A/B/D/bias/aux %u/%u/%u/%u/%u",
                      lt_type_text(type_a), lt_type_text(type_b), lt_type_text(type_d), m, n, k, trans_a, trans_b,
                      lda, ldb, ldd, beta_nonzero, fast_accum ? ", fast accumulation" : "", lt_epilogue_text(epilogue),
                      aux_ld ? strfmt(" (aux ld %d)", aux_ld).c_str() : "", align_a, align_b, align_d, align_bias,
                      align_aux);
    }
};
static_assert(sizeof(LtKey) == 21 * 4, "LtKey must have no padding (it is hashed and compared as bytes)");
struct LtKeyHash {
    size_t operator()(const LtKey& k) const {  // FNV-1a over the bytes
        const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
        return (size_t)h;
    }
};

// Algorithm choice for every cuBLASLt call (bf16/fp32 here, fp8 in fp8.cuh). The heuristic's
// first answer is not always runnable: on an H200 it returned an fp8 algorithm (tile 64x8,
// cluster 1x4x1) that cublasLtMatmul then refused with CUBLAS_STATUS_NOT_SUPPORTED. So at a
// problem's first use up to kCandidates answers are asked for and tried in the heuristic's
// order; the first that cublasLtMatmul accepts runs (that is the real call, nothing runs twice)
// and is cached under the problem's LtKey. The same problem then always runs the same algorithm
// (cuBLASLt is bitwise reproducible per algorithm; split-K reductions of every scheme have a
// fixed order). When none is accepted, each refusal's status is kept for the caller's message.
class LtAlgoCache {
public:
    static constexpr int kCandidates = 16;

    // Runs D = alpha op(A) op(B) + beta C with the algorithm cached for `key`, or chooses it.
    // false when no candidate was accepted (nothing ran; remembered too): the caller names the
    // GEMM (with refusals()) or takes another way.
    bool run(const LtKey& key, cublasLtHandle_t h, cublasLtMatmulDesc_t op, const float* alpha, const void* A,
             cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const float* beta, const void* C,
             cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld, void* ws, size_t ws_bytes,
             cudaStream_t stream) {
        auto it = cache_.find(key);
        if (it != cache_.end()) {  // decided once: a refusal now is a broken invariant
            last_ = &it->second;
            new_ = false;
            if (!last_->ok) return false;
            CUBLAS_CHECK(cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &last_->algo, ws, ws_bytes,
                                        stream));
            count_launch();
            return true;
        }
        new_ = true;
        cublasLtMatmulPreference_t pref = lt_preference(ws_bytes, key.align_a, key.align_b, key.align_d);
        cublasLtMatmulHeuristicResult_t res[kCandidates];
        int nres = 0;
        const cublasStatus_t hs =
            cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, kCandidates, res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        Entry e{false, {}, 0, ""};
        if (hs != CUBLAS_STATUS_SUCCESS) {  // NOT_SUPPORTED: no algorithm for the problem
            nres = 0;
            e.refusals = "the heuristic answered " + lt_status_text(hs);
        } else {
            e.refusals = strfmt("the heuristic offered %d", nres);
        }
        for (int i = 0; i < nres; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) {
                e.refusals += strfmt("; #%d not offered (%s)", i + 1, lt_status_text(res[i].state).c_str());
                continue;
            }
            e.tried++;
            const cublasStatus_t st =
                cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &res[i].algo, ws, ws_bytes, stream);
            if (st == CUBLAS_STATUS_SUCCESS) {
                count_launch();
                e.ok = true;
                e.algo = res[i].algo;
                if (e.tried > 1)  // once per problem: shows on a GPU where the first answer was refused
                    std::fprintf(stderr, "cuBLASLt: %s runs heuristic candidate %d (%s)\n", key.text().c_str(), i + 1,
                                 e.refusals.c_str());
                e.refusals.clear();
                last_ = &cache_.emplace(key, std::move(e)).first->second;
                return true;
            }
            e.refusals += strfmt("; #%d refused by cublasLtMatmul: %s", i + 1, lt_status_text(st).c_str());
            // a refusal (checked on the host, before any launch) moves on; anything else is fatal
            if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE &&
                st != CUBLAS_STATUS_ARCH_MISMATCH)
                CUBLAS_CHECK(st);
        }
        last_ = &cache_.emplace(key, std::move(e)).first->second;  // refused: later calls do not ask again
        return false;
    }
    // The last run()'s problem, when it was first seen: candidates tried, and (when none was
    // accepted) the heuristic's answer and each candidate's status; whether that was this run.
    int tried() const { return last_ ? last_->tried : 0; }
    const std::string& refusals() const { return last_ ? last_->refusals : empty_; }
    bool decided_now() const { return new_; }

private:
    struct Entry {
        bool ok;
        cublasLtMatmulAlgo_t algo;
        int tried;
        std::string refusals;
    };
    std::unordered_map<LtKey, Entry, LtKeyHash> cache_;  // node-based: last_ stays valid
    const Entry* last_ = nullptr;
    bool new_ = false;
    const std::string empty_;
};

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
        LtKey key{};
        key.type_a = key.type_b = key.type_d = dt;
        key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
        key.trans_a = transA, key.trans_b = transB, key.beta_nonzero = beta != 0.0f;
        key.align_a = lt_align_of(A), key.align_b = lt_align_of(B), key.align_d = lt_align_of(D);
        key.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        if (bias) key.type_bias = dt, key.align_bias = lt_align_of(bias);

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
                                   kWorkspaceBytes, stream);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        if (!ok)
            throw UserError(strfmt("cuBLASLt has no runnable algorithm for the GEMM %s (column-major D[m, n] = "
                                   "op(A) op(B), A %s, B %s, C = D; %d candidates tried: %s)",
                                   key.text().c_str(), transA ? "k x m" : "m x k", transB ? "n x k" : "k x n",
                                   algos_.tried(), algos_.refusals().c_str()));
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
