// Matmuls through cuBLASLt (forward with the bias and GELU in the epilogue, backward dinp, and
// dweight with the bias gradient in the epilogue), and the kernels that stand in where cuBLASLt
// takes no epilogue: GELU forward/backward (16-byte accesses) and a deterministic bias-gradient
// column sum.
#pragma once
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>

#include "llmc/core/tensor.h"
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

// 16-byte accesses: common.cuh's Pack / load_pack / store_pack (the emulator aborts on a
// misaligned pack, as a device faults)
__host__ __device__ __forceinline__ bool aligned16(const void* p) { return (uintptr_t)p % 16 == 0; }

// y[i] = f(y[i], x[i]) (ReadY) or f(x[i]) for i < n, grid-stride: 16 bytes at a time when both
// pointers are 16-byte aligned, element by element otherwise and for the tail. Each element is
// computed alike either way (same bits), for any launch geometry; elementwise_blocks gives enough
// blocks of 256 threads for one pack each.
template <bool ReadY, class T, class F>
__device__ __forceinline__ T apply_elementwise(F f, T y, T x) {
    if constexpr (ReadY) return f(y, x);
    else return f(x);
}
template <bool ReadY, class T, class F>
__device__ __forceinline__ void map_elementwise(T* y, const T* x, long long n, F f) {
    constexpr int V = pack_max<T>;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (aligned16(y) && aligned16(x)) {
        const long long packs = n / V;
        for (long long p = first; p < packs; p += stride) {
            const Pack<T, V> a = load_pack<V>(x + p * V);
            Pack<T, V> b = a;  // (overwritten, or read from y)
            if constexpr (ReadY) b = load_pack<V>(y + p * V);
            for (int j = 0; j < V; j++) b.v[j] = apply_elementwise<ReadY>(f, b.v[j], a.v[j]);
            store_pack<V>(y + p * V, b);
        }
        done = packs * V;
    }
    for (long long i = done + first; i < n; i += stride)
        y[i] = apply_elementwise<ReadY>(f, ReadY ? y[i] : x[i], x[i]);
}
inline int elementwise_blocks(long long n, int bytes_per_element) {
    const long long threads = (n * bytes_per_element + 15) / 16;  // one 16-byte pack each
    return (int)std::max<long long>(1, std::min<long long>((threads + 255) / 256, 1ll << 20));
}

// out[i] = gelu_tanh(inp[i])
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, long long n) {
    map_elementwise<false>(out, inp, n, [](T x) { return from_f32<T>(gelu_tanh(to_f32(x))); });
}
// dout[i] *= gelu'(pre[i]) in place
template <class T>
__global__ void gelu_backward_inplace_kernel(T* dout, const T* pre, long long n) {
    map_elementwise<true>(dout, pre, n, [](T d, T x) { return from_f32<T>(to_f32(d) * gelu_tanh_grad(to_f32(x))); });
}

