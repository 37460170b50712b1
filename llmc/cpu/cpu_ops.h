// CpuOps: the fp32 + OpenMP reference backend of the Ops interface (llmc/backend/ops.h).
// The member functions are thin wrappers (shape and dtype checks) around the templated
// math in llmc/cpu/kernels.h, instantiated with float. They are defined one file per
// layer family: cpu_ops.cpp (memory), encoder.cpp, layernorm.cpp (and RMSNorm),
// matmul.cpp (and SwiGLU), attention.cpp (and RoPE), classifier.cpp, adamw.cpp.
#pragma once
#include "llmc/comm/device_sim.h"
#include "llmc/backend/ops.h"

class CpuOps : public Ops {
public:
    std::string name() const override { return "cpu"; }
    // (false under the test hook LLMC_SIM_DEVICE, llmc/comm/device_sim.h: the device paths run on the CPU)
    bool host_memory() const override { return !sim_device(); }

    void* alloc(size_t bytes) override;
    void release(void* p) override;
    void zero(Tensor t) override;
    void copy(Tensor dst, Tensor src) override;
    void to_host_f32(float* dst, Tensor src) override;
    void from_host_f32(Tensor dst, const float* src) override;
    void to_host_bytes(void* dst, const void* src, size_t bytes) override;
    void from_host_bytes(void* dst, const void* src, size_t bytes) override;
    void synchronize() override { ++counters_.host_syncs; }
    // the asynchronous copies: counted as a device's, waited for at once
    uint64_t copy_to_host_async(void* dst, const void* src, size_t bytes) override;
    uint64_t copy_from_host_async(void* dst, const void* src, size_t bytes) override;
    void wait_copy(uint64_t id) override {
        if (id) ++counters_.host_syncs;
    }

    void encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                         int vocab_begin) override;
    void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                          int vocab_begin) override;

    void layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N,
                           int C) override;
    void fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a, Tensor b,
                                          Tensor w, Tensor bias, int N, int C) override;
    void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, const float* mean,
                            const float* rstd, int N, int C) override;
    void residual_forward(Tensor out, Tensor a, Tensor b) override;

    void matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                        bool gelu) override;
    void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
                         int N, int IC, int OC, Tensor dinp_gelu = Tensor()) override;

    void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) override;
    void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                            int NH, int NKV, int HS) override;
    void attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk, int NH,
                                 int NKV, int HS, SeqPositions qp, SeqPositions kp) override;
    void attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                         int HS) override;
    void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                  const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS, SeqPositions qp,
                                  SeqPositions kp) override;
    void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override;
    void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override;

    void rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) override;
    void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                          int C) override;
    void swiglu_forward(Tensor out, Tensor inp, int N, int F) override;
    void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) override;

    void cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                       float dloss) override;
    void cross_entropy_partial(float* stats, Tensor logits, const int32_t* targets, int N, int Vl, int vocab_begin,
                               int V) override;
    void cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets, int N, int Vl,
                              int vocab_begin, int V, float dloss) override;

    void cross_entropy_stats(int phase, float* stats, float* mx, float* rest, size_t rows) override;

    // mixture of experts (llmc/cpu/moe.cpp)
    void moe_router_forward(float* probs, int32_t* expert, float* gate, Tensor logits, int N, int E, int K) override;
    void moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                             const int32_t* expert, const float* gate, int N, int E, int K) override;
    void moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) override;
    void moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) override;
    void moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) override;
    void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate, const int32_t* row_of,
                              int N, int K, int C) override;

    double sum_squares(Tensor g) override;
    void sum_squares_multi(double* out, const std::vector<Tensor>& regions) override;
    void step_control(float* ctl, const double* ss, double clip, double loss_scale) override;
    void adamw_multi(const std::vector<AdamWPiece>& pieces, const float* ctl, float lr, float beta1, float beta2,
                     float eps, int t) override;
    void adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1, float beta2,
               float eps, float weight_decay, float grad_scale, int t, uint32_t seed, uint32_t index_base = 0) override;

    // fp8 emulation (llmc/cpu/fp8.cpp): exact q() casts into scratch, then the fp32 matmul (no
    // Fp8Stash: the backward casts inp again, the same values)
    bool fp8_supported(std::string* why) const override { return true; }
    void matmul_forward_fp8(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                            bool gelu, const Fp8Cast& inp_cast, const Fp8Cast& w_cast,
                            const Fp8Stash& stash = Fp8Stash()) override;
    void matmul_backward_fp8(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
                             int N, int IC, int OC, const Fp8Cast& dout_cast, const Fp8Cast& inp_cast,
                             const Fp8Cast& w_cast, const Fp8Stash& stash = Fp8Stash()) override;
    void fp8_widen_amaxes(const Fp8Device& d) override;
    void fp8_update_scales(const Fp8Device& d, bool from_wide, float* step_overflows) override;

private:
    void count_down(size_t bytes);  // a read back: bytes and a wait
    void count_up(size_t bytes);    // an upload
    uint64_t copies_ = 0;           // asynchronous copy ids handed out
};

// fp32 view of a tensor that must hold at least `need` elements (asserts dtype and size).
inline float* cpu_f32(Tensor t, size_t need, const char* what) {
    LLMC_ASSERT(t.dtype == DType::F32, std::string("cpu backend: tensor is not fp32: ") + what);
    LLMC_ASSERT(t.n >= need && (t.ptr != nullptr || need == 0),
                std::string("cpu backend: tensor too small: ") + what);
    return static_cast<float*>(t.ptr);
}

std::unique_ptr<Ops> make_cpu_ops();
