// test_gpu's harness (test/gpu/test_gpu.cu says what test_gpu checks, and runs it):
// the counts and the PASS/FAIL lines, the digests of determinism-checked results, H (one test
// dtype's tensors on both backends, their inputs, comparisons and determinism checks). The cases
// (test/gpu/cases_*.cuh) and test_gpu.cu build on it, in namespace gpu_test.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "llmc/backend/ops.h"
#include "llmc/core/common.h"
#include "llmc/core/config.h"
#include "llmc/core/tensor.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cuda/cuda_ops.h"
#include "llmc/model/model.h"
#include "llmc/model/moe.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/precision/bf16.h"
#include "llmc/precision/fp16.h"
#include "test/op_cases.h"
#include "test/whole_model.h"

namespace gpu_test {

inline int g_pass = 0, g_fail = 0;
inline std::vector<std::string> g_digest;  // "check shape hash" of every determinism-checked result

inline void digest(const std::string& name, const std::string& shape, const void* bytes, size_t n) {
    g_digest.push_back(strfmt("%s %s %016llx", name.c_str(), shape.c_str(), (unsigned long long)fnv1a(bytes, n)));
}

// one PASS or FAIL line; LLMC_TEST_FAIL_FAST=1: the first FAIL ends the process (exit 1):
// test/cuemu/planted_bugs.sh needs one failure per mutant, not all of them
inline void report(bool ok, const std::string& name, const std::string& shape, const std::string& detail) {
    std::printf("%s %s %s %s\n", ok ? "PASS" : "FAIL", name.c_str(), shape.c_str(), detail.c_str());
    std::fflush(stdout);
    (ok ? g_pass : g_fail)++;
    static const bool fail_fast = std::getenv("LLMC_TEST_FAIL_FAST") && std::string(std::getenv("LLMC_TEST_FAIL_FAST")) == "1";
    if (!ok && fail_fast) std::exit(1);
}

// f run as one case: an exception (a failed CUDA/cuBLASLt check, LLMC_ASSERT) is a FAIL line naming it
inline void guarded(const std::string& what, const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        report(false, what, "", std::string("exception: ") + e.what());
    }
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return (float)((next() >> 40) * (1.0 / 16777216.0)); }  // [0, 1)
    float normal() {
        float u1 = uniform(), u2 = uniform();
        if (u1 < 1e-7f) u1 = 1e-7f;
        return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
    int below(int n) { return (int)(next() % (uint64_t)n); }
};

// One tensor on both backends: c = CPU (fp32), g = GPU (the test dtype, or fp32 for statistics).
struct Pair {
    Tensor c, g;
    bool stat = false;
    size_t n() const { return c.n; }
};

class H {
public:
    Ops& cpu;
    Ops& gpu;
    DType dt;
    Rng rng;
    H(Ops& c, Ops& g, DType d, uint64_t seed) : cpu(c), gpu(g), dt(d), rng(seed) {}
    ~H() {
        for (void* p : cpu_allocs_) cpu.release(p);
        for (void* p : gpu_allocs_) gpu.release(p);
    }
    // a 16-bit dtype (bf16 or fp16): inputs rounded to it, looser tolerances
    bool low() const { return dt != DType::F32; }
    double tol(bool stat) const {
        return dt == DType::BF16 ? (stat ? 1e-3 : 2e-2) : dt == DType::F16 ? (stat ? 1e-3 : 2e-3) : 1e-4;
    }