// ---- bias gradient: dbias[c] += sum_n dout[n, c], deterministic, no atomics ----
// CudaOps's and CudaFp8's (faster than cuBLASLt's BGRADB epilogue on an H200: see matmul_backward).
// Two passes over chunks of kBiasRows rows:
// bias_grad_partial_kernel, a block of 32 x 8 threads over 32 * V columns of one chunk (V = 8 bf16
// or 4 fp32 with 16-byte loads when dout is 16-byte aligned and OC a multiple of V, else 1): a warp
// reads 32 * V consecutive elements of a row; thread (x, y) sums rows y, y + 8, ... of the chunk in
// order; the 8 sums of a column are added in y order into partial[chunk][c]. Then
// common.cuh's column_sum_add_kernel adds the chunks' sums in a fixed order into dbias. One chunk (N <=
// kBiasRows): the first pass adds into dbias itself. The order is fixed by N and OC alone.
// With `pre` (launch_gelu_bias_grad), the first pass also does the GELU backward in place, dout =
// dout * gelu'(pre) rounded as gelu_backward_inplace_kernel rounds it, and sums what it stores: the
// same values, one read of dout fewer than the GELU kernel and then the bias gradient.
constexpr int kBiasRows = 256;
template <class T, int V>
__global__ void bias_grad_partial_kernel(float* partial, T* dbias, T* dout, const T* pre, int N, int OC) {
    __shared__ float sums[8][32 * V];
    const int c0 = (blockIdx.x * 32 + threadIdx.x) * V;
    const int r1 = min(N, (int)(blockIdx.y + 1) * kBiasRows);
    float acc[V];
    for (int j = 0; j < V; j++) acc[j] = 0.0f;
    if (c0 < OC)
        for (int r = blockIdx.y * kBiasRows + threadIdx.y; r < r1; r += 8) {
            T* row = dout + (long long)r * OC + c0;
            if constexpr (V > 1) {
                Pack<T, V> x = load_pack<V>(row);
                if (pre) {
                    const Pack<T, V> p = load_pack<V>(pre + (long long)r * OC + c0);
                    for (int j = 0; j < V; j++) x.v[j] = from_f32<T>(to_f32(x.v[j]) * gelu_tanh_grad(to_f32(p.v[j])));
                    store_pack<V>(row, x);
                }
                for (int j = 0; j < V; j++) acc[j] += to_f32(x.v[j]);
            } else {
                T x = row[0];
                if (pre) {
                    x = from_f32<T>(to_f32(x) * gelu_tanh_grad(to_f32(pre[(long long)r * OC + c0])));
                    row[0] = x;
                }
                acc[0] += to_f32(x);
            }
        }
    for (int j = 0; j < V; j++) sums[threadIdx.y][threadIdx.x * V + j] = acc[j];
    __syncthreads();
    for (int col = threadIdx.y * 32 + threadIdx.x; col < 32 * V; col += 256) {
        const int c = blockIdx.x * 32 * V + col;
        if (c >= OC) break;
        float s = 0.0f;
        for (int y = 0; y < 8; y++) s += sums[y][col];
        if (partial) partial[(long long)blockIdx.y * OC + c] = s;
        else dbias[c] = from_f32<T>(to_f32(dbias[c]) + s);
    }
}
// The two passes; `partial` holds bias_grad_partial_floats(N, OC) floats.
inline size_t bias_grad_partial_floats(int N, int OC) {
    const int chunks = ceil_div(N, kBiasRows);
    return chunks > 1 ? (size_t)chunks * OC : 0;
}
// dout *= gelu'(pre) in place (pre may be nullptr: none), then dbias += the column sums of dout
// (dbias may be nullptr: none, and then no partial is needed), in one pass when there are both.
template <class T>
void launch_gelu_bias_grad(T* dbias, T* dout, const T* pre, int N, int OC, float* partial, cudaStream_t stream) {
    if (!dbias) {
        if (pre) {
            const long long n = (long long)N * OC;
            LLMC_LAUNCH(gelu_backward_inplace_kernel<T>, elementwise_blocks(n, sizeof(T)), 256, 0, stream, dout, pre, n);
            CUDA_CHECK_LAUNCH();
        }
        return;
    }
    constexpr int V = pack_max<T>;
    const int chunks = ceil_div(N, kBiasRows);
    LLMC_ASSERT(chunks <= 65535, "bias gradient: more rows than the grid's y dimension covers");
    float* part = chunks > 1 ? partial : nullptr;
    if (aligned16(dout) && (!pre || aligned16(pre)) && OC % V == 0) {
        auto k = bias_grad_partial_kernel<T, V>;
        LLMC_LAUNCH(k, dim3(ceil_div(OC, 32 * V), chunks), dim3(32, 8), 0, stream, part, dbias, dout, pre, N, OC);
    } else {
        auto k = bias_grad_partial_kernel<T, 1>;
        LLMC_LAUNCH(k, dim3(ceil_div(OC, 32), chunks), dim3(32, 8), 0, stream, part, dbias, dout, pre, N, OC);
    }
    CUDA_CHECK_LAUNCH();
    if (part) {
        launch_column_sum_add(stream, dbias, (T*)nullptr, (const float*)part, chunks, OC, 1);
        CUDA_CHECK_LAUNCH();
    }
}
template <class T>
void launch_bias_grad(T* dbias, const T* dout, int N, int OC, float* partial, cudaStream_t stream) {
    launch_gelu_bias_grad(dbias, const_cast<T*>(dout), (const T*)nullptr, N, OC, partial, stream);  // dout only read
}

