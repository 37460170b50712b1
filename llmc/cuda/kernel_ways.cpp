// The config section "kernels" as a KernelWays (llmc/cuda/kernel_ways.h). Plain C++, in every
// binary: the CUDA backend takes the ways through set_cuda_kernel_ways; test_gpu and dev/cuda
// force them directly.
#include <initializer_list>
#include <string>

#include "llmc/core/common.h"
#include "llmc/cuda/cuda_ops.h"

KernelWays cuda_kernel_ways(const std::string& attention_forward, const std::string& attention_backward,
                            const std::string& layernorm_backward, const std::string& attention_wgmma_layout) {
    // the position of v among auto and the others (auto: 0)
    auto pick = [](const char* key, const std::string& v, std::initializer_list<const char*> others) {
        int i = 0;
        std::string names = "auto";
        for (const char* o : others) {
            i++;
            if (v == o) return i;
            names += std::string(", ") + o;
        }
        if (v != "auto") throw UserError(strfmt("%s: \"%s\" is not one of %s", key, v.c_str(), names.c_str()));
        return 0;
    };
    KernelWays w;
    const int fwd = pick("kernels.attention_forward", attention_forward, {"keys128", "wgmma", "wgmma_pipelined"});
    w.fwd_key_tile = fwd == 1 ? 128 : 0;
    w.fwd_wgmma = fwd >= 2 ? fwd - 1 : 0;
    w.bwd_dq = pick("kernels.attention_backward", attention_backward,
                    {"dq_from_ds", "fused", "wgmma_dq", "wgmma", "wgmma_pipelined", "wgmma_ss"});
    w.ln_bwd_registers = !pick("kernels.layernorm_backward", layernorm_backward, {"streamed"});
    w.wgmma_mn = pick("kernels.attention_wgmma_layout", attention_wgmma_layout, {"mn_major"}) == 1;
    return w;
}
