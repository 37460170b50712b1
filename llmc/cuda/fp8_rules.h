// The FP8 GEMM combinations cuBLASLt documents as supported (cublasLtMatmul, "FP8" requirements
// and type table), as one function, so that the trainer's fp8 GEMMs and the CUDA emulator's
// cuBLASLt stand-in (test/cuemu) judge a call by the same rules: a layout that the library
// refuses on Hopper must also fail in CI. Plain C++ (no CUDA headers): the stand-in maps its
// cudaDataType_t values with lt_type_from_cuda below.
//
// Sources: the cuBLAS documentation of cublasLtMatmul (its FP8 requirements and FP8 type
// table: not reachable from the machine this was written on, so written from the documented
// rules as recalled; re-read the current page when cuBLASLt changes), the comments of
// cublasLt.h (CUBLASLT_MATMUL_DESC_*_SCALE_POINTER, AMAX_D_POINTER, FAST_ACCUM), NVIDIA's forum
// answer quoting the TN requirement, cuBLAS's word (relayed in PyTorch #122821) that amax of D
// is unsupported for non-fp8 outputs. Where a rule is uncertain it is written the stricter way
// (m, n, k multiples of 16): the stand-in may refuse a call that the library would take,
// never the other way round.
#pragma once
#include <cstdint>
#include <string>

enum class LtType { F32, F16, BF16, E4M3, E5M2, Other };

// cudaDataType_t values (library_types.h: CUDA_R_32F 0, CUDA_R_16F 2, CUDA_R_16BF 14,
// CUDA_R_8F_E4M3 28, CUDA_R_8F_E5M2 29), so that this header needs no CUDA include
inline LtType lt_type_from_cuda(int cuda_data_type) {
    switch (cuda_data_type) {
        case 0: return LtType::F32;
        case 2: return LtType::F16;
        case 14: return LtType::BF16;
        case 28: return LtType::E4M3;
        case 29: return LtType::E5M2;
        default: return LtType::Other;
    }
}
inline const char* lt_type_name(LtType t) {
    switch (t) {
        case LtType::F32: return "R_32F";
        case LtType::F16: return "R_16F";
        case LtType::BF16: return "R_16BF";
        case LtType::E4M3: return "R_8F_E4M3";
        case LtType::E5M2: return "R_8F_E5M2";
        default: return "other";
    }
}
inline bool lt_is_fp8(LtType t) { return t == LtType::E4M3 || t == LtType::E5M2; }
inline int lt_type_bytes(LtType t) {
    return t == LtType::F32 ? 4 : (t == LtType::F16 || t == LtType::BF16) ? 2 : 1;
}

// One cublasLtMatmul call as the rules see it (column-major, cuBLASLt's own terms: A is
// rows x cols = (trans_a ? k x m : m x k), B = (trans_b ? n x k : k x n), C and D m x n).
struct LtFp8Call {
    int sm = 90;                      // compute capability, major * 10 + minor
    bool compute_32f = true;          // CUBLAS_COMPUTE_32F
    bool scale_32f = true;            // scale type CUDA_R_32F
    LtType a = LtType::E4M3, b = LtType::E4M3, c = LtType::F32, d = LtType::F32;
    bool has_bias = false;
    LtType bias = LtType::BF16;       // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, when has_bias
    bool trans_a = true, trans_b = false;
    int64_t m = 0, n = 0, k = 0;
    int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
    uintptr_t ptr_a = 0, ptr_b = 0, ptr_c = 0, ptr_d = 0;  // addresses, for their alignment
    uintptr_t ptr_a_scale = 0, ptr_b_scale = 0;            // A/B scale pointers (0: unset)
    bool amax_d = false;              // CUBLASLT_MATMUL_DESC_AMAX_D_POINTER set
};

