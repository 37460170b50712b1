// Shared helpers of the dev/cuda kernel experiments: random data, device buffers with
// fp32/bf16 conversion, validation against the CPU backend's templates (llmc/cpu/kernels.h), default
// shapes from the op-case table, and a cudaEvent timer.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include <cctype>
#include <functional>
#include <string>
#include <vector>

#include "llmc/cpu/kernels.h"  // the CPU references: the very templates the CPU backend runs
#include "llmc/cuda/common.cuh"
#include "test/op_cases.h"

inline std::vector<float> rand_vec(size_t n, float scale = 1.0f, unsigned seed = 42) {
    std::vector<float> v(n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (auto& x : v) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x = scale * ((float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f);
    }
    return v;
}
inline void round_bf16(std::vector<float>& v) {
    for (auto& x : v) x = bf16_bits_to_f32(f32_to_bf16_bits(x));
}

// device copy of a host fp32 vector as T
template <class T>
T* to_dev(const std::vector<float>& h) {
    T* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
    if constexpr (std::is_same<T, float>::value) {
        CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    } else {
        std::vector<uint16_t> b(h.size());
        for (size_t i = 0; i < h.size(); i++) b[i] = f32_to_bf16_bits(h[i]);
        CUDA_CHECK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    }
    return d;
}
template <class T>
T* dev_poisoned(size_t n) {
    T* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, n) * sizeof(T)));
    CUDA_CHECK(cudaMemset(d, 0xFF, n * sizeof(T)));  // NaN in fp32 and bf16
    return d;
}
template <class T>
std::vector<float> to_host(const T* d, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    if constexpr (std::is_same<T, float>::value) {
        CUDA_CHECK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<uint16_t> b(n);
        CUDA_CHECK(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) h[i] = bf16_bits_to_f32(b[i]);
    }
    return h;
}

// norm-relative error; prints and returns whether it is within tol (NaN fails)
inline bool validate(const char* name, const std::vector<float>& got, const std::vector<float>& ref, double tol) {
    double num = 0, den = 0, maxabs = 0;
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) {
            if (bad++ < 3) std::printf("  %s[%zu]: got %g ref %g\n", name, i, got[i], ref[i]);
            continue;
        }
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        maxabs = std::max(maxabs, std::fabs(d));
    }
    double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    bool ok = bad == 0 && err <= tol;
    std::printf("  %-10s %s rel_err=%.3e max_abs=%.3e non_finite=%zu (tol %.0e)\n", name, ok ? "OK  " : "FAIL", err,
                maxabs, bad, tol);
    return ok;
}

// median time in ms of fn() over `repeats` runs after `warmup` runs
inline float bench_ms(const std::function<void()>& fn, int warmup = 3, int repeats = 20) {
    for (int i = 0; i < warmup; i++) fn();
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> t(repeats);
    for (int i = 0; i < repeats; i++) {
        CUDA_CHECK(cudaEventRecord(a));
        fn();
        CUDA_CHECK(cudaEventRecord(b));
        CUDA_CHECK(cudaEventSynchronize(b));
        CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[repeats / 2];
}
inline int kernel_arg(int argc, char** argv, int dflt) { return argc > 1 ? std::atoi(argv[1]) : dflt; }

// The CPU reference's outputs, computed once for a given input and kept on disk for the next run:
// a GPU window times several versions of a kernel at one shape (gpu_check --kernels), and at T=1024
// the reference takes seconds of the window each time (the attention backward's at 32 heads: about
// 3 s on 16 cores) where reading it back takes a fraction. `key` names everything the outputs depend
// on (the op, the shape, the inputs' seeds and rounding); this binary's build time is added, so that
// a rebuilt reference is never mixed with an older one's file. The folder: $LLMC_DEV_CUDA_REFS,
// default /tmp/llmc_dev_cuda_refs; LLMC_DEV_CUDA_REFS=off computes every time. `outs` arrive sized.
inline void cached_reference(std::string key, const std::vector<std::vector<float>*>& outs,
                             const std::function<void()>& compute) {
    const char* env = std::getenv("LLMC_DEV_CUDA_REFS");
    const std::string dir = env && *env ? env : "/tmp/llmc_dev_cuda_refs";
    if (dir == "off") return compute();
    key += std::string(" built ") + __DATE__ + " " + __TIME__;
    for (char& c : key)
        if (!std::isalnum((unsigned char)c) && c != '.' && c != '-') c = '_';
    const std::string path = dir + "/" + key + ".bin";
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
        bool ok = true;
        for (std::vector<float>* v : outs) ok = ok && std::fread(v->data(), 4, v->size(), f) == v->size();
        ok = ok && std::fgetc(f) == EOF;  // (exactly the sizes asked for)
        std::fclose(f);
        if (ok) {
            std::printf("  CPU reference read from %s\n", path.c_str());
            return;
        }
    }
    compute();
    try {
        make_dirs(dir, "LLMC_DEV_CUDA_REFS");  // (llmc/core/common.cpp, linked by the programs that call this)
    } catch (const UserError& e) {
        std::printf("  CPU reference not kept: %s\n", e.what());
        return;
    }
    const std::string tmp = path + "." + std::to_string((long)getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return;
    bool ok = true;
    for (const std::vector<float>* v : outs) ok = ok && std::fwrite(v->data(), 4, v->size(), f) == v->size();
    ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}
// The shape: n numbers after the version on the command line, else the op's Bench case of the
// op-case table (test/op_cases.h), the shape the GPU parity tests and the CPU tests share a table with.
inline std::vector<int> bench_case(const char* op, int argc, char** argv, int n) {
    if (argc > n + 1) {
        std::vector<int> d;
        for (int i = 2; i < 2 + n; i++) d.push_back(std::atoi(argv[i]));
        return d;
    }
    return op_cases::of(op, op_cases::Bench).at(0).dims;
}
