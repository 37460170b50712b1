// Model's private structs (model.h declares them): a layer's and a chunk's activations for one
// micro-batch, and the scratch buffers shared by every slot and chunk. Internal to llmc/model:
// model.cpp carves and uses them, model_moe.cpp's MoE layers use theirs.
#pragma once
#include <vector>

#include "llmc/model/model.h"
#include "llmc/model/moe.h"
#include "llmc/parallel/context_parallel.h"

// One layer's saved activations for one micro-batch. nl = rows of the residual stream this
// rank holds (N, or N/tp with sequence parallelism); the TP-split ones hold N rows of 1/tp width.
struct Model::LayerActs {
    Tensor ln1, qkv, atty, residual2, ln2, fch_pre, fch_gelu, residual3;
    float *ln1_mean = nullptr, *ln1_rstd = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr, *att_lse = nullptr;
    // MoE layers (model.moe): fch_pre and fch_gelu hold the permuted rows (up to N * top_k),
    // expert by expert; xperm and yperm the experts' inputs and outputs in the same rows.
    Tensor router_logits, xperm, yperm;
    // fp8 (the model built for it): each dense linear's Fp8Stash (by Fp8Linear), the transposed
    // cast of its input that the forward leaves for the backward
    Fp8Stash fp8[4];
    float *probs = nullptr, *gate = nullptr;           // [N, E], [N, K]
    int32_t *expert = nullptr, *row_of = nullptr;      // [N, K] (backend memory)
    std::vector<int> count, offset;                    // the last forward's expert rows (host; expert-major under ep)
    MoeEpRoute route;                                  // expert parallelism: the last forward's route
    std::vector<float> daux;                           // d (coef * aux * dloss * N) / d probs[n, e]
};

// A chunk's activations for one micro-batch in flight.
struct Model::SlotActs {
    Tensor input;  // the residual stream entering the chunk (the embedding's output in the first chunk)
    std::vector<LayerActs> layers;
    Tensor lnf, logits;  // the head (last chunk of the model only)
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
    int32_t *tokens = nullptr, *targets = nullptr;  // backend copies of this micro-batch's ids
    int b = 0, t = 0;
    float dloss = 0.0f;  // the forward's (Full recompute repeats MoE layers with it)
    bool have_dlogits = false;
    // activation offload: the host copies of the layers' inputs (layer i of the chunk's at i), and
    // whether the last forward made them (a forward with dloss != 0)
    std::vector<void*> kept;
    bool offloaded = false;
};

// Buffers one op sequence at a time uses, shared by every slot and chunk.
struct Model::Scratch {
    Tensor full, full_grad;  // [N, C]: gathered LayerNorm outputs / gathered residual gradients (SP)
    Tensor partial;          // [N, C]: row-parallel outputs and column-parallel input gradients before the TP reduction
    Tensor rows;             // [nl, C]: the reduce-scattered result (SP)
    Tensor dresidual;        // [nl, C]: the residual stream's gradient
    Tensor dqkv, datty, dfch;
    Tensor dpre;             // [N, 2F/tp]: the gradient of the gated MLP's input (SwiGLU)
    Tensor ln_grads;         // [2C]: one LayerNorm's weight and bias gradients before the TP reduction (SP)
    // MoE layers: the permuted rows' gradients [N K, C], the router logits' [N, E], the gates'
    // [N K] and the load-balancing loss's d/dprobs [E]
    Tensor dperm, drouter;
    float *dgate = nullptr, *daux = nullptr;
    // Expert parallelism: rows on their way (the local permuted rows, the experts' outputs, the
    // experts' output gradients), max(N K, received rows) x C
    Tensor erows;
    float* stats = nullptr;  // [N, 3]: vocabulary-parallel cross-entropy statistics
    // Context parallelism (cp > 1): the ring's blocks in flight, and this rank's rows of the
    // position table and of its gradient ([T, C]: learned positions only).
    RingBuffers ring;
    Tensor wpe, dwpe;
    // Recompute: the buffers of a layer's activations that every layer shares (the attention core's
    // and the activation's outputs with Selective; a whole set with Full), empty otherwise.
    LayerActs recomputed{};
    // fp8 with a GELU MLP (no layer keeps its GELU output): the GELU output of a forward whose rows
    // the fp8 GEMM cannot take, used within its layer
    Tensor gelu_out;
    // Activation offload: the residual stream between layers, [nl, C] each (layer i's input in
    // staging[i % 2]); empty otherwise.
    Tensor staging[2];
};
