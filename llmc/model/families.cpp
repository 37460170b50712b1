// The model families' parameter declarations (llmc/model/param_table.h): the one place that knows
// which tensors a family has, their shapes, splits and initialisation. The blocks that use
// them are in llmc/model/model.cpp (one pre-norm transformer block, configured per family).
#include <cmath>

#include "llmc/core/common.h"
#include "llmc/model/param_table.h"

namespace {

TensorDecl decl(Role role, const char* name, ModelPart part, size_t rows, size_t cols, TpSplit split, bool decay,
                float init_std, float init_value = 0.0f, int stride = 1) {
    return TensorDecl{role, name, part, rows, cols, split, stride, decay, init_std, init_value, rows, "", false};
}

// Places a per-layer declaration in the dense layers only (the MoE layers' experts replace it).
TensorDecl dense(TensorDecl d) {
    d.layers = LayerSet::Dense;
    return d;
}
// A declaration of the MoE layers: the router (per_expert false) or one of each expert's tensors.
TensorDecl moe(TensorDecl d, bool per_expert) {
    d.layers = LayerSet::Moe;
    d.per_expert = per_expert;
    return d;
}

// GPT-2 as llm.c lays it out: learned positions, LayerNorms with biases, a fused QKV projection,
// a GELU MLP of width 4C, the LM head tied to wte. Init: N(0, 0.02), the residual projections
// N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1, padded vocabulary rows 0. In Hugging Face's
// format the names are GPT2LMHeadModel's and its Conv1D weights (c_attn, c_proj, c_fc) are
// stored transposed.
std::vector<TensorDecl> gpt2_tensors(const ModelShape& s) {
    using P = ModelPart;
    using S = TpSplit;
    const size_t C = size_t(s.d_model), Vp = size_t(s.padded_vocab);
    const float sd = 0.02f, sd_resid = 0.02f / std::sqrt(2.0f * float(s.n_layer));
    auto hf = [](TensorDecl d, const char* hf_name, bool transposed = false) {
        d.hf_name = hf_name;
        d.hf_transposed = transposed;
        return d;
    };
    std::vector<TensorDecl> t = {
        hf(decl(TokEmb, "wte", P::Embedding, Vp, C, S::Vocab, true, sd), "transformer.wte.weight"),
        hf(decl(PosEmb, "wpe", P::Embedding, size_t(s.max_seq_len), C, S::Replicated, true, sd),
           "transformer.wpe.weight"),
        hf(decl(Norm1W, "h.%d.ln1w", P::Layer, C, 1, S::Replicated, false, 0.0f, 1.0f), "transformer.h.%d.ln_1.weight"),
        hf(decl(Norm1B, "h.%d.ln1b", P::Layer, C, 1, S::Replicated, false, 0.0f), "transformer.h.%d.ln_1.bias"),
        hf(decl(QkvW, "h.%d.qkvw", P::Layer, 3 * C, C, S::Column, true, sd, 0.0f, 3),
           "transformer.h.%d.attn.c_attn.weight", true),
        hf(decl(QkvB, "h.%d.qkvb", P::Layer, 3 * C, 1, S::Column, false, 0.0f, 0.0f, 3),
           "transformer.h.%d.attn.c_attn.bias"),
        hf(decl(AttnOutW, "h.%d.attprojw", P::Layer, C, C, S::Row, true, sd_resid),
           "transformer.h.%d.attn.c_proj.weight", true),
        hf(decl(AttnOutB, "h.%d.attprojb", P::Layer, C, 1, S::Replicated, false, 0.0f),
           "transformer.h.%d.attn.c_proj.bias"),
        hf(decl(Norm2W, "h.%d.ln2w", P::Layer, C, 1, S::Replicated, false, 0.0f, 1.0f), "transformer.h.%d.ln_2.weight"),
        hf(decl(Norm2B, "h.%d.ln2b", P::Layer, C, 1, S::Replicated, false, 0.0f), "transformer.h.%d.ln_2.bias"),
        dense(hf(decl(FcW, "h.%d.fcw", P::Layer, 4 * C, C, S::Column, true, sd), "transformer.h.%d.mlp.c_fc.weight", true)),
        dense(hf(decl(FcB, "h.%d.fcb", P::Layer, 4 * C, 1, S::Column, false, 0.0f), "transformer.h.%d.mlp.c_fc.bias")),
        dense(hf(decl(FcOutW, "h.%d.fcprojw", P::Layer, C, 4 * C, S::Row, true, sd_resid),
                 "transformer.h.%d.mlp.c_proj.weight", true)),
        dense(hf(decl(FcOutB, "h.%d.fcprojb", P::Layer, C, 1, S::Replicated, false, 0.0f),
                 "transformer.h.%d.mlp.c_proj.bias")),
    };
    // MoE layers (model.moe): a router and experts that are the MLP above at width expert_ffn_dim
    // (no transformers names: stored under these names in safetensors too)
    if (s.moe.enabled()) {
        const size_t E = size_t(s.moe.num_experts), Fe = size_t(s.moe.expert_ffn_dim);
        t.push_back(moe(decl(RouterW, "h.%d.moe.router", P::Layer, E, C, S::Replicated, true, sd), false));
        t.push_back(moe(decl(FcW, "h.%d.moe.e%d.fcw", P::Layer, Fe, C, S::Column, true, sd), true));
        t.push_back(moe(decl(FcB, "h.%d.moe.e%d.fcb", P::Layer, Fe, 1, S::Column, false, 0.0f), true));
        t.push_back(moe(decl(FcOutW, "h.%d.moe.e%d.fcprojw", P::Layer, C, Fe, S::Row, true, sd_resid), true));
        t.push_back(moe(decl(FcOutB, "h.%d.moe.e%d.fcprojb", P::Layer, C, 1, S::Replicated, false, 0.0f), true));
    }
    t.push_back(hf(decl(NormFW, "lnfw", P::Head, C, 1, S::Replicated, false, 0.0f, 1.0f), "transformer.ln_f.weight"));
    t.push_back(hf(decl(NormFB, "lnfb", P::Head, C, 1, S::Replicated, false, 0.0f), "transformer.ln_f.bias"));
    t[0].init_rows = size_t(s.vocab_size);
    return t;
}

// Llama as transformers' LlamaForCausalLM names it: RMSNorms without bias, separate q/k/v
// projections (grouped-query: k and v have n_kv_head heads), a SiLU-gated MLP of width
// ffn_dim, no biases, rotary positions (no tensor), an untied LM head unless tie_embeddings.
// Init: N(0, 0.02) for every 2-D weight, norm weights 1, padded vocabulary rows 0. Weight decay
// on every 2-D weight, embeddings and head included; none on the norms.
std::vector<TensorDecl> llama_tensors(const ModelShape& s) {
    using P = ModelPart;
    using S = TpSplit;
    const size_t C = size_t(s.d_model), Vp = size_t(s.padded_vocab), HS = size_t(s.head_dim());
    const size_t Q = size_t(s.n_head) * HS, KV = size_t(s.kv_heads()) * HS, F = size_t(s.ffn());
    const float sd = 0.02f;
    std::vector<TensorDecl> t = {
        decl(TokEmb, "model.embed_tokens.weight", P::Embedding, Vp, C, S::Vocab, true, sd),
        decl(Norm1W, "model.layers.%d.input_layernorm.weight", P::Layer, C, 1, S::Replicated, false, 0.0f, 1.0f),
        decl(QW, "model.layers.%d.self_attn.q_proj.weight", P::Layer, Q, C, S::Column, true, sd),
        decl(KW, "model.layers.%d.self_attn.k_proj.weight", P::Layer, KV, C, S::Column, true, sd),
        decl(VW, "model.layers.%d.self_attn.v_proj.weight", P::Layer, KV, C, S::Column, true, sd),
        decl(AttnOutW, "model.layers.%d.self_attn.o_proj.weight", P::Layer, C, Q, S::Row, true, sd),
        decl(Norm2W, "model.layers.%d.post_attention_layernorm.weight", P::Layer, C, 1, S::Replicated, false, 0.0f,
             1.0f),
        dense(decl(GateW, "model.layers.%d.mlp.gate_proj.weight", P::Layer, F, C, S::Column, true, sd)),
        dense(decl(UpW, "model.layers.%d.mlp.up_proj.weight", P::Layer, F, C, S::Column, true, sd)),
        dense(decl(FcOutW, "model.layers.%d.mlp.down_proj.weight", P::Layer, C, F, S::Row, true, sd)),
    };
    // MoE layers (model.moe) as transformers' MixtralForCausalLM names them: the router `gate`,
    // and per expert w1 (gate), w3 (up), w2 (down) of width expert_ffn_dim
    if (s.moe.enabled()) {
        const size_t E = size_t(s.moe.num_experts), Fe = size_t(s.moe.expert_ffn_dim);
        const std::string x = "model.layers.%d.block_sparse_moe.";
        t.push_back(moe(decl(RouterW, (x + "gate.weight").c_str(), P::Layer, E, C, S::Replicated, true, sd), false));
        t.push_back(moe(decl(GateW, (x + "experts.%d.w1.weight").c_str(), P::Layer, Fe, C, S::Column, true, sd), true));
        t.push_back(moe(decl(UpW, (x + "experts.%d.w3.weight").c_str(), P::Layer, Fe, C, S::Column, true, sd), true));
        t.push_back(moe(decl(FcOutW, (x + "experts.%d.w2.weight").c_str(), P::Layer, C, Fe, S::Row, true, sd), true));
    }
    t.push_back(decl(NormFW, "model.norm.weight", P::Head, C, 1, S::Replicated, false, 0.0f, 1.0f));
    t[0].init_rows = size_t(s.vocab_size);
    if (!s.tie_embeddings) {
        t.push_back(decl(HeadW, "lm_head.weight", P::Head, Vp, C, S::Vocab, true, sd));
        t.back().init_rows = size_t(s.vocab_size);
    }
    return t;
}

}  // namespace

const char* arch_name(Arch a) { return a == Arch::Llama ? "llama" : "gpt2"; }

std::vector<TensorDecl> model_tensors(const ModelShape& s) {
    switch (s.arch) {
        case Arch::GPT2: return gpt2_tensors(s);
        case Arch::Llama: return llama_tensors(s);
    }
    LLMC_ASSERT(false, "unknown model family");
    return {};
}
