// Helpers shared by the CPU op tests (test_cpu_ops.cpp, test_llama_ops.cpp, test_moe_ops.cpp): seeded normal
// data in double, float copies, fp32 tensor views, central finite differences, and the norm-wise
// relative error.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "llmc/core/tensor.h"

namespace cpu_test {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

inline Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    Vec v(n);
    for (auto& x : v) x = nd(rng) * scale;
    return v;
}
inline FVec to_f(const Vec& v) { return FVec(v.begin(), v.end()); }
inline Tensor T32(FVec& v) { return Tensor(v.data(), v.size(), DType::F32); }
inline double dot_all(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}
inline Vec sub(const Vec& a, const Vec& b) {
    Vec r(a.size());
    for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
    return r;
}
// Central finite differences of loss() with respect to every element of x (restored after).
template <class Loss>
Vec numeric_grad(Vec& x, const Loss& loss, double h = 1e-5) {
    Vec g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}
// Norm-wise relative error max|f - d| / max|d|.
template <class F>
double rel_err(const F* f, const double* d, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num = std::max(num, std::fabs((double)f[i] - d[i]));
        den = std::max(den, std::fabs(d[i]));
    }
    return den > 0 ? num / den : num;
}

// Analytic gradient against central differences: the largest difference over the largest
// numeric element (which must be above 1e-3: a vanishing gradient proves nothing) below 1e-7.
inline void check_fd(const char* what, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
    REQUIRE(x.size() == analytic.size());
    // max |analytic - numeric| / max|numeric|
    const Vec num = numeric_grad(x, loss);
    double scale = 0, err = 0;
    for (size_t i = 0; i < num.size(); ++i) {
        scale = std::max(scale, std::fabs(num[i]));
        err = std::max(err, std::fabs(num[i] - analytic[i]));
    }
    const double e = scale > 0 ? err / scale : err;
    INFO(what << ": rel err " << e << ", max|grad| " << scale);
    CHECK(scale > 1e-3);
    CHECK(e < 1e-7);
}

}  // namespace cpu_test