    Pair make(size_t n, bool stat = false) {
        Pair p;
        p.stat = stat;
        void* pc = cpu.alloc(n * 4);
        DType gd = stat ? DType::F32 : dt;
        void* pg = gpu.alloc(n * dtype_size(gd));
        cpu_allocs_.push_back(pc);
        gpu_allocs_.push_back(pg);
        p.c = Tensor(pc, n, DType::F32);
        p.g = Tensor(pg, n, gd);
        return p;
    }
    // n elements of p from element `off` on (both backends)
    static Pair shifted(const Pair& p, size_t off, size_t n) {
        Pair q = p;
        q.c = p.c.slice(off, n);
        q.g = p.g.slice(off, n);
        return q;
    }
    // n new elements `off` past an aligned address (as a slice of a larger tensor can sit)
    Pair make_at(size_t n, size_t off) { return off ? shifted(make(n + off), off, n) : make(n); }
    // int32 array on both backends
    std::pair<int32_t*, int32_t*> ints(const std::vector<int32_t>& v) {
        void* pc = cpu.alloc(v.size() * 4);
        void* pg = gpu.alloc(v.size() * 4);
        cpu_allocs_.push_back(pc);
        gpu_allocs_.push_back(pg);
        cpu.from_host_bytes(pc, v.data(), v.size() * 4);
        gpu.from_host_bytes(pg, v.data(), v.size() * 4);
        return {(int32_t*)pc, (int32_t*)pg};
    }
    static float q_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }
    // x rounded to the test dtype (unchanged in fp32)
    float q(float x) const { return dt == DType::BF16 ? q_bf16(x) : dt == DType::F16 ? round_f16(x) : x; }
    // random N(0, scale^2) values, rounded to the dtype unless stat
    std::vector<float> rnd(size_t n, float scale, bool stat = false) {
        std::vector<float> v(n);
        for (auto& x : v) {
            x = scale * rng.normal();
            if (!stat) x = q(x);
        }
        return v;
    }
    std::vector<float> rnd_for(const Pair& p, float scale) { return rnd(p.n(), scale, p.stat); }
    void up(const Pair& p, const std::vector<float>& v) {
        cpu.from_host_f32(p.c, v.data());
        gpu.from_host_f32(p.g, v.data());
    }
    void up_gpu(const Pair& p, const std::vector<float>& v) { gpu.from_host_f32(p.g, v.data()); }
    void poison(const Pair& p) {
        std::vector<uint8_t> ff(p.g.bytes(), 0xFF);
        gpu.from_host_bytes(p.g.ptr, ff.data(), ff.size());
    }
    std::vector<uint8_t> raw(std::initializer_list<Pair> ps) {
        gpu.synchronize();
        std::vector<uint8_t> out;
        for (const Pair& p : ps) {
            size_t o = out.size();
            out.resize(o + p.g.bytes());
            gpu.to_host_bytes(out.data() + o, p.g.ptr, p.g.bytes());
        }
        return out;
    }
    std::vector<float> get_gpu(const Pair& p) {
        std::vector<float> v(p.n());
        gpu.to_host_f32(v.data(), p.g);
        return v;
    }
    std::vector<float> get_cpu(const Pair& p) {
        std::vector<float> v(p.n());
        cpu.to_host_f32(v.data(), p.c);
        return v;
    }
    // norm-relative error of gpu vs cpu; NaN anywhere fails
    void compare(const std::string& name, const std::string& shape, const Pair& p) {
        std::vector<float> g = get_gpu(p), c = get_cpu(p);
        compare_vec(name, shape, g, c, tol(p.stat));
    }
    static void compare_vec(const std::string& name, const std::string& shape, const std::vector<float>& g,
                            const std::vector<float>& c, double tol) {
        double num = 0, den = 0;
        size_t bad = 0, first_bad = (size_t)-1;
        for (size_t i = 0; i < g.size(); i++) {
            if (!std::isfinite(g[i]) || !std::isfinite(c[i])) {
                bad++;
                if (first_bad == (size_t)-1) first_bad = i;
                continue;
            }
            double d = (double)g[i] - (double)c[i];
            num += d * d;
            den += (double)c[i] * c[i];
        }
        double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        bool ok = bad == 0 && err <= tol;
        std::string detail = strfmt("err=%.3e tol=%.0e", err, tol);
        if (bad)
            detail += strfmt(" non-finite=%zu (first at %zu: gpu=%g cpu=%g)", bad, first_bad, g[first_bad],
                             c[first_bad]);
        report(ok, name, shape, detail);
    }
    // row by row: the largest ||g_r - c_r|| / (||c_r|| + floor) over rows of `row` values, floor a
    // tenth of the rows' root-mean-square norm (a near-zero row is judged against typical rows)
    static void compare_rows(const std::string& name, const std::string& shape, const std::vector<float>& g,
                             const std::vector<float>& c, size_t row, double tol) {
        const size_t rows = row ? c.size() / row : 0;
        double all = 0;
        for (float x : c) all += (double)x * x;
        const double floor = rows ? 0.1 * std::sqrt(all / rows) : 0.0;
        double worst = 0;
        size_t at = 0;
        bool finite = g.size() == c.size();
        for (size_t r = 0; r < rows && finite; r++) {
            double num = 0, den = 0;
            for (size_t i = r * row; i < (r + 1) * row; i++) {
                finite = finite && std::isfinite(g[i]) && std::isfinite(c[i]);
                const double d = (double)g[i] - (double)c[i];
                num += d * d;
                den += (double)c[i] * c[i];
            }
            const double e = std::sqrt(num) / (std::sqrt(den) + floor);
            if (e > worst) worst = e, at = r;
        }
        report(finite && rows > 0 && worst <= tol, name + ".rows", shape,
               strfmt("worst row %zu of %zu: err=%.3e tol=%.0e%s", at, rows, worst, tol, finite ? "" : " non-finite"));
    }
    void det(const std::string& name, const std::string& shape, const std::vector<uint8_t>& a,
             const std::vector<uint8_t>& b) {
        size_t diff = 0;
        for (size_t i = 0; i < a.size(); i++) diff += a[i] != b[i];
        report(a.size() == b.size() && diff == 0, name + ".determinism", shape, strfmt("differing_bytes=%zu", diff));
        digest(name, shape, a.data(), a.size());
    }

private:
    std::vector<void*> cpu_allocs_, gpu_allocs_;
};

}  // namespace gpu_test
