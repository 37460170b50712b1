// Which fp8 GEMMs cuBLASLt runs on this GPU, and how fast against bf16 (issue 31).
// ./fp8_gemm [m n k]   (default: GPT-2 1.5B's fc at B 8 x T 1024: m = OC 6400, n = N 8192, k = IC 1600)
// Each row is one form of the column-major "TN" GEMM D[m, n] = sa sb A^T B (+ beta C) (+ bias):
// A stored k x m, B stored k x n (the reduction dimension contiguous, as fp8 requires), D m x n.
// The rows vary one thing at a time from the form CudaFp8 asks for (fp8.cuh: D bf16 or fp32,
// C = D in place, A/B scale pointers, fast accumulation in the forward, a bf16 bias epilogue), so
// that a refusal names its cause: the heuristic's answer, the first candidate cublasLtMatmul
// accepts (or each refusal's status), then the result against bf16's on the same values (each
// element a small multiple of 1/8, exact in E4M3, E5M2 and bf16) and the time of the first
// accepted candidate. Run at the test's shape (48 32 64) and at a model's.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "dev/cuda/common.h"

#define LT_OK(x)                                                                         \
    do {                                                                                 \
        cublasStatus_t s_ = (x);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
            std::printf("  cuBLASLt call failed: %s: status %d\n", #x, (int)s_);         \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

struct Form {
    const char* name;
    cudaDataType_t a = CUDA_R_8F_E4M3, b = CUDA_R_8F_E4M3, c = CUDA_R_16BF, d = CUDA_R_16BF;
    bool in_place = true;   // C and D the same pointer (CudaFp8 accumulates that way)
    int scales = 16;        // A/B scale pointers: 0 none, else the byte offset of 1/s in a cudaMalloc'd block
    bool fast = true;       // CUBLASLT_MATMUL_DESC_FAST_ACCUM
    bool bias = false;      // bf16 bias epilogue
    float beta = 0.0f;
    bool prefs = true;      // alignment preferences and every reduction scheme, as lt_preference
    bool trans_a = true;    // false: the "NN" form (refused for fp8 by the documentation)
};

static size_t type_size(cudaDataType_t t) {
    return t == CUDA_R_32F ? 4 : (t == CUDA_R_16BF || t == CUDA_R_16F) ? 2 : 1;
}
// host value -> bits of type t (values are multiples of 1/8 in [-2, 2]: exact in every type here)
static void encode(cudaDataType_t t, const std::vector<float>& v, std::vector<uint8_t>& out) {
    out.assign(v.size() * type_size(t), 0);
    for (size_t i = 0; i < v.size(); i++) {
        if (t == CUDA_R_32F) {
            std::memcpy(&out[i * 4], &v[i], 4);
        } else if (t == CUDA_R_16BF) {
            uint16_t h = f32_to_bf16_bits(v[i]);
            std::memcpy(&out[i * 2], &h, 2);
        } else {
            out[i] = __nv_cvt_float_to_fp8(v[i], __NV_SATFINITE, t == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
        }
    }
}
static float decode(cudaDataType_t t, const uint8_t* p) {
    if (t == CUDA_R_32F) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16_bits_to_f32(h);
}
static void* upload(const std::vector<uint8_t>& h) {
    void* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 256)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
    return d;
}

int main(int argc, char** argv) {
    int m = 6400, n = 8192, k = 1600;
    if (argc > 3) m = std::atoi(argv[1]), n = std::atoi(argv[2]), k = std::atoi(argv[3]);
    int dev = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("fp8_gemm m=%d n=%d k=%d on %s (sm_%d%d), cuBLASLt %zu, CUDA runtime %zu\n", m, n, k, prop.name,
                prop.major, prop.minor, cublasLtGetVersion(), cublasLtGetCudartVersion());

    auto grid = [](size_t count, unsigned seed) {  // multiples of 1/8 in [-2, 2]
        std::vector<float> v = rand_vec(count, 1.0f, seed);
        for (float& x : v) x = std::round(x * 16.0f) / 8.0f;
        return v;
    };
    const std::vector<float> hA = grid((size_t)k * m, 1), hB = grid((size_t)k * n, 2), hbias = grid(m, 3);
    const std::vector<float> hC = grid((size_t)m * n, 4);
    // reference in double on the host for the small shape; else bf16 cuBLASLt (row "bf16")
    const bool host_ref = (double)m * n * k <= 1e8;
    std::vector<double> ref;
    if (host_ref) {
        ref.assign((size_t)m * n, 0.0);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int p = 0; p < k; p++) s += (double)hA[(size_t)i * k + p] * hB[(size_t)j * k + p];
                ref[(size_t)j * m + i] = s;
            }
    }

    cublasLtHandle_t lt;
    LT_OK(cublasLtCreate(&lt));
    const size_t ws_bytes = 32u << 20;
    void* ws;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    float* scale_block;  // ones: 1/s = 1 at every offset tried
    CUDA_CHECK(cudaMalloc(&scale_block, 256));
    {
        std::vector<float> ones(64, 1.0f);
        CUDA_CHECK(cudaMemcpy(scale_block, ones.data(), 256, cudaMemcpyHostToDevice));
    }

    std::vector<Form> forms;
    auto add = [&](Form f) { forms.push_back(f); };
    add({"bf16 (baseline: bf16 A/B/C/D)", CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, true, 0, false});
    add({"fp8 forward as CudaFp8: E4M3 x E4M3 -> bf16, C=D, scales, fast"});
    add({"  ... scale pointers 4 bytes off 16 (before 863fe32)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF,
         CUDA_R_16BF, true, 4});
    add({"  ... no scale pointers", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, true, 0});
    add({"  ... C a separate buffer", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, false});
    add({"  ... without fast accumulation", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, true, 16,
         false});
    add({"  ... with the bf16 bias epilogue", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, true, 16,
         true, true});
    add({"  ... default preferences (no alignment, no reduction mask)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3,
         CUDA_R_16BF, CUDA_R_16BF, true, 16, true, false, 0.0f, false});
    add({"  ... NN form (documented refusal)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, true, 16,
         true, false, 0.0f, true, false});
    add({"fp8 -> fp32 D, C=D, beta 0", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, CUDA_R_32F, true, 16, false});
    add({"fp8 -> fp32 D, C=D, beta 1 (weight-gradient accumulate)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F,
         CUDA_R_32F, true, 16, false, false, 1.0f});
    add({"  ... C a separate buffer", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, CUDA_R_32F, false, 16, false,
         false, 1.0f});
    add({"  ... no scale pointers", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, CUDA_R_32F, true, 0, false, false,
         1.0f});
    add({"fp8 -> bf16 D, beta 1 (accumulate into bf16)", CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF,
         true, 16, false, false, 1.0f});
    add({"E5M2 x E4M3 -> bf16 (hybrid backward)", CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, true,
         16, false});
    add({"E4M3 x E5M2 -> bf16 (hybrid backward)", CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, CUDA_R_16BF, true,
         16, false});
    add({"E5M2 x E5M2 -> bf16 (documented refusal)", CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, CUDA_R_16BF, CUDA_R_16BF, true,
         16, false});

    double bf16_ms = 0;
    std::vector<float> bf16_out;
    for (const Form& f : forms) {
        std::vector<uint8_t> bA, bB, bC, bbias;
        encode(f.a, hA, bA), encode(f.b, hB, bB), encode(f.c, hC, bC), encode(CUDA_R_16BF, hbias, bbias);
        void *A = upload(bA), *B = upload(bB), *C = upload(bC), *bias = upload(bbias);
        void* D = f.in_place ? C : upload(std::vector<uint8_t>(bC.size(), 0));
        const float* sp = f.scales ? (const float*)((char*)scale_block + f.scales) : nullptr;

        cublasLtMatmulDesc_t op;
        LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = f.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        if (sp) {
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof(sp)));
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sp, sizeof(sp)));
        }
        if (f.a != CUDA_R_16BF) {
            const int8_t fast = f.fast ? 1 : 0;
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        }
        if (f.bias) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = CUDA_R_16BF;
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
            LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        }
        cublasLtMatrixLayout_t la, lb, lc, ld;
        if (f.trans_a)
            LT_OK(cublasLtMatrixLayoutCreate(&la, f.a, k, m, k));
        else
            LT_OK(cublasLtMatrixLayoutCreate(&la, f.a, m, k, m));
        LT_OK(cublasLtMatrixLayoutCreate(&lb, f.b, k, n, k));
        LT_OK(cublasLtMatrixLayoutCreate(&lc, f.c, m, n, m));
        LT_OK(cublasLtMatrixLayoutCreate(&ld, f.d, m, n, m));
        cublasLtMatmulPreference_t pref;
        if (f.prefs) {
            pref = lt_preference(ws_bytes, 256, 256, 256);
        } else {
            LT_OK(cublasLtMatmulPreferenceCreate(&pref));
            LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                       sizeof(ws_bytes)));
        }
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0;
        const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, pref, 16, res, &nres);
        const float alpha = 1.0f;
        std::string what =
            hs == CUBLAS_STATUS_SUCCESS ? strfmt("heuristic %d", nres) : strfmt("heuristic status %d", (int)hs);
        int ok_at = -1;
        if (hs == CUBLAS_STATUS_SUCCESS)
            for (int i = 0; i < nres && ok_at < 0; i++) {
                const cublasStatus_t st =
                    cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &f.beta, C, lc, D, ld, &res[i].algo, ws, ws_bytes, 0);
                if (st == CUBLAS_STATUS_SUCCESS)
                    ok_at = i;
                else if (i < 4)
                    what += strfmt(", #%d refused (%d)", i + 1, (int)st);
            }
        CUDA_CHECK(cudaDeviceSynchronize());
        std::printf("%-62s %s", f.name, what.c_str());
        if (ok_at >= 0) {
            std::printf(", runs #%d", ok_at + 1);
            // correctness from a fresh C (the run above may have accumulated into it)
            CUDA_CHECK(cudaMemcpy(C, bC.data(), bC.size(), cudaMemcpyHostToDevice));
            LT_OK(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &f.beta, C, lc, D, ld, &res[ok_at].algo, ws, ws_bytes,
                                 0));
            std::vector<uint8_t> out(bC.size());
            CUDA_CHECK(cudaMemcpy(out.data(), D, out.size(), cudaMemcpyDeviceToHost));
            std::vector<float> got((size_t)m * n);
            for (size_t i = 0; i < got.size(); i++) got[i] = decode(f.d, &out[i * type_size(f.d)]);
            double num = 0, den = 0;
            for (size_t i = 0; i < got.size(); i++) {
                // large shapes: against the bf16 row's product (itself the reference: err 0)
                double r = host_ref ? ref[i] : bf16_out.empty() ? got[i] : bf16_out[i];
                if (host_ref || !bf16_out.empty()) r += (double)f.beta * hC[i] + (f.bias ? hbias[i % m] : 0.0);
                num += (got[i] - r) * (got[i] - r), den += r * r;
            }
            if (f.a == CUDA_R_16BF) bf16_out = got;
            const double ms = bench_ms([&] {
                cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &f.beta, C, lc, D, ld, &res[ok_at].algo, ws, ws_bytes, 0);
            });
            const double tf = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
            if (f.a == CUDA_R_16BF) bf16_ms = ms;
            const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
            std::printf(", rel_err %.2e, time %.4f ms, %.1f TFLOP/s", err, ms, tf);
            if (bf16_ms > 0 && f.a != CUDA_R_16BF) std::printf(", %.2fx bf16", bf16_ms / ms);
        }
        std::printf("\n");
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc),
            cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(bias);
        if (!f.in_place) cudaFree(D);
    }
    cudaFree(ws), cudaFree(scale_block);
    cublasLtDestroy(lt);
    return 0;
}
