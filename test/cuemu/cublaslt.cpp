// cuemu's cuBLASLt: a column-major reference GEMM D = act(alpha * scaleA * scaleB * op(A) op(B)
// + beta * C + bias) (fp64 accumulation, then the output type's rounding), behind the heuristic
// and matmul calls of cuBLASLt. Epilogues as cuBLASLt documents them (cublasLt.h,
// cublasLtEpilogue_t): BIAS, RELU(_BIAS), GELU(_BIAS) with the tanh-approximation GELU applied to
// the fp32 value; GELU_AUX(_BIAS) also write that value before the GELU (bias added) to the aux
// matrix (EPILOGUE_AUX_POINTER, leading dimension EPILOGUE_AUX_LD, the D type); DGELU multiplies
// the fp32 value by the tanh-approximation GELU's derivative at the aux matrix's element (read
// from the same place in the same layout: the GELU's input); BGRADB writes
// bias[j] = sum over k of op(B)[k, j] (fp64 sum, then the bias type: D's) to BIAS_POINTER and
// leaves D as without it (not scaled by alpha: the trainer passes alpha = 1). Before computing,
// both calls refuse what the cuBLASLt documentation lists as unsupported, with the status cuBLASLt
// gives and a line on stderr (CUEMU_LT_QUIET=1 silences it), so that a combination the GPU
// refuses fails here too:
//  - compute type 32F with scale type 32F only; layouts whose shapes disagree with op(A), op(B);
//  - element types: all fp32, or bf16 (fp16) A/B with bf16 (fp16) or fp32 C/D; A/B scale pointers only with fp8;
//  - fp8: the trainer's own table of the documented rules, fp8_gemm_supported (llmc/cuda/fp8_rules.h:
//    TN layout, the A/B and C/D type table, bias types, 16-byte alignment, in place, AMAX_D), so the
//    stand-in and the trainer cannot disagree;
//  - an epilogue that takes a bias (or writes its gradient) without BIAS_POINTER; GELU_AUX(_BIAS)
//    or DGELU without EPILOGUE_AUX_POINTER, or with EPILOGUE_AUX_LD below the rows of D or not a multiple
//    of 8, or an aux type other than D's; the aux and bias-gradient epilogues with fp8 (not
//    modelled here);
//  - with CUEMU_LT_REFUSE_EPILOGUES=1 (a test's knob), the aux and bias-gradient epilogues, as a
//    GPU whose cuBLASLt offers no algorithm for them would: the trainer's kernels take over;
//  - every pointer aligned to its element; an algorithm from the heuristic runs only on pointers
//    at least as aligned as the preference's MIN_ALIGNMENT_*_BYTES it was chosen for, and on bias
//    and aux pointers at least as aligned as those the heuristic saw (it takes their alignment
//    from the descriptor's pointers).
// Not modelled: which shapes a real GPU's algorithms cover (cuBLASLt's internals), tensor-core
// rounding, split-K order.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/precision/bf16.h"
#include "llmc/precision/fp16.h"
#include "llmc/cuda/fp8_rules.h"
#include "llmc/precision/fp8.h"
#include "test/cuemu/include/cublasLt.h"

namespace cuemu {
void enqueue(std::function<void()> f);  // test/cuemu/cuemu.h: run now, or record into a capture
}

struct cuemuLtContext {
    int unused;
};
struct cuemuLtMatmulDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    cudaDataType_t bias_type = CUDA_R_32F;
    bool bias_type_set = false;
    const float *a_scale = nullptr, *b_scale = nullptr, *c_scale = nullptr, *d_scale = nullptr;
    float* amax_d = nullptr;
    int8_t fast_accum = 0;  // accepted; the reference GEMM accumulates in fp32 either way
    void* aux = nullptr;
    int64_t aux_ld = 0;
    cudaDataType_t aux_type = CUDA_R_32F;
    bool aux_type_set = false;
};
struct cuemuLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cuemuLtPreference {
    size_t workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

size_t elem_size(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16F:
        case CUDA_R_16BF: return 2;
        case CUDA_R_8F_E4M3:
        case CUDA_R_8F_E5M2: return 1;
        default: return 0;
    }
}
bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
const char* type_name(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return "fp32";
        case CUDA_R_16F: return "fp16";
        case CUDA_R_16BF: return "bf16";
        case CUDA_R_8F_E4M3: return "e4m3";
        case CUDA_R_8F_E5M2: return "e5m2";
        default: return "?";
    }
}
cublasStatus_t refuse(cublasStatus_t st, const std::string& why) {
    const char* q = std::getenv("CUEMU_LT_QUIET");
    if (!q || std::string(q) != "1") std::fprintf(stderr, "cuemu cuBLASLt: refused: %s\n", why.c_str());
    return st;
}
std::string dims(const cuemuLtLayout* l) {
    return std::to_string(l->rows) + "x" + std::to_string(l->cols) + " ld " + std::to_string(l->ld);
}

