// GPT-2: the parameter table, one allocation per category, and the forward/backward
// of the whole model written once over Ops.
//
// Memory layout of the parameters is per layer ([wte, wpe] [layer 0] ... [layer L-1]
// [lnf]) so that a layer's parameters are contiguous (what pipeline stages and ZeRO-3
// gathers want). The llm.c checkpoint order (all wte, all wpe, every layer's ln1w, ...)
// is a different permutation of the same tensors; set_params_llmc/get_params_llmc map
// between the two.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmc/ops.h"
#include "llmc/tensor.h"

struct ModelShape {
    int n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, padded_vocab = 0, max_seq_len = 0;
    bool operator==(const ModelShape& o) const {
        return n_layer == o.n_layer && n_head == o.n_head && d_model == o.d_model && vocab_size == o.vocab_size &&
               padded_vocab == o.padded_vocab && max_seq_len == o.max_seq_len;
    }
};

// The 16 parameter kinds of GPT-2, in llm.c checkpoint order.
enum ParamKind { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB,
                 NUM_PARAM_KINDS };

struct ParamSpec {
    std::string name;  // e.g. "h.3.qkvw", "wte"
    ParamKind kind;
    int layer;          // -1 for wte/wpe/lnf
    size_t offset;      // element offset in the parameter (and gradient) buffer
    size_t numel;
    bool decay;         // weight decay applies (the 2-D weights)
    size_t llmc_offset; // element offset in llm.c checkpoint order
};

size_t gpt2_num_params(const ModelShape& s);  // including the padded vocab rows

class GPT2 {
public:
    // pad_multiple: the parameter and gradient buffers hold num_params rounded up to a multiple
    // of it (zeros that belong to no tensor), so that ZeRO shards divide them evenly.
    GPT2(const ModelShape& shape, Ops& ops, DType dtype, int B, int T, size_t pad_multiple = 1);
    ~GPT2();
    GPT2(const GPT2&) = delete;
    GPT2& operator=(const GPT2&) = delete;

    const ModelShape shape;
    Ops& ops;
    const DType dtype;  // parameters, gradients and activations
    const int B, T;     // the activation buffers' size

    std::vector<ParamSpec> params;  // memory order
    size_t num_params = 0;     // elements of the real tensors
    size_t padded_params = 0;  // elements of param_buf and grad_buf (num_params + zero padding)
    Tensor param_buf;  // one allocation
    Tensor grad_buf;   // one allocation
    size_t activation_bytes = 0;

    Tensor param(ParamKind k, int layer = -1) const;
    Tensor grad(ParamKind k, int layer = -1) const;

    // Host fp32 arrays in llm.c checkpoint order, num_params elements.
    void set_params_llmc(const float* host);
    void get_params_llmc(float* host) const;
    // Host fp32 arrays: memory order (padded_params elements) <-> llm.c order (num_params).
    std::vector<float> to_llmc_order(const std::vector<float>& mem) const;
    std::vector<float> from_llmc_order(const float* llmc) const;
    void get_grads_llmc(float* host) const;
    // N(0, 0.02); residual projections N(0, 0.02/sqrt(2L)); biases 0; LN weights 1; padded rows 0.
    void init_random(uint64_t seed);

    void zero_grads();
    // tokens/targets: host arrays of b*t ids (b <= B, t <= T). Returns the mean loss over
    // the b*t tokens (targets may be null: logits only, returns 0). If dloss != 0, the
    // classifier leaves d(dloss * sum of token losses)/dlogits for backward().
    float forward(const int32_t* tokens, const int32_t* targets, int b, int t, float dloss);
    // Accumulates parameter gradients for the last forward (which must have had dloss != 0).
    // grads_ready (optional) is called as backward proceeds with an element offset o: from here
    // on no gradient at or above o changes (data parallelism launches its buckets from it).
    void backward(const std::function<void(size_t)>& grads_ready = {});
    // Row (b, t) of the last forward's logits, vocab_size values (valid only after a forward with dloss == 0).
    void get_logits(int b, int t, float* host_row) const;

private:
    struct Acts;
    Acts* acts_ = nullptr;
    void* act_mem_ = nullptr;
    int32_t* tokens_dev_ = nullptr;
    int32_t* targets_dev_ = nullptr;
    int cur_b_ = 0, cur_t_ = 0;
    bool have_dlogits_ = false;
};
