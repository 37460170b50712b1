// The ways of the CUDA kernels that have more than one: the config section "kernels" chooses among
// them (cuda_kernel_ways), test_gpu's variant filters and dev/cuda's versions force them. Each
// CudaOps holds one (set_cuda_kernel_ways) and hands it to the launchers, so that no kernel choice is
// global state. Every default is the backend's choice, what a GPU measured fastest.
// (Plain C++: llmc/cuda/cuda_ops.h includes it.)
#pragma once
#include <cstddef>

struct KernelWays {
    // flash attention forward (flash::forward): query rows a warp (16 or 32; 0: the choice) and the
    // key tile (128: 128-key tiles at head size 64, dev/cuda/attention_forward v6; 0: the choice)
    int fwd_rows_per_warp = 0, fwd_key_tile = 0;
    // ... on Hopper's warpgroup MMA where it applies (head sizes 64 and 128, sm_90a): 1 dev/cuda's v7,
    // 2 v8 (its softmax overlapping the previous tile's PV product); 0 not
    int fwd_wgmma = 0;
    // the wgmma kernels' second operands (V in the forward; K, Q and dO in the backward) read by the
    // tensor cores MN-major, as they lie, instead of from transposed copies (attention_forward
    // v9/v10, attention_backward v13-v15)
    bool wgmma_mn = false;
    // flash attention backward (flash::backward; false: attention.cuh's general kernels, dev/cuda's
    // attention_backward v1 and v2): rows a warp, tile rows and the dK/dV kernel's query columns a
    // pass (0: the choice; dev/cuda's v3-v6); dQ: 0 recomputed in its own kernel, 1 from the dS^T
    // in memory (v7), 2 the fused kernel (v8), with its splits of the key tiles (0: the choice), 3
    // its own kernel on Hopper's wgmma (v9; head sizes 64 and 128, sm_90a), 4 the dK/dV kernel on
    // wgmma too (v10 at head size 64, v12 at 128), 5 both pipelined (v11; at 128 the dQ kernel
    // alone), 6 the dK/dV kernel with K and V from shared memory (v12)
    bool flash_backward = true;
    int bwd_rows_per_warp = 0, bwd_tile = 0, bwd_pass = 0, bwd_dq = 0, fused_splits = 0;
    size_t scratch_max_bytes = size_t(2) << 30;  // v7's dS^T or v8's dQ accumulators at most (else 0)
    // LayerNorm/RMSNorm backward: rows kept in registers where d_model allows (false: every row read
    // twice, dev/cuda/layernorm v5)
    bool ln_bwd_registers = true;
    // the fused cross entropy: each row kept in shared memory between its two passes where the
    // device holds it (dev/cuda/classifier v6; false: read again, mostly from L2, v5)
    bool ce_row_in_smem = false;
};