// what an epilogue reads or writes
bool adds_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool applies_gelu(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool writes_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool uses_aux(cublasLtEpilogue_t e) { return writes_aux(e) || e == CUBLASLT_EPILOGUE_DGELU; }  // (DGELU reads it)

// A call as llmc/cuda/fp8_rules.h judges it (the emulated device is sm_90).
LtFp8Call fp8_call(const cuemuLtMatmulDesc* op, const cuemuLtLayout* a, const cuemuLtLayout* b, const cuemuLtLayout* c,
                   const cuemuLtLayout* d, uintptr_t pa, uintptr_t pb, uintptr_t pc, uintptr_t pd) {
    LtFp8Call g;
    g.sm = 90;
    g.compute_32f = op->compute == CUBLAS_COMPUTE_32F;
    g.scale_32f = op->scale == CUDA_R_32F;
    g.a = lt_type_from_cuda(a->type), g.b = lt_type_from_cuda(b->type);
    g.c = lt_type_from_cuda(c->type), g.d = lt_type_from_cuda(d->type);
    g.has_bias = op->bias != nullptr;
    if (g.has_bias) g.bias = op->bias_type_set ? lt_type_from_cuda(op->bias_type) : (g.c == LtType::F16 ? LtType::F16 : LtType::BF16);
    g.trans_a = op->ta == CUBLAS_OP_T, g.trans_b = op->tb == CUBLAS_OP_T;
    g.m = (int64_t)d->rows, g.n = (int64_t)d->cols, g.k = (int64_t)(g.trans_a ? a->rows : a->cols);
    g.lda = a->ld, g.ldb = b->ld, g.ldc = c->ld, g.ldd = d->ld;
    g.ptr_a = pa, g.ptr_b = pb, g.ptr_c = pc, g.ptr_d = pd;
    g.amax_d = op->amax_d != nullptr;
    g.ptr_a_scale = (uintptr_t)op->a_scale, g.ptr_b_scale = (uintptr_t)op->b_scale;
    return g;
}

// The rules that do not depend on the data pointers.
cublasStatus_t check_problem(const cuemuLtMatmulDesc* op, const cuemuLtLayout* a, const cuemuLtLayout* b,
                             const cuemuLtLayout* c, const cuemuLtLayout* d) {
    if (op->compute != CUBLAS_COMPUTE_32F && op->compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
        op->compute != CUBLAS_COMPUTE_32F_FAST_16BF)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "compute type other than 32F");
    if (op->scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "scale type other than fp32");
    if (op->ta == CUBLAS_OP_C || op->tb == CUBLAS_OP_C) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "OP_C on real types");
    const uint64_t m = d->rows, n = d->cols, k = op->ta == CUBLAS_OP_T ? a->rows : a->cols;
    const uint64_t am = op->ta == CUBLAS_OP_T ? a->cols : a->rows;
    const uint64_t bk = op->tb == CUBLAS_OP_T ? b->cols : b->rows, bn = op->tb == CUBLAS_OP_T ? b->rows : b->cols;
    if (am != m || bk != k || bn != n || c->rows != m || c->cols != n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "layouts disagree: A " + dims(a) + ", B " + dims(b) + ", C " +
                                                       dims(c) + ", D " + dims(d));
    for (const cuemuLtLayout* l : {a, b, c, d})
        if (l->ld < (int64_t)std::max<uint64_t>(1, l->rows) || !elem_size(l->type))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "leading dimension below the rows, or unknown type: " + dims(l));
    const cudaDataType_t ta = a->type, tb = b->type, tc = c->type, td = d->type;
    std::string combo = std::string(type_name(ta)) + " x " + type_name(tb) + " -> C " + type_name(tc) + ", D " +
                        type_name(td);
    if (is_fp8(ta) || is_fp8(tb)) {
        // the documented fp8 rules, the trainer's own table (llmc/cuda/fp8_rules.h); here without the
        // data pointers (distinct and aligned stand-ins), which cublasLtMatmul judges again
        std::string why;
        if (!fp8_gemm_supported(fp8_call(op, a, b, c, d, 0, 0, 0, 16), &why))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, why + ": " + combo);
    } else {
        const bool ok = (ta == CUDA_R_32F && tb == CUDA_R_32F && tc == CUDA_R_32F && td == CUDA_R_32F) ||
                        (ta == CUDA_R_16BF && tb == CUDA_R_16BF && tc == td && (tc == CUDA_R_16BF || tc == CUDA_R_32F)) ||
                        (ta == CUDA_R_16F && tb == CUDA_R_16F && tc == td && (tc == CUDA_R_16F || tc == CUDA_R_32F));
        if (!ok) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "type combination: " + combo);
        if (op->a_scale || op->b_scale)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A/B scale pointers need fp8 A/B: " + combo);
        if (op->bias && op->bias_type_set && op->bias_type != td)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("bias type ") + type_name(op->bias_type) + " with D " +
                                                           type_name(td));
    }
    const cublasLtEpilogue_t e = op->epilogue;
    if ((adds_bias(e) || e == CUBLASLT_EPILOGUE_BGRADB) && !op->bias)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "bias or bias-gradient epilogue without a bias pointer");
    if ((uses_aux(e) || e == CUBLASLT_EPILOGUE_BGRADB) && (is_fp8(ta) || is_fp8(tb)))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "aux or bias-gradient epilogue with fp8 (not emulated): " + combo);
    const char* knob = std::getenv("CUEMU_LT_REFUSE_EPILOGUES");
    if ((uses_aux(e) || e == CUBLASLT_EPILOGUE_BGRADB) && knob && std::string(knob) == "1")
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "aux or bias-gradient epilogue (CUEMU_LT_REFUSE_EPILOGUES=1)");
    if (uses_aux(e)) {
        if (!op->aux) return refuse(CUBLAS_STATUS_INVALID_VALUE, "GELU aux epilogue without EPILOGUE_AUX_POINTER");
        if (op->aux_ld < (int64_t)m || op->aux_ld % 8 != 0)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_LD " + std::to_string(op->aux_ld) +
                                                           ": must be a multiple of 8 and at least the " +
                                                           std::to_string(m) + " rows of D");
        if (op->aux_type_set && op->aux_type != td)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("aux type ") + type_name(op->aux_type) +
                                                           " with D " + type_name(td));
    }
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t align_of(const void* p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && u % a) a >>= 1;
    return a;
}

