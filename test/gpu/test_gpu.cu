// Op-parity test of the CUDA backend against the CPU reference backend (like ggml's
// test-backend-ops). For every op, forward and backward, fp32, bf16 and fp16:
//  - fresh random inputs (for bf16 and fp16, rounded to the dtype first, so both backends see the
//    same values), several shapes including odd ones;
//  - GPU outputs poisoned (all bytes 0xFF = NaN in fp32, bf16 and fp16) before each run, so an
//    unwritten element fails; accumulate-outputs start from the same random values on
//    both backends instead;
//  - the GPU op runs twice and the two results must be bitwise identical (determinism); with
//    LLMC_GPU_DIGEST=FILE each such result's hash is written to FILE, so that two processes can
//    be compared (scripts/gpu_check.sh's ops stage compares its plain and its memcheck run);
//  - GPU vs CPU: norm-relative error ||gpu - cpu|| / ||cpu|| <= 1e-4 (fp32) / 2e-2 (bf16) / 2e-3 (fp16);
//    fp32 statistics (mean, rstd, lse, losses, master weights, moments) <= 1e-4 / 1e-3.
// Attention is also compared row by row (each head's output row, each dqkv row), so that one bad
// row cannot hide in a norm over many. The whole GPT-2 in fp32 against the committed PyTorch
// debug state (test_reference: loss, logits, gradients, the AdamW steps' losses and norms). Also
// optimizer offload: AdamW on the host (llmc/model/optimizer.h) against AdamW on the GPU (test_offload).
// One whole training step of a small GPT-2 and Llama against the CPU backend (model_step), and on the
// GPU activation offload against none, bit for bit.
// `test_gpu big` runs only the large cases (logits past 2^31 elements), which are too slow under
// compute-sanitizer and are left out of the default run.
// Prints one line per check and "N passed, M failed"; exit code 1 on any failure. Every case runs
// guarded, with checks_throw() set: a failed CUDA/cuBLASLt check, LLMC_ASSERT or an exception
// inside a case is one FAIL line naming the case, and the next case runs (after a sticky CUDA
// error, such as an illegal address, the later cases fail too: the device is lost).
// Prints "GPU tests: skipped (no CUDA device)" and exits 0 without a device.
// The cases live in test/gpu/cases_*.cuh (ops, attention, fp8, model, ptx), the harness in
// harness.h; this file is their one translation unit (each part alone cost nvcc the same ~14 s of
// headers again) and main, which runs the filters.
#include <cstring>
#include <memory>

#include "llmc/cuda/common.cuh"
#include "llmc/cuda/flash_attention.cuh"
#include "test/gpu/harness.h"
#include "test/gpu/cases_ops.cuh"
#include "test/gpu/cases_attention.cuh"
#include "test/gpu/cases_fp8.cuh"
#include "test/gpu/cases_model.cuh"
#include "test/gpu/cases_ptx.cuh"

using namespace gpu_test;