// out[n, c] += bias[c] (fallback when the bias pointer cannot go to the cuBLASLt epilogue)
template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, long long N, int OC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % OC]));
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
        case CUDA_R_16F: return "fp16";
        case CUDA_R_8F_E4M3: return "e4m3";
        case CUDA_R_8F_E5M2: return "e5m2";
        default: return "?";
    }
}
inline const char* lt_epilogue_text(int e) {
    switch ((cublasLtEpilogue_t)e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "none";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
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
            if (queue_work())
                CUBLAS_CHECK(lt().cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &last_->algo, ws,
                                                 ws_bytes, stream));
            count_launch();
            return true;
        }
        new_ = true;
        LLMC_ASSERT(queue_work(), "a GEMM first seen while a CUDA graph replayed: " + key.text());
        cublasLtMatmulPreference_t pref = lt_preference(ws_bytes, key.align_a, key.align_b, key.align_d);
        cublasLtMatmulHeuristicResult_t res[kCandidates];
        int nres = 0;
        const cublasStatus_t hs =
            lt().cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, kCandidates, res, &nres);
        lt().cublasLtMatmulPreferenceDestroy(pref);
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
                lt().cublasLtMatmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, &res[i].algo, ws, ws_bytes, stream);
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

// One GEMM of LtMatmul: column-major D[m, n] = op(A) op(B) + beta D, A m x k (trans_a false,
// lda >= m) or k x m (trans_a true), B k x n or n x k, then at most one epilogue:
//  - bias only (BIAS): + bias[m], broadcast over n;
//  - gelu_aux (GELU_AUX, or GELU_AUX_BIAS with a bias): aux = the value so far (bias added), m x n
//    with leading dimension aux_ld (a multiple of 8), and D = gelu(aux), cuBLASLt's GELU: the
//    tanh approximation, as gelu_tanh (PyTorch's _addmm_activation(use_gelu) on CUDA is its
//    gelu(approximate="tanh"), XLA fuses only that form into it). The GELU is applied to the fp32
//    value, before aux is rounded to the output type;
//  - dgelu_aux (DGELU): D = the product times gelu_tanh_grad(aux) (aux: the GELU's input, m x n
//    with leading dimension aux_ld, a multiple of 8: GELU_AUX's layout), applied to the fp32
//    value before D's rounding: a GELU's backward in the GEMM of the gradient through it;
//  - bgrad (BGRADB): bgrad[n] = sum over k of op(B)[k, n], written (not added), D unchanged (the
//    backend takes launch_bias_grad instead; dev/cuda/matmul_epilogue v6 times the two).
// type bf16 or fp16: A, B, D, bias, aux, bgrad all of it, fp32 compute; fp32: all fp32, strict (no TF32).
struct LtGemm {
    void* D;
    const void* A;
    const void* B;
    int m, n, k;
    bool trans_a, trans_b;
    int lda, ldb, ldd;
    float beta;
    cudaDataType_t type;  // CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F (lt_type)
    const void* bias = nullptr;
    void* gelu_aux = nullptr;
    const void* dgelu_aux = nullptr;
    int aux_ld = 0;
    void* bgrad = nullptr;
};

// cuBLASLt's type of a model dtype
inline cudaDataType_t lt_type(DType d) {
    switch (d) {
        case DType::F32: return CUDA_R_32F;
        case DType::BF16: return CUDA_R_16BF;
        case DType::F16: return CUDA_R_16F;
        default: LLMC_ASSERT(false, strfmt("cuBLASLt GEMM of %s tensors", dtype_name(d)));
    }
    return CUDA_R_32F;
}

// One handle and one workspace for the fp32/bf16/fp16 matmuls.
class LtMatmul {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;

    void init() {
        CUBLAS_CHECK(lt().cublasLtCreate(&handle_));
        CUDA_CHECK(device_malloc(&workspace_, kWorkspaceBytes));
    }
    void destroy() {
        if (workspace_) device_free(workspace_);
        if (handle_) lt().cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }

