// One table of op cases, after ggml's test-backend-ops: every shape a backend test runs, as
// data. Three consumers read it:
//   - the CPU tests (test/test_cpu_ops.cpp, test/test_llama_ops.cpp): finite differences in
//     double on the cases marked Fd (tiny: one central difference per element), and CpuOps
//     (float) against the double templates on the cases marked Cpu;
//   - the GPU parity tests (test/gpu/test_gpu.cu): CUDA against CpuOps on the cases
//     marked Gpu, in fp32, bf16 and fp16 (Long: a long case, which the CUDA emulator's second
//     schedule leaves out, LLMC_TEST_SKIP_LONG);
//   - the kernel experiments (dev/cuda/*.cu): their default shape is the op's Bench case.
// The meaning of `dims` is the op's (named in each block below); `x` is the op's one real
// parameter (eps, theta), 0 where it has none.
#pragma once
#include <string>
#include <vector>

namespace op_cases {

enum Mode { Fd = 1, Cpu = 2, Gpu = 4, Bench = 8, Long = 16 };

struct Case {
    const char* op;
    std::vector<int> dims;
    float x;
    int modes;
};

inline const std::vector<Case>& all() {
    static const std::vector<Case> cases = {
        // encoder: B, T, C, V
        {"encoder", {2, 17, 96, 50}, 0, Gpu},
        {"encoder", {1, 1, 64, 7}, 0, Gpu},
        {"encoder", {4, 64, 200, 1000}, 0, Gpu},
        {"encoder", {2, 257, 128, 3}, 0, Gpu},  // heavy token repetition
        // layernorm: N, C[, input offset in elements]
        {"layernorm", {1, 64}, 0, Gpu},
        {"layernorm", {17, 96}, 0, Gpu},
        {"layernorm", {100, 200}, 0, Gpu},
        {"layernorm", {1000, 768}, 0, Gpu},
        {"layernorm", {257, 1600}, 0, Gpu},
        {"layernorm", {33, 12288}, 0, Gpu},  // GPT-3's width: the backward past 48 KiB of shared memory
        // C a multiple of 4, not 8: fp32 in packs, bf16 element by element; then C odd (C large enough
        // that bf16's rounding of the fused residual moves the mean by well under the 1e-3 tolerance)
        {"layernorm", {17, 300}, 0, Gpu},
        {"layernorm", {13, 333}, 0, Gpu},
        {"layernorm", {7, 768, 1}, 0, Gpu},  // the input one element off 16-byte alignment
        {"layernorm", {8192, 768}, 0, Bench},  // GPT-2 124M: B 8 x T 1024
        // encoder_slice (vocabulary-parallel embedding): B, T, C, Vp, c0, c1, with_wpe
        {"encoder_slice", {2, 17, 96, 64, 0, 32, 1}, 0, Gpu},
        {"encoder_slice", {2, 17, 96, 64, 32, 64, 0}, 0, Gpu},
        {"encoder_slice", {4, 64, 200, 1024, 300, 700, 1}, 0, Gpu},
        {"encoder_slice", {2, 257, 128, 8, 2, 5, 0}, 0, Gpu},  // heavy token repetition
        {"encoder_slice", {1, 5, 64, 16, 7, 7, 1}, 0, Gpu},    // an empty slice
        // residual: n[, offset of every view in elements]
        {"residual", {1}, 0, Gpu},
        {"residual", {12345}, 0, Gpu},     // packs, then one element past the last whole pack
        {"residual", {12345, 1}, 0, Gpu},  // every view one element off 16-byte alignment
        // matmul: N, IC, OC, bias, gelu, bias offset (an unaligned bias view)[, operand offset]
        {"matmul", {17, 96, 200, 1, 0, 0}, 0, Gpu},
        {"matmul", {100, 200, 96, 1, 1, 0}, 0, Gpu},
        {"matmul", {1, 64, 48, 1, 0, 0}, 0, Gpu},
        {"matmul", {257, 64, 128, 0, 0, 0}, 0, Gpu},
        {"matmul", {128, 768, 2304, 1, 0, 0}, 0, Gpu},
        {"matmul", {64, 768, 3072, 1, 1, 0}, 0, Gpu},
        {"matmul", {7, 24, 40, 1, 1, 1}, 0, Gpu},
        {"matmul", {7, 24, 40, 1, 1, 1, 1}, 0, Gpu},     // every operand one element off alignment
        {"matmul", {64, 768, 256, 1, 0, 0, 3}, 0, Gpu},  // three elements off
        {"matmul", {48, 64, 96, 0, 1, 0}, 0, Gpu},       // GELU without a bias (CUDA: GELU_AUX)
        {"matmul", {33, 40, 52, 1, 1, 0}, 0, Gpu},       // OC not a multiple of 8: no aux epilogue
        {"matmul", {600, 64, 96, 1, 1, 0}, 0, Gpu},      // CUDA's bias-gradient kernels: three chunks of rows
        {"matmul", {300, 32, 100, 1, 0, 0, 1}, 0, Gpu},  // ... element by element
        {"matmul", {8192, 768, 3072, 1, 1, 0}, 0, Bench},  // GPT-2 124M's fc: B 8 x T 1024
        // attention: B, T, NH, NKV, HS (NKV < NH: grouped-query)
        {"attention", {2, 5, 2, 2, 9}, 0, Fd},  // HS > 8 exercises the lane loop and the tail
        {"attention", {2, 5, 4, 2, 9}, 0, Fd},
        {"attention", {2, 5, 4, 1, 9}, 0, Fd},
        {"attention", {2, 33, 3, 3, 16}, 0, Cpu},
        {"attention", {2, 33, 4, 2, 16}, 0, Cpu},
        {"attention", {1, 1, 2, 2, 64}, 0, Gpu},
        {"attention", {2, 17, 3, 3, 64}, 0, Gpu},
        {"attention", {1, 64, 4, 4, 64}, 0, Gpu},
        {"attention", {2, 100, 2, 2, 128}, 0, Gpu},
        {"attention", {1, 257, 2, 2, 64}, 0, Gpu},
        {"attention", {1, 257, 1, 1, 128}, 0, Gpu},
        {"attention", {1, 50, 2, 2, 32}, 0, Gpu},
        {"attention", {1, 1, 4, 2, 64}, 0, Gpu},
        {"attention", {2, 17, 4, 2, 64}, 0, Gpu | Cpu},
        {"attention", {1, 64, 4, 1, 64}, 0, Gpu},
        {"attention", {2, 100, 4, 2, 128}, 0, Gpu},
        {"attention", {1, 257, 4, 1, 64}, 0, Gpu},
        {"attention", {1, 129, 8, 2, 128}, 0, Gpu},
        {"attention", {2, 50, 6, 3, 32}, 0, Gpu},
        {"attention", {2, 100, 2, 2, 80}, 0, Gpu},  // head size 80 (5 x 16)
        {"attention", {1, 257, 4, 2, 80}, 0, Gpu},
        {"attention", {2, 17, 3, 3, 8}, 0, Gpu},     // head sizes off the multiples of 16: padded
        {"attention", {1, 100, 4, 2, 40}, 0, Gpu},
        {"attention", {1, 70, 2, 1, 20}, 0, Gpu},
        {"attention", {1, 130, 2, 2, 96}, 0, Gpu},
        {"attention", {1, 90, 2, 2, 256}, 0, Gpu},   // past sm_86's 99 KiB at 64x64 tiles
        {"attention", {1, 1024, 4, 4, 64}, 0, Gpu | Long},  // T = 1024: GPT-2's context
        {"attention", {1, 1024, 4, 2, 128}, 0, Gpu | Long},
        {"attention", {4, 1024, 12, 12, 64}, 0, Bench},  // GPT-2 124M
        // attention_ring (context parallelism: block attention, merge, block backward as a ring over
        // cp blocks, llmc/parallel/context_parallel.h): B, T, NH, NKV, HS, cp
        {"attention_ring", {1, 8, 2, 2, 5, 2}, 0, Fd},
        {"attention_ring", {2, 8, 4, 2, 3, 2}, 0, Fd},
        {"attention_ring", {1, 16, 4, 1, 3, 4}, 0, Fd},
        {"attention_ring", {2, 32, 4, 2, 16, 2}, 0, Cpu},
        {"attention_ring", {2, 32, 4, 2, 16, 4}, 0, Cpu},
        {"attention_ring", {1, 48, 3, 3, 16, 4}, 0, Cpu},
        {"attention_ring", {2, 36, 4, 2, 64, 2}, 0, Gpu},
        {"attention_ring", {1, 256, 8, 2, 64, 4}, 0, Gpu},
        {"attention_ring", {2, 36, 4, 2, 40, 2}, 0, Gpu},
        // rmsnorm: N, C (x = eps)
        {"rmsnorm", {7, 13}, 1e-5f, Fd},
        {"rmsnorm", {66, 64}, 1e-6f, Cpu},
        {"rmsnorm", {1, 64}, 1e-5f, Gpu},
        {"rmsnorm", {17, 96}, 1e-6f, Gpu},
        {"rmsnorm", {100, 200}, 1e-5f, Gpu | Cpu},
        {"rmsnorm", {1000, 768}, 1e-5f, Gpu},
        {"rmsnorm", {257, 1600}, 1e-6f, Gpu},
        {"rmsnorm", {33, 4096}, 1e-5f, Gpu},
        {"rmsnorm", {9, 16384}, 1e-5f, Gpu},  // the backward past 48 KiB of shared memory
        {"rmsnorm", {5, 13}, 1e-5f, Gpu},     // C no multiple of a pack: element by element
        // rope: B, T, NH, NKV, HS (x = theta)
        {"rope", {2, 6, 4, 2, 8}, 500.0f, Fd},
        {"rope", {2, 33, 4, 2, 16}, 10000.0f, Cpu},
        {"rope", {1, 1, 2, 2, 64}, 10000.0f, Gpu},
        {"rope", {2, 17, 4, 2, 64}, 10000.0f, Gpu | Cpu},
        {"rope", {1, 100, 3, 3, 32}, 10000.0f, Gpu},
        {"rope", {2, 257, 4, 1, 128}, 500000.0f, Gpu},
        {"rope", {1, 2048, 2, 1, 64}, 10000.0f, Gpu},  // large angles
        // swiglu: N, F
        {"swiglu", {5, 11}, 0, Fd},
        {"swiglu", {66, 24}, 0, Cpu},
        {"swiglu", {1, 1}, 0, Gpu},
        {"swiglu", {17, 96}, 0, Gpu | Cpu},
        {"swiglu", {100, 200}, 0, Gpu},
        {"swiglu", {1000, 768}, 0, Gpu},
        {"swiglu", {7, 1377}, 0, Gpu},
        // moe (router, permutation, combine; llmc/model/moe.h): N, E, K, C, capacity (0 = dropless)
        {"moe", {7, 4, 2, 5, 0}, 0, Fd},
        {"moe", {9, 4, 2, 5, 4}, 0, Fd},  // 18 pairs for 16 places: drops
        {"moe", {6, 5, 1, 3, 2}, 0, Fd},
        {"moe", {64, 8, 2, 48, 0}, 0, Cpu | Gpu},
        {"moe", {64, 8, 2, 48, 12}, 0, Cpu | Gpu},
        {"moe", {1000, 16, 4, 256, 200}, 0, Gpu},
        {"moe", {3, 2, 1, 7, 1}, 0, Gpu},
        // cross_entropy: N, V, Vp, backward
        {"cross_entropy", {7, 50, 128, 1}, 0, Gpu},
        {"cross_entropy", {7, 50, 128, 0}, 0, Gpu},
        {"cross_entropy", {17, 1000, 1024, 1}, 0, Gpu},
        {"cross_entropy", {4, 50257, 50304, 1}, 0, Gpu},
        {"cross_entropy", {5, 37, 45, 1}, 0, Gpu},  // Vp not a multiple of a 16-byte pack
        {"cross_entropy", {8192, 50257, 50304, 1}, 0, Bench},
        // cross_entropy_vp (vocabulary-parallel): N, V, Vp, backward, then the slice cuts
        {"cross_entropy_vp", {7, 50, 128, 1, 0, 128}, 0, Gpu},
        {"cross_entropy_vp", {7, 50, 128, 0, 0, 128}, 0, Gpu},
        {"cross_entropy_vp", {7, 50, 128, 1, 0, 64, 128}, 0, Gpu},  // a padding-only slice
        {"cross_entropy_vp", {17, 1000, 1024, 1, 0, 300, 700, 1024}, 0, Gpu},
        {"cross_entropy_vp", {17, 1000, 1024, 0, 0, 300, 700, 1024}, 0, Gpu},
        {"cross_entropy_vp", {4, 50257, 50304, 1, 0, 25152, 50304}, 0, Gpu},
        {"cross_entropy_vp", {4, 50257, 50304, 1, 0, 12576, 25152, 37728, 50304}, 0, Gpu},
        // adamw: n, master weights, step t
        {"adamw", {1000, 0, 1}, 0, Gpu},
        {"adamw", {100003, 1, 1}, 0, Gpu},
        {"adamw", {100003, 1, 7}, 0, Gpu},
        // sum_squares: n
        {"sum_squares", {1}, 0, Gpu},
        {"sum_squares", {1000}, 0, Gpu},
        {"sum_squares", {(1 << 20) + 7}, 0, Gpu},
    };
    return cases;
}

// The cases of one op that run in a mode.
inline std::vector<Case> of(const std::string& op, Mode mode) {
    std::vector<Case> out;
    for (const Case& c : all())
        if (op == c.op && (c.modes & mode)) out.push_back(c);
    return out;
}

}  // namespace op_cases
