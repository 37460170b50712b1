#include "llmc/run/mfu.h"

#include <algorithm>
#include <cctype>

double flops_per_token(const ModelShape& s, int seq_len) {
    const double C = s.d_model, L = s.n_layer;
    double n = double(num_params_unpadded(s));  // the vocabulary padding does no useful work
    if (s.moe.enabled())  // a token runs through top_k of the num_experts experts of an MoE layer
        n -= double(num_expert_params(s)) * double(s.moe.num_experts - s.moe.top_k) / double(s.moe.num_experts);
    return 6.0 * n + 12.0 * L * C * seq_len;
}

double gpu_peak_flops(const std::string& gpu_name, const std::string& precision) {
    std::string name = gpu_name;
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    struct Row {
        const char* match;     // substring of the upper-cased device name
        const char* not_match; // and not this one ("" = none)
        double bf16, fp8, tf32, fp32;  // dense TFLOP/s from the vendor's datasheets (fp16's = bf16's)
    };
    static const Row table[] = {
        {"H200", "", 989.4, 1978.9, 494.7, 66.9},
        {"H100", "PCIE", 989.4, 1978.9, 494.7, 66.9},  // SXM5 (e.g. "NVIDIA H100 80GB HBM3")
        {"H100 PCIE", "", 756.0, 1513.0, 378.0, 51.2},
        {"H100 NVL", "", 835.0, 1671.0, 417.0, 60.0},
        {"A100", "", 312.0, 0.0, 156.0, 19.5},  // SXM4 and PCIe share the dense peaks
    };
    // most specific first: "H100 PCIE"/"H100 NVL" before the generic "H100"
    const Row* best = nullptr;
    size_t best_len = 0;
    for (const Row& r : table) {
        std::string m = r.match;
        if (name.find(m) == std::string::npos) continue;
        if (*r.not_match && name.find(r.not_match) != std::string::npos) continue;
        if (m.size() > best_len) best = &r, best_len = m.size();
    }
    if (!best) return 0.0;
    double tflops = precision == "bf16" || precision == "fp16" ? best->bf16 : precision == "fp8" ? best->fp8 : precision == "tf32" ? best->tf32 : best->fp32;
    return tflops * 1e12;
}