double load(const void* p, cudaDataType_t t, size_t i) {
    switch (t) {
        case CUDA_R_32F: return ((const float*)p)[i];
        case CUDA_R_16BF: return bf16_bits_to_f32(((const uint16_t*)p)[i]);
        case CUDA_R_16F: return f16_bits_to_f32(((const uint16_t*)p)[i]);
        case CUDA_R_8F_E4M3: return fp8_decode(((const uint8_t*)p)[i], Fp8Format::E4M3);
        case CUDA_R_8F_E5M2: return fp8_decode(((const uint8_t*)p)[i], Fp8Format::E5M2);
        default: std::fprintf(stderr, "cuemu cuBLASLt: type %s not emulated\n", type_name(t)); std::abort();
    }
}
void store(void* p, cudaDataType_t t, size_t i, float v) {
    switch (t) {
        case CUDA_R_32F: ((float*)p)[i] = v; return;
        case CUDA_R_16BF: ((uint16_t*)p)[i] = f32_to_bf16_bits(v); return;
        case CUDA_R_16F: ((uint16_t*)p)[i] = f32_to_f16_bits(v); return;
        case CUDA_R_8F_E4M3: ((uint8_t*)p)[i] = fp8_encode(v, Fp8Format::E4M3); return;
        case CUDA_R_8F_E5M2: ((uint8_t*)p)[i] = fp8_encode(v, Fp8Format::E5M2); return;
        default: std::fprintf(stderr, "cuemu cuBLASLt: type %s not emulated\n", type_name(t)); std::abort();
    }
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { return *h = new cuemuLtContext{}, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return delete h, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    *d = new cuemuLtMatmulDesc{};
    (*d)->compute = compute, (*d)->scale = scale;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return delete d, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf,
                                              size_t n) {
    auto get = [&](auto& field) {
        if (n != sizeof(field)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "descriptor attribute of the wrong size");
        std::memcpy(&field, buf, n);
        return CUBLAS_STATUS_SUCCESS;
    };
    switch (a) {
        case CUBLASLT_MATMUL_DESC_TRANSA: return get(d->ta);
        case CUBLASLT_MATMUL_DESC_TRANSB: return get(d->tb);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: {
            cublasStatus_t st = get(d->epilogue);
            switch (d->epilogue) {
                case CUBLASLT_EPILOGUE_DEFAULT:
                case CUBLASLT_EPILOGUE_RELU:
                case CUBLASLT_EPILOGUE_BIAS:
                case CUBLASLT_EPILOGUE_RELU_BIAS:
                case CUBLASLT_EPILOGUE_GELU:
                case CUBLASLT_EPILOGUE_GELU_BIAS:
                case CUBLASLT_EPILOGUE_GELU_AUX:
                case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
                case CUBLASLT_EPILOGUE_DGELU:
                case CUBLASLT_EPILOGUE_BGRADB: return st;
            }
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue not emulated");
        }
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get(d->bias);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: d->bias_type_set = true; return get(d->bias_type);
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return get(d->a_scale);
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return get(d->b_scale);
        case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return get(d->c_scale);
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return get(d->d_scale);
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return get(d->amax_d);
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return get(d->fast_accum);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return get(d->aux);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return get(d->aux_ld);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: d->aux_type_set = true; return get(d->aux_type);
    }
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "unknown descriptor attribute");
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    *l = new cuemuLtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return delete l, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    return *p = new cuemuLtPreference{}, CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { return delete p, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t n) {
    auto u32 = [&](uint32_t& f) {
        if (n != 4) return refuse(CUBLAS_STATUS_INVALID_VALUE, "preference attribute of the wrong size");
        std::memcpy(&f, buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    };
    uint32_t ignored = 0;
    switch (a) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
            if (n != 8) return refuse(CUBLAS_STATUS_INVALID_VALUE, "workspace preference of the wrong size");
            std::memcpy(&p->workspace, buf, 8);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return u32(ignored);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return u32(p->align[0]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return u32(p->align[1]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return u32(p->align[2]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return u32(p->align[3]);
    }
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "unknown preference attribute");
}

// The algorithm remembers the alignments it was chosen for (cuBLASLt's kernels assume them):
// data[0..3] A, B, C, D from the preference, data[4] the bias's, data[5] the aux's (from the
// descriptor's pointers).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
    *returned = 0;
    if (requested < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "heuristic asked for no result");
    const cublasStatus_t st = check_problem(op, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    std::memset(&results[0], 0, sizeof(results[0]));
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = pref ? pref->align[i] : 256;
    results[0].algo.data[4] = op->bias ? align_of(op->bias) : 1;
    results[0].algo.data[5] = op->aux ? align_of(op->aux) : 1;
    results[0].algo.data[7] = 0xC0E3u;  // marks an algorithm of this emulator
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// dst[r k + p] = the element (r, p) of a matrix of `rows` rows of k stored at src[p + r ld]
// (pcontig) or src[r + p ld], read in the order it lies in memory (64 rows at a time where r is
// the contiguous index), each element as load() decodes it
template <class Get>
static void decode_as(double* dst, Get get, long long rows, long long k, bool pcontig, size_t ld) {
    if (pcontig) {
#pragma omp parallel for schedule(static)
        for (long long r = 0; r < rows; r++)
            for (long long p = 0; p < k; p++) dst[r * k + p] = get((size_t)p + (size_t)r * ld);
    } else {
        constexpr long long R = 64;
#pragma omp parallel for schedule(static)
        for (long long r0 = 0; r0 < rows; r0 += R) {
            const long long r1 = std::min(rows, r0 + R);
            for (long long p = 0; p < k; p++)
                for (long long r = r0; r < r1; r++) dst[r * k + p] = get((size_t)r + (size_t)p * ld);
        }
    }
}
static void decode(double* dst, const void* src, cudaDataType_t t, long long rows, long long k, bool pcontig,
                   size_t ld) {
    switch (t) {  // the common types without load()'s switch per element
        case CUDA_R_32F:
            return decode_as(dst, [src](size_t i) { return (double)((const float*)src)[i]; }, rows, k, pcontig, ld);
        case CUDA_R_16BF:
            return decode_as(dst, [src](size_t i) { return (double)bf16_bits_to_f32(((const uint16_t*)src)[i]); },
                             rows, k, pcontig, ld);
        default: return decode_as(dst, [src, t](size_t i) { return load(src, t, i); }, rows, k, pcontig, ld);
    }
}

// out[ii][jj] = the dot product of rows i0 + ii of ra and j0 + jj of rb (k each): four partial
// sums side by side, of p = 0, 4, 8, ..., of 1, 5, 9, ..., (the products are exact in double; the
// sum's order is not modelled: a GPU's differs anyway), the tail of k into the first, then
// (s0 + s1) + (s2 + s3). A tile of I x J at once reads each row once for the tile.
typedef double v4d __attribute__((vector_size(32)));
template <int I, int J>
static void dots(const double* ra, const double* rb, long long k, long long i0, long long j0, double (&out)[I][J]) {
    v4d acc[I][J] = {};
    long long p = 0;
    for (; p + 4 <= k; p += 4) {
        v4d x[I], y[J];
#pragma GCC unroll 4
        for (int ii = 0; ii < I; ii++) std::memcpy(&x[ii], ra + (i0 + ii) * k + p, sizeof(v4d));
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) std::memcpy(&y[jj], rb + (j0 + jj) * k + p, sizeof(v4d));
#pragma GCC unroll 4
        for (int ii = 0; ii < I; ii++)
#pragma GCC unroll 4
            for (int jj = 0; jj < J; jj++) acc[ii][jj] += x[ii] * y[jj];
    }
    for (int ii = 0; ii < I; ii++)
        for (int jj = 0; jj < J; jj++) {
            const double *x = ra + (i0 + ii) * k, *y = rb + (j0 + jj) * k;
            double s0 = acc[ii][jj][0];
            for (long long r = p; r < k; r++) s0 += x[r] * y[r];
            out[ii][jj] = (s0 + acc[ii][jj][1]) + (acc[ii][jj][2] + acc[ii][jj][3]);
        }
}

// D = alpha op(A) op(B) (+ beta C, epilogue) of a checked call: run by cublasLtMatmul, or when the
// graph that captured the call runs (the descriptors as they were at the call; alpha and beta are
// host values, read at the call as cuBLASLt reads them; the scale pointers are read when it runs)
static void lt_compute(const cuemuLtMatmulDesc& op, const cuemuLtLayout& a, const cuemuLtLayout& b,
                       const cuemuLtLayout& c, const cuemuLtLayout& d, float alpha, float beta, const void* A,
                       const void* B, const void* C, void* D) {
    const double ab = (double)alpha * (op.a_scale ? *op.a_scale : 1.0f) * (op.b_scale ? *op.b_scale : 1.0f);
    const long long m = (long long)d.rows, n = (long long)d.cols;
    const long long k = op.ta == CUBLAS_OP_T ? (long long)a.rows : (long long)a.cols;
    const bool ta = op.ta == CUBLAS_OP_T, tb = op.tb == CUBLAS_OP_T;
    const cudaDataType_t bias_t = op.bias_type_set ? op.bias_type : d.type;
    const float dscale = op.d_scale ? *op.d_scale : 1.0f;
    const bool with_bias = adds_bias(op.epilogue), aux = writes_aux(op.epilogue);
    // op(A) as m rows of k, op(B) as n rows of k, decoded once
    std::unique_ptr<double[]> ra(new double[(size_t)m * k]), rb(new double[(size_t)n * k]);  // (every one written)
    decode(ra.get(), A, a.type, m, k, ta, (size_t)a.ld);
    decode(rb.get(), B, b.type, n, k, !tb, (size_t)b.ld);
    // C may alias D (in place): each element is read before it is written, by the same iteration.
    // Tiles of 2 x 4 elements (dots)
    auto finish = [&](long long i, long long j, double s) {
        float v = (float)(ab * s);
        if (beta != 0.0f) v += beta * (float)load(C, c.type, (size_t)(i + j * c.ld));
        if (with_bias) v += (float)load(op.bias, bias_t, (size_t)i);
        if (aux) store(op.aux, d.type, (size_t)(i + j * op.aux_ld), v);
        if (applies_gelu(op.epilogue))
            v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        else if (op.epilogue == CUBLASLT_EPILOGUE_DGELU) {
            const float x = (float)load(op.aux, d.type, (size_t)(i + j * op.aux_ld));
            const float th = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
            v *= 0.5f * (1.0f + th) +
                 0.5f * x * (1.0f - th * th) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
        }
        else if (op.epilogue == CUBLASLT_EPILOGUE_RELU || op.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS)
            v = v > 0.0f ? v : 0.0f;
        store(D, d.type, (size_t)(i + j * d.ld), is_fp8(d.type) ? v * dscale : v);
    };
#pragma omp parallel for schedule(static)
    for (long long i0 = 0; i0 < m; i0 += 2)
        for (long long j0 = 0; j0 < n; j0 += 4) {
            if (i0 + 2 <= m && j0 + 4 <= n) {
                double o[2][4];
                dots<2, 4>(ra.get(), rb.get(), k, i0, j0, o);
                for (int ii = 0; ii < 2; ii++)
                    for (int jj = 0; jj < 4; jj++) finish(i0 + ii, j0 + jj, o[ii][jj]);
            } else {
                for (long long i = i0; i < std::min(m, i0 + 2); i++)
                    for (long long j = j0; j < std::min(n, j0 + 4); j++) {
                        double o[1][1];
                        dots<1, 1>(ra.get(), rb.get(), k, i, j, o);
                        finish(i, j, o[0][0]);
                    }
            }
        }
    if (op.epilogue == CUBLASLT_EPILOGUE_BGRADB)  // the bias gradient: op(B)'s column sums over k
        for (long long j = 0; j < n; j++) {
            double s = 0.0;
            for (long long p = 0; p < k; p++) s += rb[j * k + p];
            store(const_cast<void*>(op.bias), bias_t, (size_t)j, (float)s);
        }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta_p,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
    const cublasStatus_t st = check_problem(op, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (algo && algo->data[7] != 0xC0E3u) return refuse(CUBLAS_STATUS_INVALID_VALUE, "algorithm not from the heuristic");
    const void* ptr[4] = {A, B, C, D};
    const cuemuLtLayout* lay[4] = {a, b, c, d};
    const char* nm = "ABCD";
    const bool fp8 = is_fp8(a->type);
    for (int i = 0; i < 4; i++) {
        const uint32_t al = align_of(ptr[i]);
        if (!ptr[i]) return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("null ") + nm[i]);
        if (al < elem_size(lay[i]->type))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(1, nm[i]) + " not aligned to its element");
        if (algo && al < algo->data[i])
            return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(1, nm[i]) + " is " + std::to_string(al) +
                                                           "-byte aligned, the algorithm was chosen for " +
                                                           std::to_string(algo->data[i]));
    }
    if (fp8) {  // the fp8 rules again, with the data pointers (alignment, in place)
        std::string why;
        if (!fp8_gemm_supported(fp8_call(op, a, b, c, d, (uintptr_t)A, (uintptr_t)B, (uintptr_t)C, (uintptr_t)D), &why))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, why);
    }
    if (op->bias && align_of(op->bias) < elem_size(op->bias_type_set ? op->bias_type : d->type))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "bias not aligned to its element");
    if (uses_aux(op->epilogue) && align_of(op->aux) < elem_size(d->type))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "aux not aligned to its element");
    if (algo && op->bias && align_of(op->bias) < algo->data[4])
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "the bias is " + std::to_string(align_of(op->bias)) +
                                                       "-byte aligned, the algorithm was chosen for " +
                                                       std::to_string(algo->data[4]));
    if (algo && uses_aux(op->epilogue) && align_of(op->aux) < algo->data[5])
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "the aux is " + std::to_string(align_of(op->aux)) +
                                                       "-byte aligned, the algorithm was chosen for " +
                                                       std::to_string(algo->data[5]));
    const float alpha = *(const float*)alpha_p, beta = *(const float*)beta_p;
    const cuemuLtMatmulDesc o = *op;
    const cuemuLtLayout la = *a, lb = *b, lc = *c, ld = *d;
    cuemu::enqueue([=] { lt_compute(o, la, lb, lc, ld, alpha, beta, A, B, C, D); });
    return CUBLAS_STATUS_SUCCESS;
}