// true when the documented rules allow the call; else false and *why (may be nullptr) names
// the first rule broken. The rules:
//  1. FP8 tensor cores: compute capability 8.9 or newer.
//  2. compute type CUBLAS_COMPUTE_32F, scale type CUDA_R_32F (the A/B/C/D scale pointers are
//     fp32 scalars in device memory; unset means 1).
//  3. "TN": A transposed, B not, on 8.9, 9.x and 12.x (Blackwell 10.x/11.x take any layout).
//  4. A and B each E4M3 or E5M2, not both E5M2.
//  5. C/D types: C 16BF -> D 16BF or fp8; C 16F -> D 16F or fp8; C 32F -> D 32F. An fp8 D is
//     E4M3, or E5M2 when an input is E5M2. (So C == D in one buffer is possible only for a
//     16-bit or 32F D, and an fp8 D always needs a separate 16-bit C.)
//  6. bias: 16F with a 16F C, else 16BF (also with a 32F D).
//  7. alignment: A, B, C, D addresses 16-byte aligned; every leading dimension a multiple of
//     16 bytes; m, n, k multiples of 16 (stricter than the 16-byte rule for k where needed).
//  8. leading dimensions cover the rows (lda >= rows of A, ...).
//  9. in place (C and D the same address): C's layout equals D's (type and ldc == ldd).
// 10. AMAX_D_POINTER only with an fp8 D.
// 11. the A and B scale pointers 16-byte aligned. NOT from NVIDIA's list: seen on an H200
//     (cuBLASLt 13.1, 2026-11-27, dev/cuda/fp8_gemm): with the scale pointers 4 bytes off 16,
//     cublasLtMatmul refuses every candidate the heuristic (which sees no pointers) offers, at
//     every shape tried; 16-byte aligned, the same GEMMs run (dev/bench/RESULTS.md).
// CUBLASLT_MATMUL_DESC_FAST_ACCUM (int8_t) is allowed with every combination above.
inline bool fp8_gemm_supported(const LtFp8Call& g, std::string* why) {
    auto fail = [&](const std::string& w) {
        if (why) *why = w;
        return false;
    };
    if (g.sm < 89) return fail("fp8 GEMMs need compute capability 8.9 or newer");
    if (!g.compute_32f || !g.scale_32f) return fail("fp8 GEMMs need compute type 32F and scale type R_32F");
    const bool any_layout = g.sm >= 100 && g.sm < 120;
    if (!any_layout && !(g.trans_a && !g.trans_b)) return fail("fp8 GEMMs need the TN layout (A transposed, B not)");
    if (!lt_is_fp8(g.a) || !lt_is_fp8(g.b)) return fail("fp8 GEMM: A and B must be E4M3 or E5M2");
    if (g.a == LtType::E5M2 && g.b == LtType::E5M2) return fail("fp8 GEMM: A and B cannot both be E5M2");
    const bool has_e5m2 = g.a == LtType::E5M2 || g.b == LtType::E5M2;
    const bool d_fp8_ok = g.d == LtType::E4M3 || (g.d == LtType::E5M2 && has_e5m2);
    bool cd_ok = false;
    if (g.c == LtType::BF16) cd_ok = g.d == LtType::BF16 || d_fp8_ok;
    if (g.c == LtType::F16) cd_ok = g.d == LtType::F16 || d_fp8_ok;
    if (g.c == LtType::F32) cd_ok = g.d == LtType::F32;
    if (!cd_ok)
        return fail(std::string("fp8 GEMM: C ") + lt_type_name(g.c) + " with D " + lt_type_name(g.d) +
                    " is not a supported combination");
    if (g.has_bias && g.bias != (g.c == LtType::F16 ? LtType::F16 : LtType::BF16))
        return fail(std::string("fp8 GEMM: bias type ") + lt_type_name(g.bias) + " is not supported with C " +
                    lt_type_name(g.c));
    if ((g.ptr_a | g.ptr_b | g.ptr_c | g.ptr_d) % 16) return fail("fp8 GEMM: A, B, C, D must be 16-byte aligned");
    if ((g.lda * lt_type_bytes(g.a)) % 16 || (g.ldb * lt_type_bytes(g.b)) % 16 ||
        (g.ldc * lt_type_bytes(g.c)) % 16 || (g.ldd * lt_type_bytes(g.d)) % 16)
        return fail("fp8 GEMM: leading dimensions must be multiples of 16 bytes");
    if (g.m % 16 || g.n % 16 || g.k % 16) return fail("fp8 GEMM: m, n, k must be multiples of 16");
    const int64_t rows_a = g.trans_a ? g.k : g.m, rows_b = g.trans_b ? g.n : g.k;
    if (g.lda < rows_a || g.ldb < rows_b || g.ldc < g.m || g.ldd < g.m)
        return fail("fp8 GEMM: a leading dimension is smaller than its matrix's rows");
    if (g.ptr_c == g.ptr_d && (g.c != g.d || g.ldc != g.ldd))
        return fail("fp8 GEMM: in place (C == D) needs C's type and leading dimension to equal D's");
    if (g.amax_d && !lt_is_fp8(g.d)) return fail("fp8 GEMM: AMAX_D_POINTER needs an fp8 D");
    if ((g.ptr_a_scale | g.ptr_b_scale) % 16) return fail("fp8 GEMM: the A and B scale pointers must be 16-byte aligned");
    return true;
}