int main(int argc, char** argv) {
    // LLMC_TEST_GPU_ON_CPU=1: the CPU backend stands in for the GPU (every comparison is then CPU
    // against CPU): checks this harness itself (its cases, indexing, digests) on a machine without one
    const bool on_cpu = std::getenv("LLMC_TEST_GPU_ON_CPU") && std::string(std::getenv("LLMC_TEST_GPU_ON_CPU")) == "1";
    if (!on_cpu && !cuda_device_available()) {
        std::printf("GPU tests: skipped (no CUDA device)\n");
        return 0;
    }
    checks_throw() = true;  // a failed check ends its case (a FAIL line), not the process
    std::unique_ptr<Ops> cpu = make_cpu_ops();
    std::unique_ptr<Ops> gpu = on_cpu ? make_cpu_ops() : make_cuda_ops(0);
    if (on_cpu) {
        std::printf("GPU tests with the CPU backend in the GPU's place (LLMC_TEST_GPU_ON_CPU=1)\n");
    } else {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("GPU tests on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    }
    const std::string only = argc > 1 ? argv[1] : "";  // optional filter: encoder, layernorm, rope, ...
    auto want = [&](const char* s) { return only.empty() || only == s; };
    if (only == "big") {  // the large cases alone (not in the default run: too slow under compute-sanitizer)
        H h(*cpu, *gpu, on_cpu ? DType::F32 : DType::BF16, 3);
        guarded("cross_entropy_big", [&] { test_cross_entropy_big(h); });
        std::printf("%d passed, %d failed\n", g_pass, g_fail);
        return g_fail ? 1 : 0;
    }

    // (the CPU backend computes in fp32 only: in its place, fp32 alone). LLMC_TEST_DTYPES (e.g.
    // "fp32,bf16") runs only the dtypes it names (test/cuemu/run.sh's second schedule leaves fp16 out).
    // names(list, d): a comma-separated list of dtype names ("fp32,bf16") holds d's
    auto names = [](const char* list, DType d) {
        return ("," + std::string(list) + ",").find("," + std::string(dtype_name(d)) + ",") != std::string::npos;
    };
    std::vector<DType> dtypes;
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
        const char* only_dt = std::getenv("LLMC_TEST_DTYPES");
        if ((on_cpu && d != DType::F32) || (only_dt && !names(only_dt, d))) continue;
        dtypes.push_back(d);
    }
    for (DType dt : dtypes) {
        H h(*cpu, *gpu, dt, dt == DType::F32 ? 1 : dt == DType::BF16 ? 2 : 5);
        // every case of the op-case table marked Gpu (test/op_cases.h)
        // LLMC_TEST_SKIP_LONG=1 leaves out the cases marked Long (the emulator's second schedule);
        // LLMC_TEST_LONG_DTYPES (e.g. "fp32,bf16") runs them only in the dtypes it names (the first
        // schedule: fp16's are bf16's templates, 25 s of T = 1024 attention there)
        static const bool skip_long_always =
            std::getenv("LLMC_TEST_SKIP_LONG") && std::string(std::getenv("LLMC_TEST_SKIP_LONG")) == "1";
        const char* long_dt = std::getenv("LLMC_TEST_LONG_DTYPES");
        const bool skip_long = skip_long_always || (long_dt && !names(long_dt, dt));
        auto run = [&](const char* op, const char* filter, const std::function<void(const op_cases::Case&)>& f) {
            if (!want(filter)) return;
            int i = 0;
            for (const op_cases::Case& c : op_cases::of(op, op_cases::Gpu)) {
                // each case draws its inputs from its own seed (dtype, filter, index): the same values
                // whatever ran before it (a filter alone, a case left out)
                h.rng = Rng(fnv1a(filter, std::strlen(filter)) ^ (uint64_t(i) << 8) ^ uint64_t(dt));
                if (skip_long && (c.modes & op_cases::Long)) {
                    i++;
                    continue;
                }
                guarded(strfmt("%s case %d", filter, i++), [&] { f(c); });
            }
        };
        using C = op_cases::Case;
        run("encoder", "encoder", [&](const C& c) { test_encoder(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3]); });
        run("encoder_slice", "encoder_slice", [&](const C& c) {
            test_encoder_slice(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5], c.dims[6] != 0);
        });
        run("layernorm", "layernorm",
            [&](const C& c) { test_layernorm(h, c.dims[0], c.dims[1], c.dims.size() > 2 ? c.dims[2] : 0); });
        // (CUDA's rule: the backward's shared-memory accumulators bound d_model; the CPU has none)
        if (want("layernorm") && !on_cpu) guarded("layernorm_too_wide", [&] { test_layernorm_too_wide(h); });
        // (16-bit dtypes: fp32 copies are one memcpy; the CPU backend keeps fp32 only)
        if (want("host_copies") && !on_cpu && dt != DType::F32) guarded("host_copies", [&] { test_host_copies(h); });
        run("residual", "residual",
            [&](const C& c) { test_residual(h, size_t(c.dims[0]), c.dims.size() > 1 ? c.dims[1] : 0); });
        run("matmul", "matmul", [&](const C& c) {
            test_matmul(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0, c.dims[4] != 0, c.dims[5],
                        c.dims.size() > 6 ? c.dims[6] : 0);
        });
#ifdef LLMC_CUEMU
        // The cases again on a backend whose (emulated) cuBLASLt refuses the GELU-aux and
        // bias-gradient epilogues, as a GPU with no algorithm for them would: CudaOps's kernels
        // in their place (a fresh backend: the algorithm choices are its own), against the CPU.
        if (want("matmul") && !on_cpu) {
            setenv("CUEMU_LT_REFUSE_EPILOGUES", "1", 1);
            std::unique_ptr<Ops> plain = make_cuda_ops(0);
            {
                H hp(*cpu, *plain, dt, dt == DType::F32 ? 3 : dt == DType::BF16 ? 4 : 6);
                int i = 0;
                for (const C& c : op_cases::of("matmul", op_cases::Gpu))
                    guarded(strfmt("matmul (kernels for the epilogues) case %d", i++), [&] {
                        test_matmul(hp, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0, c.dims[4] != 0, c.dims[5],
                                    c.dims.size() > 6 ? c.dims[6] : 0, " kernels");
                    });
            }
            unsetenv("CUEMU_LT_REFUSE_EPILOGUES");
        }
#endif
        // "attention" runs the multi-head cases, "attention_gqa" the grouped-query ones
        run("attention", "attention", [&](const C& c) {
            if (c.dims[2] == c.dims[3]) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        run("attention", "attention_gqa", [&](const C& c) {
            if (c.dims[2] != c.dims[3]) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        // the flash forward's two m-tiles a warp where the trainer does not take them (Q reloaded
        // from shared memory; dev/cuda/attention_forward v5 above head size 64, v6 at 64 with
        // 128-key tiles; the trainer's choices until a GPU has timed them)
        // (bf16 and fp16 only, here and in attention_bwd32: fp32 runs the general kernels, which
        // `attention` tests; on the emulator T <= 257: T = 1024 is the same tile loops with more
        // tiles, which `attention` runs there with the trainer's choices; 7-11 s a case in bf16)
        const bool flash_dtype = dt != DType::F32;
#ifdef LLMC_CUEMU
        const int variant_max_t = 257;
#else
        const int variant_max_t = 1 << 30;
#endif
        // (each variant on this CudaOps's ways, then its defaults again)
        auto ways = [&](const KernelWays& w) { set_cuda_kernel_ways(*gpu, w); };
        KernelWays w;
        w.fwd_rows_per_warp = 32;
        run("attention", "attention_mt2", [&](const C& c) {
            const int hs = c.dims[4];
            if (!flash_dtype || hs % 16 || hs > 128 || hs < 64 || (hs == 64 && c.dims[1] > 257) ||
                c.dims[1] > variant_max_t)
                return;
            w.fwd_key_tile = hs == 64 ? 128 : 0;
            ways(w);
            test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], hs);
        });
        w = KernelWays();
        // the flash backward's ways that `attention` does not take (its choice: dev/cuda/attention_backward
        // v6 at head size 64, two m-tiles at 32, v3 above): the 32-row tiles, 16 rows a warp, that a
        // device short of shared memory (sm_86/sm_89 at head size 128) runs (v5); the dK/dV kernel's
        // two passes of 32 query columns at head size 128 (v6); at head size 64 two m-tiles (v4) and
        // one pass (v3); dQ from dS^T in memory (v7)
        w.bwd_rows_per_warp = 16, w.bwd_tile = 32;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= 257 && c.dims[4] % 16 == 0 && c.dims[4] >= 32 && c.dims[4] <= 128)
                test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        w.bwd_tile = 0, w.bwd_pass = 32;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= 257 && c.dims[4] == 128) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        for (int rows : {32, 16}) {
            w.bwd_rows_per_warp = rows, w.bwd_pass = 64;
            ways(w);
            run("attention", "attention_bwd32", [&](const C& c) {
                if (flash_dtype && c.dims[1] <= 257 && c.dims[4] == 64) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
            });
        }
        // dQ from the dS^T the dK/dV kernel writes (v7) at head sizes 64 and 128, every GQA case
        w = KernelWays();
        w.bwd_dq = 1;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= variant_max_t && (c.dims[4] == 64 || c.dims[4] == 128)) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        // one kernel, dQ in fp32 accumulators (v8) at head sizes 64 and 128: the splits the device's size
        // chooses (several for these small grids), then one split
        if (want("attention_fused") && dt == DType::BF16) guarded("attention_fused splits", [&] { test_fused_splits(); });
        w.bwd_dq = 2;
        for (int splits : {0, 1}) {
            w.fused_splits = splits;
            ways(w);
            run("attention", "attention_fused", [&](const C& c) {
                if (flash_dtype && c.dims[1] <= variant_max_t && (c.dims[4] == 64 || c.dims[4] == 128))
                    test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
            });
        }
        // the flash forward and the backward on Hopper's wgmma at head sizes 64 and 128, the
        // multi-head, grouped-query and ring-block cases (positions): attention_forward v7 with
        // attention_backward v9 (the dQ kernel), v8 (pipelined) with v10 (the dK/dV kernel too; v12
        // at head size 128), v7 with v11 (both kernels pipelined; at 128 the dQ kernel alone, Q and
        // dO from shared memory) and v7 with v12 (K and V from shared memory) at 64; V, K, Q and dO
        // read MN-major (filter attention_wgmma_mn): v10 with v15 (v11's), v9 with v13 (v10/v12's),
        // v10 with v14 (v12's, at 64); where the build or the device has no wgmma, one SKIP line a
        // filter
        if (want("attention_wgmma") && flash_dtype) {  // the config's names for them reach KernelWays
            const KernelWays parsed = cuda_kernel_ways("wgmma", "wgmma_dq", "auto");
            const KernelWays both = cuda_kernel_ways("wgmma_pipelined", "wgmma", "auto");
            const KernelWays pipe = cuda_kernel_ways("auto", "wgmma_pipelined", "auto");
            const KernelWays ss = cuda_kernel_ways("auto", "wgmma_ss", "auto");
            const KernelWays mn = cuda_kernel_ways("wgmma", "wgmma", "auto", "mn_major");
            report(parsed.fwd_wgmma == 1 && parsed.fwd_key_tile == 0 && parsed.bwd_dq == 3 && both.bwd_dq == 4 &&
                       both.fwd_wgmma == 2 && both.fwd_key_tile == 0 && pipe.bwd_dq == 5 && pipe.fwd_wgmma == 0 &&
                       ss.bwd_dq == 6 && !ss.wgmma_mn && mn.wgmma_mn && mn.bwd_dq == 4 && mn.fwd_wgmma == 1,
                   "attention_wgmma.config", dtype_name(dt),
                   strfmt("kernels.attention_forward=wgmma, attention_backward=wgmma_dq: fwd_wgmma %d, "
                          "fwd_key_tile %d, bwd_dq %d; =wgmma_pipelined, =wgmma: fwd_wgmma %d, bwd_dq %d; "
                          "attention_backward=wgmma_pipelined: bwd_dq %d; =wgmma_ss: %d, wgmma_mn %d; "
                          "attention_wgmma_layout=mn_major: %d",
                          parsed.fwd_wgmma, parsed.fwd_key_tile, parsed.bwd_dq, both.fwd_wgmma, both.bwd_dq,
                          pipe.bwd_dq, ss.bwd_dq, (int)ss.wgmma_mn, (int)mn.wgmma_mn));
        }
        struct WgPass {
            int fwd, bwd;  // KernelWays::fwd_wgmma, bwd_dq
            bool mn;       // KernelWays::wgmma_mn: its own filter (an abort on a GPU ends only it)
        };
        auto wgmma_skip = [&](const char* filter, bool wanted) {
            if (wanted && flash_dtype && !flash::wgmma_available())
                std::printf("SKIP %s [%s]: not an sm_90 device with sm_90a code\n", filter, dtype_name(dt));
        };
        wgmma_skip("attention_wgmma", want("attention_wgmma"));
        wgmma_skip("attention_wgmma_mn", want("attention_wgmma_mn"));
        // (the pipelined passes first: a kernel that fails in several fails there soonest; the MN
        // passes in bf16 alone, fp16 being the same templates with another type, which the
        // transposed passes and ptx.wgmma_mn_major run)
        if (flash::wgmma_available())
            for (const WgPass p : {WgPass{2, 4, false}, WgPass{1, 5, false}, WgPass{1, 3, false}, WgPass{1, 6, false},
                                   WgPass{2, 5, true}, WgPass{1, 4, true}, WgPass{2, 6, true}}) {
                if (p.mn && dt == DType::F16) continue;
                const char* filter = p.mn ? "attention_wgmma_mn" : "attention_wgmma";
                const int bwd = p.bwd;
                w = KernelWays();
                w.fwd_wgmma = p.fwd;
                w.bwd_dq = bwd;
                w.wgmma_mn = p.mn;
                ways(w);
                // (at head size 128, 6 is 4's kernels)
                auto hs_ok = [&](int hs) { return hs == 64 || (hs == 128 && bwd != 6); };
                run("attention", filter, [&](const C& c) {
                    if (flash_dtype && c.dims[1] <= variant_max_t && hs_ok(c.dims[4]))
                        test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
                });
                run("attention_ring", filter, [&](const C& c) {
                    if (flash_dtype && c.dims[1] <= variant_max_t && hs_ok(c.dims[4]))
                        test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
                });
            }
        w = KernelWays();
        ways(w);
        run("rmsnorm", "rmsnorm", [&](const C& c) { test_rmsnorm(h, c.dims[0], c.dims[1], c.x); });
        run("rope", "rope", [&](const C& c) {
            test_rope(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.x, SeqPositions());
            // two runs of positions (a context-parallel rank's rows)
            test_rope(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.x,
                      SeqPositions{7, 3 * c.dims[1] + 1, c.dims[1] / 2});
        });
        run("attention_ring", "attention_ring", [&](const C& c) {
            test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
        });
        // the same blocks with dQ from the dS^T in memory (attention_backward v7: positions, +=)
        for (int dq : {1, 2}) {  // and with the fused kernel (v8)
            w.bwd_dq = dq;
            ways(w);
            run("attention_ring", "attention_ring", [&](const C& c) {
                if (c.dims[4] == 64 || c.dims[4] == 128)
                    test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
            });
        }
        ways(KernelWays());
        run("swiglu", "swiglu", [&](const C& c) { test_swiglu(h, c.dims[0], c.dims[1]); });
        run("moe", "moe", [&](const C& c) {
            test_moe(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4] ? c.dims[4] : c.dims[0] * c.dims[2]);
        });
        run("cross_entropy", "cross_entropy",
            [&](const C& c) { test_cross_entropy(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0); });
        // (CUDA's contract for a target outside [0, V): a NaN loss; the CPU backend's reference
        // refuses such a target as an internal error, so the case has no CPU stand-in)
        if (want("cross_entropy") && !on_cpu)
            guarded("cross_entropy_bad_targets", [&] { test_cross_entropy_bad_targets(h); });
        run("cross_entropy_vp", "cross_entropy_vp", [&](const C& c) {
            test_cross_entropy_vocab_parallel(h, c.dims[0], c.dims[1], c.dims[2],
                                              std::vector<int>(c.dims.begin() + 4, c.dims.end()), c.dims[3] != 0);
        });
        run("adamw", "adamw", [&](const C& c) { test_adamw(h, size_t(c.dims[0]), c.dims[1] != 0, c.dims[2]); });
        run("sum_squares", "sum_squares", [&](const C& c) { test_sum_squares(h, size_t(c.dims[0])); });
        if (want("step_ops")) guarded("step_ops", [&] { test_step_ops(h); });
        if (want("step_graph") && !on_cpu && dt == DType::F32) guarded("step_graph", [&] { test_step_graph(); });
        if (want("offload") && !on_cpu) guarded("offload", [&] { test_offload(*gpu, dt); });  // CUDA's copies
        if (want("ptx") && !on_cpu && dt == DType::BF16) {
            guarded("ptx bf16", [&] { test_ptx<bf16>(); });
            guarded("ptx fp16", [&] { test_ptx<f16>(); });
            guarded("ptx exp2", [&] { test_ptx_exp2(); });
            guarded("ptx wgmma bf16", [&] { test_ptx_wgmma<bf16>(); });
            guarded("ptx wgmma fp16", [&] { test_ptx_wgmma<f16>(); });
        }
        if (want("reference") && dt == DType::F32) guarded("reference", [&] { test_reference(*gpu); });
        if (want("model_step") && dt == DType::F32)
            guarded("model_step", [&] {
                test_model_step(*cpu, *gpu, ModelShape{2, 2, 32, 100, 128, 16}, "gpt2");
                ModelShape llama{2, 4, 64, 100, 128, 16};
                llama.arch = Arch::Llama, llama.n_kv_head = 2, llama.ffn_dim = 96, llama.tie_embeddings = false;
                test_model_step(*cpu, *gpu, llama, "llama");
                if (!on_cpu) test_model_recompute(*gpu);  // (a bf16 model: the CPU backend has fp32 only)
            });
        if (want("fp8") && dt != DType::F16) {  // (fp8 is a precision of its own, beside bf16's tensors)
            std::string why;
            if (!gpu->fp8_supported(&why)) {
                std::printf("SKIP fp8 [%s] %s\n", dtype_name(dt), why.c_str());
            } else {
                // each case guarded on its own: a GEMM cuBLASLt refuses fails that case only
                auto fp8_case = [&](int N, int IC, int OC, bool bias, bool gelu, bool current, bool hybrid,
                                    int off = 0, int off_in = 0, bool inp_gelu = false) {
                    guarded(strfmt("fp8 N=%d IC=%d OC=%d bias=%d gelu=%d current=%d hybrid=%d off=%d off_in=%d "
                                   "inp_gelu=%d",
                                   N, IC, OC, (int)bias, (int)gelu, (int)current, (int)hybrid, off, off_in,
                                   (int)inp_gelu),
                            [&] { test_fp8_matmul(h, N, IC, OC, bias, gelu, current, hybrid, off, off_in, inp_gelu); });
                };
                for (bool current : {false, true})
                    for (bool hybrid : {true, false}) {
                        fp8_case(32, 64, 48, true, false, current, hybrid);
                        fp8_case(64, 96, 384, true, true, current, hybrid);
                        fp8_case(48, 32, 16, false, false, current, hybrid);
                    }
                // the weight-gradient GEMM of the H200 report (k=64, m=48, n=32: D fp32 in place)
                fp8_case(64, 48, 32, true, true, false, false);
                // outputs not 16-byte aligned: the fp32-scratch way, forward (bias, gelu) and backward
                fp8_case(64, 48, 32, true, true, false, true, 1);
                fp8_case(32, 64, 48, true, false, true, false, 2);
                // cast inputs not 16-byte aligned: the casts element by element, delayed and current
                fp8_case(64, 96, 384, true, true, false, true, 0, 1);
                fp8_case(32, 64, 48, false, false, true, false, 0, 3);
                // the GELU in the input's casts (fp8's fc_proj): vector and element-by-element casts,
                // delayed and current
                fp8_case(64, 384, 96, true, false, false, true, 0, 0, true);
                fp8_case(32, 64, 48, true, false, true, false, 0, 1, true);
                guarded("fp8 scales", [&] { test_fp8_scales(h); });
                if (!on_cpu) guarded("fp8 bad shape", [&] { test_fp8_bad_shape(h); });  // (no CPU shape rule)
                // the large ones last (the emulator's planted bugs stop at the first FAIL: 10 s of
                // the 11 s fp32 pass there): GPT-2's shapes, and the weight-gradient GEMM's k is the
                // token count: 16k and 64k tokens
                fp8_case(256, 768, 2304, true, false, false, true);
                fp8_case(128, 768, 3072, true, true, true, true);
                fp8_case(16384, 64, 128, true, false, false, true);
                fp8_case(65536, 64, 64, false, false, true, true);
            }
        }
    }
    if (const char* path = std::getenv("LLMC_GPU_DIGEST")) {  // the determinism-checked results, for another process
        FILE* f = std::fopen(path, "w");
        if (!f) {
            std::printf("FAIL digest: cannot write LLMC_GPU_DIGEST=%s\n", path);
            return 1;
        }
        for (const std::string& line : g_digest) std::fprintf(f, "%s\n", line.c_str());
        std::fclose(f);
    }
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