    // Runs the GEMM; false when cuBLASLt accepts no algorithm for it (nothing ran): the caller
    // takes another way. The first refusal of a GEMM with an epilogue is noted on stderr.
    bool run(const LtGemm& g, cudaStream_t stream) {
        LLMC_ASSERT(!g.bgrad || (!g.bias && !g.gelu_aux), "LtMatmul: BGRADB with another epilogue");
        LLMC_ASSERT(!g.dgelu_aux || (!g.bias && !g.gelu_aux && !g.bgrad), "LtMatmul: DGELU with another epilogue");
        const void* aux = g.gelu_aux ? g.gelu_aux : g.dgelu_aux;
        const cudaDataType_t dt = g.type;
        LtKey key{};
        key.type_a = key.type_b = key.type_d = dt;
        key.m = g.m, key.n = g.n, key.k = g.k, key.lda = g.lda, key.ldb = g.ldb, key.ldd = g.ldd;
        key.trans_a = g.trans_a, key.trans_b = g.trans_b, key.beta_nonzero = g.beta != 0.0f;
        key.align_a = lt_align_of(g.A), key.align_b = lt_align_of(g.B), key.align_d = lt_align_of(g.D);
        const void* bias_ptr = g.bgrad ? g.bgrad : g.bias;
        cublasLtEpilogue_t epi = g.bgrad                  ? CUBLASLT_EPILOGUE_BGRADB
                                 : g.dgelu_aux          ? CUBLASLT_EPILOGUE_DGELU
                                 : g.gelu_aux && g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                 : g.gelu_aux           ? CUBLASLT_EPILOGUE_GELU_AUX
                                 : g.bias               ? CUBLASLT_EPILOGUE_BIAS
                                                        : CUBLASLT_EPILOGUE_DEFAULT;
        key.epilogue = epi;
        if (bias_ptr) key.type_bias = dt, key.align_bias = lt_align_of(bias_ptr);
        if (aux) key.aux_ld = g.aux_ld, key.align_aux = lt_align_of(aux);

        cublasLtMatmulDesc_t op;
        CUBLAS_CHECK(lt().cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v, size_t n) {
            CUBLAS_CHECK(lt().cublasLtMatmulDescSetAttribute(op, a, v, n));
        };
        cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
        set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
        if (epi != CUBLASLT_EPILOGUE_DEFAULT) set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
        if (bias_ptr) {
            set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof(dt));
            set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr));
        }
        if (aux) {
            const int64_t aux_ld = g.aux_ld;
            set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
            set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
        }
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&la, dt, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&lb, dt, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&ld, dt, g.m, g.n, g.ldd));
        const float alpha = 1.0f;
        const bool ok = algos_.run(key, handle_, op, &alpha, g.A, la, g.B, lb, &g.beta, g.D, ld, g.D, ld, workspace_,
                                   kWorkspaceBytes, stream);
        lt().cublasLtMatrixLayoutDestroy(la);
        lt().cublasLtMatrixLayoutDestroy(lb);
        lt().cublasLtMatrixLayoutDestroy(ld);
        lt().cublasLtMatmulDescDestroy(op);
        if (!ok && algos_.decided_now() && epi != CUBLASLT_EPILOGUE_DEFAULT)
            std::fprintf(stderr, "cuBLASLt: no algorithm for %s (%s): kernels instead of the epilogue\n",
                         key.text().c_str(), algos_.refusals().c_str());
        if (!ok) last_ = key;
        return ok;
    }
    // As run(); no algorithm: UserError naming the GEMM (exit code 2 in the trainer).
    void matmul(const LtGemm& g, cudaStream_t stream) {
        if (!run(g, stream))
            throw UserError(strfmt("cuBLASLt has no runnable algorithm for the GEMM %s (column-major D[m, n] = "
                                   "op(A) op(B), A %s, B %s, C = D; %d candidates tried: %s)",
                                   last_.text().c_str(), g.trans_a ? "k x m" : "m x k", g.trans_b ? "n x k" : "k x n",
                                   algos_.tried(), algos_.refusals().c_str()));
    }

private:
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    LtAlgoCache algos_;
    LtKey last_{};  // the last refused GEMM (for matmul's message)
};
