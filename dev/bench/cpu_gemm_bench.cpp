// The CPU backend's GEMM paths against each other (dev/bench/cpu_gemm.sh runs this): the
// hand-written blocked kernel (cpu::gemm_acc, llmc/cpu/gemm.h) and OpenBLAS's sgemm (the strides
// mapped onto BLAS's row-major layouts, plain or transposed) on the matmuls of a GPT-2 training step, C += A * B in the strides that
// llmc/cpu/kernels.h passes:
//   fwd   out[M, N]  += inp[M, K] * w[N, K]^T       (A as is, B transposed)
//   dinp  dinp[M, K] += dout[M, N] * w[N, K]         (both as is)
//   dw    dw[N, K]   += dout[M, N]^T * inp[M, K]     (A transposed)
// for a shape "M x N x K" (M tokens, N output channels, K input channels). Prints one markdown
// row per shape and pass: GFLOP/s of each (best of the repetitions), the ratio, and the largest
// difference between the two results relative to the largest element (a wrong mapping of the
// strides shows there). Threads: OpenMP's (OMP_NUM_THREADS).
//   usage: cpu_gemm_bench [SECONDS per measurement, default 1] [MxNxK ...]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "llmc/cpu/gemm.h"

namespace {

struct Pass {
    const char* name;
    int M, N, K;  // of the GEMM itself
    long a_rs, a_ks, b_ks, b_js;
};

// the three matmuls of a linear layer with T tokens, IC inputs, OC outputs
std::vector<Pass> passes(int T, int OC, int IC) {
    return {{"fwd", T, OC, IC, IC, 1, 1, IC},
            {"dinp", T, IC, OC, OC, 1, IC, 1},
            {"dw", OC, IC, T, 1, OC, IC, 1}};
}

// A rows x cols matrix with element (r, c) at p[r * rs + c * cs] as a row-major BLAS operand:
// itself (cs == 1) or the transpose of a cols x rows one (rs == 1), with its leading dimension.
bool blas_operand(long rs, long cs, int rows, int cols, bool* trans, int* ld) {
    if (cs == 1 && rs >= std::max(1, cols)) {
        *trans = false, *ld = (int)rs;
        return true;
    }
    if (rs == 1 && cs >= std::max(1, rows)) {
        *trans = true, *ld = (int)cs;
        return true;
    }
    return false;
}

// C += A * B through OpenBLAS
void blas_gemm(float* c, long ldc, const float* a, const Pass& p, const float* b) {
    bool ta, tb;
    int lda, ldb;
    if (!blas_operand(p.a_rs, p.a_ks, p.M, p.K, &ta, &lda) || !blas_operand(p.b_ks, p.b_js, p.K, p.N, &tb, &ldb)) {
        std::fprintf(stderr, "cpu_gemm_bench: %s: strides do not fit BLAS\n", p.name);
        std::exit(1);
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, p.M, p.N, p.K, 1.0f, a,
                lda, b, ldb, 1.0f, c, (int)ldc);
}

double seconds_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// best time of one call of f over at least 3 calls and `budget` seconds (after one warm-up call)
template <class F>
double best_time(F f, double budget) {
    f();
    double best = 1e30, spent = 0;
    for (int r = 0; r < 3 || spent < budget; ++r) {
        const double t0 = seconds_now();
        f();
        const double t = seconds_now() - t0;
        best = std::min(best, t);
        spent += t;
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    const double budget = argc > 1 ? std::atof(argv[1]) : 1.0;
    std::vector<std::string> shapes;
    for (int i = 2; i < argc; ++i) shapes.push_back(argv[i]);
    if (shapes.empty()) shapes = {"256x768x768", "256x2304x768", "256x3072x768", "256x768x3072", "256x50304x768",
                                  "2048x2048x2048"};
    std::printf("| shape (tokens x out x in) | pass | hand-written GFLOP/s | OpenBLAS GFLOP/s | BLAS / hand | max diff |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const std::string& s : shapes) {
        int T = 0, OC = 0, IC = 0;
        if (std::sscanf(s.c_str(), "%dx%dx%d", &T, &OC, &IC) != 3 || T <= 0 || OC <= 0 || IC <= 0) {
            std::fprintf(stderr, "cpu_gemm_bench: bad shape '%s' (want MxNxK, e.g. 256x768x768)\n", s.c_str());
            return 2;
        }
        std::vector<float> x((size_t)T * IC), w((size_t)OC * IC), d((size_t)T * OC);
        for (float& v : x) v = nd(rng);
        for (float& v : w) v = nd(rng);
        for (float& v : d) v = nd(rng);
        for (const Pass& p : passes(T, OC, IC)) {
            const bool fwd = p.name[0] == 'f', dinp = p.name[1] == 'i';
            const float* a = fwd ? x.data() : d.data();
            const float* b = fwd || dinp ? w.data() : x.data();
            const long ldc = p.N;
            std::vector<float> c1((size_t)p.M * p.N, 0.0f), c2 = c1;
            const double flops = 2.0 * p.M * p.N * p.K;
            // C is accumulated into on every call; its growth does not change the speed
            const double th = best_time([&] { cpu::gemm_acc<float>(c1.data(), ldc, a, p.a_rs, p.a_ks, b, p.b_ks, p.b_js,
                                                                 p.M, p.N, p.K); }, budget);
            const double tb = best_time([&] { blas_gemm(c2.data(), ldc, a, p, b); }, budget);
            // one fresh call of each for the comparison
            std::fill(c1.begin(), c1.end(), 0.0f);
            std::fill(c2.begin(), c2.end(), 0.0f);
            cpu::gemm_acc<float>(c1.data(), ldc, a, p.a_rs, p.a_ks, b, p.b_ks, p.b_js, p.M, p.N, p.K);
            blas_gemm(c2.data(), ldc, a, p, b);
            double md = 0, mx = 0;
            for (size_t i = 0; i < c1.size(); ++i) {
                md = std::max(md, (double)std::fabs(c1[i] - c2[i]));
                mx = std::max(mx, (double)std::fabs(c1[i]));
            }
            std::printf("| %s | %s | %.1f | %.1f | %.2f | %.1e |\n", s.c_str(), p.name, flops / th * 1e-9,
                        flops / tb * 1e-9, th / tb, md / mx);
            std::fflush(stdout);
            if (!(md <= 1e-4 * mx)) {
                std::fprintf(stderr, "cpu_gemm_bench: %s %s: the two GEMMs disagree (%.3g of the largest element)\n",
                             s.c_str(), p.name, md / mx);
                return 1;
            }
        }
    }
    return 0;
}
