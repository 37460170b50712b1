// Ops: the kernel interface every backend implements (CPU reference in llmc/cpu/,
// CUDA in llmc/cuda/). The model, the optimizer and every parallel layout are written
// once over this interface; a backend only knows how to run one op on its own memory.
//
// Conventions
//  - N = B*T rows. Row-major everywhere. Linear weights are [OC, IC] (PyTorch layout):
//    out[N, OC] = inp[N, IC] @ w^T + bias.
//  - Tensors carry their dtype: fp32 on the CPU backend; fp32, bf16 or fp16 on CUDA
//    (activations, parameters and gradients share the model's dtype). Statistics that
//    must stay accurate (LayerNorm mean/rstd, attention log-sum-exp, losses, optimizer
//    state, master weights) are always fp32 and passed as float*.
//  - "accumulate" means +=, everything else overwrites. Parameter gradients always
//    accumulate (gradient accumulation over micro-steps); input gradients overwrite
//    except where stated.
//  - Token ids are int32 in backend memory.
//  - Every op is deterministic: the same inputs give bitwise the same outputs.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmc/precision/fp8.h"
#include "llmc/backend/positions.h"
#include "llmc/core/tensor.h"

// What crossed between the host and the backend's memory, and how often the host waited for the
// backend, since the backend was made (the trainer logs each step's difference: log.jsonl's
// host_syncs, h2d_bytes, d2h_bytes, launches). CUDA counts what it does; the CPU backend counts
// the same events, so that under LLMC_SIM_DEVICE (its memory stands for a device's) the tests see
// what a GPU run would move:
//  - h2d_bytes, d2h_bytes: the bytes of every copy between backend memory and host memory
//    (to_host_*, from_host_*, the asynchronous copies), as stored in backend memory;
//  - host_syncs: every wait of the host for the backend: synchronize, wait_copy of a copy, a read
//    back (to_host_*), an upload larger than kUploadNoSync (smaller ones go through a staging ring
//    and do not wait);
//  - launches: the kernels and device copies queued (CUDA: kernels, cuBLASLt calls, memsets and
//    device-to-device copies; CPU: one per op call that would be one on a device).
struct OpsCounters {
    // allocs: allocations and frees of backend memory (CUDA: every cudaMalloc and cudaFree of the
    // backend, its scratch and NCCL's included; each waits for the device, and a CUDA graph holds
    // the pointers), which a training step makes only in its first step
    uint64_t host_syncs = 0, h2d_bytes = 0, d2h_bytes = 0, launches = 0, allocs = 0;
    OpsCounters operator-(const OpsCounters& o) const {
        return {host_syncs - o.host_syncs, h2d_bytes - o.h2d_bytes, d2h_bytes - o.d2h_bytes, launches - o.launches,
                allocs - o.allocs};
    }
};

// One tensor's piece of a multi-tensor AdamW (Ops::adamw_multi): as Ops::adamw's arguments.
struct AdamWPiece {
    Tensor params;
    float* master;  // nullable
    Tensor grads;
    float *m, *v;
    float weight_decay;
    uint32_t seed, index_base;
};

// torch's clip_grad_norm_ factor: min(1, clip / (norm + 1e-6)); 1 when clip <= 0 (both backends and
// the host compute it so, in double, rounded once to float).
inline float clip_factor(double norm, double clip) {
    if (clip <= 0.0) return 1.0f;
    const double f = clip / (norm + 1e-6);
    return float(f < 1.0 ? f : 1.0);
}

// AdamW's bias corrections as torch.optim.AdamW applies them: the step size lr / (1 - beta1^t) and
// 1 / sqrt(1 - beta2^t), in double, rounded once to float (both backends compute them so). The
// update of an element is then p -= lr wd p + step m / (sqrt(v) inv_sqrt_bc2 + eps): one square
// root and one division (the CPU's AdamW is bound by those, not by memory).
struct AdamWScales {
    float step, inv_sqrt_bc2;
};
inline AdamWScales adamw_scales(float lr, float beta1, float beta2, int t) {
    return {float(double(lr) / (1.0 - std::pow(double(beta1), double(t)))),
            float(1.0 / std::sqrt(1.0 - std::pow(double(beta2), double(t))))};
}

class Ops {
public:
    virtual ~Ops() = default;
    // Uploads (from_host_*) of at most this many bytes do not wait for the backend.
    static constexpr size_t kUploadNoSync = size_t(1) << 20;
    virtual OpsCounters counters() const { return counters_; }
    virtual std::string name() const = 0;  // "cpu" or "cuda"
    // What the logs and the MFU table call the device (the GPU's name on CUDA).
    virtual std::string device_name() const { return name(); }
    // Most device memory this process has had in use so far, in bytes (0 where not tracked).
    virtual size_t peak_memory_bytes() const { return 0; }
    // The stream the ops run on (a cudaStream_t on CUDA; null on the CPU): a device communicator
    // orders its calls after the work already queued there (Comm::set_compute_stream).
    virtual void* compute_stream() const { return nullptr; }

    // ---- memory ----
    virtual void* alloc(size_t bytes) = 0;  // zero-initialised
    virtual void release(void* p) = 0;
    virtual void zero(Tensor t) = 0;
    // Backend memory, same size; converts between dtypes (fp32 <-> bf16 or fp16; the CPU holds fp32 only).
    virtual void copy(Tensor dst, Tensor src) = 0;
    // n fp32 statistics (losses) in backend memory: copied as they are, never rounded to the model's
    // dtype (the fp16 emulation rounds every Tensor copy writes, llmc/cpu/fp16_ops.h).
    virtual void copy_f32(float* dst, const float* src, size_t n) {
        copy(Tensor(dst, n, DType::F32), Tensor(const_cast<float*>(src), n, DType::F32));
    }
    // Whether this backend emulates precision "fp16" in fp32 storage (the CPU's CpuFp16Ops): the
    // model's tensors are fp32 holding fp16 values; AdamW then keeps fp32 master weights.
    virtual bool emulates_fp16() const { return false; }
    // Backend memory is host memory (a host communicator may read and write it in place).
    virtual bool host_memory() const { return false; }
    // host <-> backend, converting between fp32 on the host and the tensor's dtype
    virtual void to_host_f32(float* dst, Tensor src) = 0;
    virtual void from_host_f32(Tensor dst, const float* src) = 0;
    virtual void to_host_bytes(void* dst, const void* src, size_t bytes) = 0;
    virtual void from_host_bytes(void* dst, const void* src, size_t bytes) = 0;
    virtual void synchronize() = 0;

    // ---- CUDA graphs (train.cuda_graphs) ----
    // A training step's device work begins here and ends at its first read back (to_host_bytes):
    // the CUDA backend captures one such region into a graph after a clean warm-up and launches the
    // graph for every later region, whose host code then queues nothing (llmc/cuda/step_graph.cuh).
    // key: what the step passes to its ops by value and may change between steps (a change makes a
    // new graph). Returns what the region does: "warm-up", "capture", "replay", "off: <why>" (the
    // backend gave graphs up for this run), or "none" (a backend without graphs: the CPU).
    virtual std::string graph_step_begin(uint64_t key) {
        (void)key;
        return "none";
    }

    // ---- host memory and asynchronous copies (optimizer offload, llmc/model/optimizer.h) ----
    // Host memory the asynchronous copies read and write (pinned on CUDA), zero-initialised.
    virtual void* alloc_host(size_t bytes);
    virtual void release_host(void* p);
    // Start copying between backend memory and host memory from alloc_host, ordered after the ops
    // queued so far; returns an id for wait_copy. The backend's ops must not use the backend side
    // of the copy, nor the caller the host side, until the copy is waited for. The default (host
    // backends) copies at once.
    virtual uint64_t copy_to_host_async(void* dst, const void* src, size_t bytes) {
        to_host_bytes(dst, src, bytes);
        return 0;
    }
    virtual uint64_t copy_from_host_async(void* dst, const void* src, size_t bytes) {
        from_host_bytes(dst, src, bytes);
        return 0;
    }
    // Blocks until the copy with this id is done.
    virtual void wait_copy(uint64_t id) { (void)id; }
    // The ops queued from now on run after the copy with this id; the host does not wait (activation
    // offload, llmc/model/model.h: a buffer's next writer waits for its copy on the device). Host
    // backends have done the copy already.
    virtual void order_after_copy(uint64_t id) { (void)id; }

    // ---- embedding ----
    // wte holds the vocabulary rows [vocab_begin, vocab_begin + wte.n / C) (the whole padded
    // table when vocab_begin = 0 and wte is complete; one rank's slice under tensor parallelism).
    // out[b,t,:] = wte[tokens[b,t] - vocab_begin,:] for tokens in that range, zeros otherwise,
    // plus wpe[t,:] when wpe is non-empty (with TP exactly one rank adds wpe, then the group
    // all-reduces out). Ids past the slice are legal (another rank holds them), so the op
    // can only check ids >= 0 (the CPU does; CUDA, which never reads them back, skips such an id
    // like one of another slice); the data loader checks 0 <= id < V.
    virtual void encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                                 int vocab_begin) = 0;
    // dwte[tokens[b,t] - vocab_begin,:] += dout[b,t,:] for the tokens in dwte's row range
    // (others are skipped); dwpe[t,:] += sum_b dout[b,t,:] when dwpe is non-empty.
    // Accumulates, in a deterministic order.
    virtual void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                                  int vocab_begin) = 0;

    // ---- layernorm (eps = 1e-5) ----
    // out = (inp - mean) * rstd * w + b; mean/rstd [N] fp32
    virtual void layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N,
                                   int C) = 0;
    // residual = a + b; out = layernorm(residual)
    virtual void fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a,
                                                  Tensor b, Tensor w, Tensor bias, int N, int C) = 0;
    // dinp += dLN/dinp; dw += ..., db += ... (all accumulate)
    virtual void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                                    const float* mean, const float* rstd, int N, int C) = 0;

    // out = a + b (elementwise, n elements)
    virtual void residual_forward(Tensor out, Tensor a, Tensor b) = 0;

    // ---- matmul ----
    // out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be empty).
    // With gelu: pre_gelu gets the pre-activation and out = gelu_tanh(pre-activation), computed
    // from pre_gelu's value or (CUDA's GEMM epilogue) from the value before its rounding to the
    // dtype; either way the same call gives the same bits again (activation recomputation runs it).
    virtual void matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                int OC, bool gelu) = 0;
    // Backward of matmul_forward. If pre_gelu is non-empty, dout is first multiplied in
    // place by gelu'(pre_gelu) (dout is then the gradient of the pre-activation).
    // dinp = dout @ w (overwrite; skipped when dinp is empty). With dinp_gelu (only with dinp: the
    // input of the GELU whose output inp was, GPT-2's fc pre-activation under fc_proj), dinp =
    // (dout @ w) * gelu'(dinp_gelu), the gradient of that pre-activation: the GELU's backward
    // applied to the product before its rounding to the dtype (CUDA: cuBLASLt's DGELU epilogue;
    // where cuBLASLt runs none, the rounded product and then a kernel, fixed per problem).
    // dw += dout^T @ inp; dbias += column sums of dout (skipped when dbias is empty).
    virtual void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                 Tensor pre_gelu, int N, int IC, int OC, Tensor dinp_gelu = Tensor()) = 0;

    // ---- attention ----
    // qkv [B,T,NH+2*NKV,HS] (per token: NH query heads, then NKV key heads, then NKV value
    // heads; NKV == NH is [B,T,3,NH,HS]) -> out [B,T,NH,HS], causal, softmax scale 1/sqrt(HS);
    // query head h reads key/value head h / (NH/NKV) (grouped-query attention).
    // lse [B,NH,T] fp32 = log-sum-exp of the scaled scores of each query row.
    virtual void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) = 0;
    // dqkv (overwrite) from dout, recomputing probabilities from qkv and lse.
    virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B,
                                    int T, int NH, int NKV, int HS) = 0;
    // Context parallelism's ring (llmc/parallel/context_parallel.h): the queries of qkv_q [B,Tq,NH+2*NKV,HS]
    // against the keys and values of qkv_kv [B,Tk,...] (another block of the same sequences; only
    // its k and v heads are read). Query row i sits at global position qp.at(i), key row j at
    // kp.at(j); i sees j when kp.at(j) <= qp.at(i). out [B,Tq,NH,HS] and lse [B,NH,Tq] are the
    // attention over the visible keys of this block alone (a row that sees none: out 0, lse -inf).
    // attention_forward is this op of a sequence with itself at positions 0..T-1.
    virtual void attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk,
                                         int NH, int NKV, int HS, SeqPositions qp, SeqPositions kp) {
        throw UserError("parallel.cp > 1: the " + name() + " backend has no ring attention ops (use device \"cpu\")");
    }
    // out, lse (the running result over the blocks so far) merged with a block's by log-sum-exp:
    // L = log(e^lse + e^blk_lse), out = e^(lse-L) out + e^(blk_lse-L) blk_out, lse = L (rows
    // whose blk_lse is -inf unchanged). Shapes as attention_block_forward's with Tq = T.
    virtual void attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                                 int HS) {
        throw UserError("parallel.cp > 1: the " + name() + " backend has no ring attention ops (use device \"cpu\")");
    }
    // Backward of attention_block_forward given the whole attention's out and lse over every
    // block (probabilities recomputed as exp(s - lse)): ACCUMULATES the queries' gradient into the
    // q heads of dq [B,Tq,...] and the keys' and values' into the k and v heads of dkv [B,Tk,...]
    // (their other heads untouched; dq and dkv may be one tensor).
    virtual void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                          const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS,
                                          SeqPositions qp, SeqPositions kp) {
        throw UserError("parallel.cp > 1: the " + name() + " backend has no ring attention ops (use device \"cpu\")");
    }
    // Rotary position embeddings (transformers' rotate_half convention), in place on the query
    // and key heads of qkv [B,T,NH+2*NKV,HS], row t of each sequence at position p = pos.at(t)
    // (SeqPositions(): 0..T-1): with inv_freq[i] = 1/theta^(2i/HS) and a = p*inv_freq[i] (fp32),
    // x[i], x[i+HS/2] become x[i]*cos a - x[i+HS/2]*sin a and x[i+HS/2]*cos a + x[i]*sin a.
    // Backward: the transpose, in place on dqkv.
    virtual void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) = 0;
    virtual void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) = 0;

    // ---- Llama's norm and MLP activation ----
    // RMSNorm: rstd[n] = 1/sqrt(mean(inp[n,:]^2) + eps) (fp32), out = inp * rstd * w.
    virtual void rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) = 0;
    // dinp += ..., dw += ... (accumulate, like layernorm_backward).
    virtual void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                                  int C) = 0;
    // SwiGLU: inp [N, 2F] = [gate | up] per row; out [N, F] = silu(gate) * up.
    virtual void swiglu_forward(Tensor out, Tensor inp, int N, int F) = 0;
    // dinp [N, 2F] = [dgate | dup] (overwrite).
    virtual void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) = 0;

    // ---- mixture of experts (model.moe; the routing rules and the row plan: llmc/model/moe.h) ----
    // Router, per token row n: probs[n,:] = softmax(logits[n,:]) (fp32); expert[n,:] = the K
    // largest probabilities in descending order, ties to the lower index; gate[n,j] =
    // probs[n,expert[n,j]] / sum of the K chosen (fp32). expert is int32 backend memory.
    virtual void moe_router_forward(float* probs, int32_t* expert, float* gate, Tensor logits, int N, int E, int K) {
        throw UserError(moe_unsupported());
    }
    // dlogits [N,E] (overwrite) from dgate [N,K] and daux [E] (nullable; d loss / d probs[n,e],
    // the same for every row): through the renormalisation over the chosen K and the softmax.
    virtual void moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                                     const int32_t* expert, const float* gate, int N, int E, int K) {
        throw UserError(moe_unsupported());
    }
    // row_of [N*K] int32: the permuted row of each (token, slot) pair, -1 = dropped.
    // out[row_of[n*K+j],:] = inp[n,:] for the kept pairs (rows of no pair are left as they are).
    virtual void moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) {
        throw UserError(moe_unsupported());
    }
    // dinp[n,:] += sum over kept slots, in slot order, of dout[row_of[n*K+j],:] (accumulates).
    virtual void moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) {
        throw UserError(moe_unsupported());
    }
    // out[n,:] = sum over kept slots, in slot order, of gate[n,j] * y[row_of[n*K+j],:] (overwrite).
    virtual void moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) {
        throw UserError(moe_unsupported());
    }
    // dy[row_of[n*K+j],:] = gate[n,j] * dout[n,:]; dgate[n,j] = dot(dout[n,:], y[row_of[n*K+j],:]),
    // 0 for a dropped pair (both overwrite).
    virtual void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate,
                                      const int32_t* row_of, int N, int K, int C) {
        throw UserError(moe_unsupported());
    }
    std::string moe_unsupported() const {
        return "model.moe: the " + name() + " backend has no mixture-of-experts ops yet (use the cpu backend, or "
               "remove model.moe)";
    }

    // ---- classifier ----
    // logits [N, Vp] with the real vocabulary in columns [0, V). For every row:
    // losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]  (fp32).
    // If dloss != 0 the logits are overwritten by the gradient of dloss * sum_i losses[i]:
    // (softmax - onehot) * dloss in [0, V), zero in the padded columns [V, Vp).
    virtual void cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                               float dloss) = 0;

    // Vocabulary-parallel cross-entropy (tensor parallelism; the full logits are never
    // gathered). logits [N, Vl] hold the vocabulary columns [vocab_begin, vocab_begin + Vl) of
    // this rank; columns whose global index is >= V (the real vocabulary size) are padding and
    // ignored. targets[i] in [0, V) are global ids. Runs as
    //   cross_entropy_partial -> combine the stats of all slices (host/collective) -> cross_entropy_finish.
    // With one slice (vocab_begin 0, Vl = Vp) the pair equals the fused cross_entropy.
    //
    // stats [N, 3] fp32 (backend memory), per row i over this slice's real columns:
    //   stats[3i]   = m = max of the logits (-inf when the slice has no real column)
    //   stats[3i+1] = s = sum of exp(logit - m) (0 when the slice has no real column)
    //   stats[3i+2] = the target's logit if targets[i] falls in this slice, else 0
    // Slices combine as M = max_k m_k, S = sum_k s_k * exp(m_k - M), target = sum_k target_k.
    virtual void cross_entropy_partial(float* stats, Tensor logits, const int32_t* targets, int N, int Vl,
                                       int vocab_begin, int V) = 0;
    // stats [N, 3] fp32 now hold, per row, the combined (M, S, target logit) over the whole
    // vocabulary: losses[i] = log(S) + M - target logit (fp32). If dloss != 0 the logits are
    // overwritten by dloss * (softmax - onehot) on this slice's real columns (softmax =
    // exp(logit - M) / S) and zero in its padding columns; dloss == 0 leaves them untouched.
    virtual void cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets,
                                      int N, int Vl, int vocab_begin, int V, float dloss) = 0;

    // The combination of the slices' stats (TensorParallel::combine_cross_entropy_stats) around its
    // two all-reduces, per row i of stats [rows, 3], mx [rows], rest [rows, 2] (backend memory):
    //   phase 0: mx[i] = stats[3i] (then mx is max-reduced over the slices)
    //   phase 1: rest[2i] = stats[3i] == -inf ? 0 : stats[3i+1] * exp(stats[3i] - mx[i]) (fp32 expf),
    //            rest[2i+1] = stats[3i+2] (then rest is summed over the slices)
    //   phase 2: stats[3i] = mx[i], stats[3i+1] = rest[2i], stats[3i+2] = rest[2i+1]
    virtual void cross_entropy_stats(int phase, float* stats, float* mx, float* rest, size_t rows) = 0;

    // ---- optimizer ----
    // Sum of squares of a gradient region, in double, with a fixed reduction order.
    virtual double sum_squares(Tensor g) = 0;
    // *out (backend memory) = the sum over the regions, in order, of sum_squares(region): bitwise
    // what adding the host results in a double from 0 gives. One pass over every region (CUDA: two
    // launches however many regions), no read back.
    virtual void sum_squares_multi(double* out, const std::vector<Tensor>& regions) = 0;
    // The step's update decision from ss (backend memory, two doubles: the summed squares of the
    // gradient, and a value that is finite when every loss was), into ctl (backend memory, two
    // floats). The gradient is loss_scale times the true one (precision "fp16"'s loss scaling; 1
    // otherwise), so that the true norm is sqrt(ss[0]) / loss_scale:
    // ctl[0] = float(clip_scale(sqrt(ss[0]) / loss_scale, clip) / loss_scale) in double
    // (llmc/model/optimizer.h: torch's factor; AdamW's gradient scale unscales and clips at once),
    // ctl[1] = 1 when both ss[0] and ss[1] are finite (update), else 0 (skip the step).
    virtual void step_control(float* ctl, const double* ss, double clip, double loss_scale) = 0;
    // adamw on every piece, the gradient scale ctl[0] and the decision ctl[1] read from backend
    // memory (ctl[1] == 0: nothing changes). Each piece as one adamw call would update it, bit for
    // bit; one launch (CUDA) for all pieces.
    virtual void adamw_multi(const std::vector<AdamWPiece>& pieces, const float* ctl, float lr, float beta1,
                             float beta2, float eps, int t) = 0;
    // AdamW on n elements. g is multiplied by grad_scale first (clipping). t = step (1-based)
    // for bias correction (adamw_scales). params -= lr * weight_decay * p + step * m / (sqrt(v) *
    // inv_sqrt_bc2 + eps) (= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)), with p
    // taken from master when given (fp32 master weights; params is then the rounded copy,
    // stochastic rounding when params is bf16: element i's random bits hash (seed, index_base + i),
    // so a call on a piece of a tensor rounds it as one call on the whole tensor would).
    virtual void adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int t, uint32_t seed,
                       uint32_t index_base = 0) = 0;

    // ---- fp8 ----
    // FP8 linear layers (precision "fp8"; formats, scales and the recipes in llmc/precision/fp8.h).
    // Every operand x (with c.gelu: gelu_tanh of the tensor given, in fp32) is cast with its Fp8Cast
    // c (c.scale: *c.scale_at where that is set):
    //   s = c.current ? fp8_scale_from_amax(max|x|, c.format, c.margin, c.scale) : c.scale
    //   q(x) = fp8_decode(fp8_encode(x * s, c.format), c.format) * (1/s)
    // and, when c.amax is non-null, *c.amax = max(*c.amax, max|x|) with max|x| of the unscaled
    // x in the fp8_abs_bits order (NaN > inf > finite: a bad tensor makes its amax non-finite).
    // The products of the casts accumulate in fp32. The CPU backend computes exactly q() in
    // fp32 and the fp32 matmul; CUDA casts to e4m3/e5m2 and runs the GEMM on the fp8 tensor
    // cores (dequantizing the fp32 sum with 1/s), so it agrees up to the accumulation's rounding.

    // Whether this backend runs the fp8 ops; if not, *why (when given) says why.
    virtual bool fp8_supported(std::string* why) const {
        if (why) *why = "the " + name() + " backend has no fp8 matmuls";
        return false;
    }
    // N, IC and OC of the fp8 ops must be multiples of this (CUDA: 16, the fp8 GEMM's alignment).
    virtual int fp8_dim_multiple() const { return 1; }
    // As matmul_forward with out = q(inp) @ q(w)^T + bias (then the GELU as matmul_forward).
    // Throws UserError when the backend or the shape is not supported. `stash` (may be empty): see
    // Fp8Stash; the forward fills it where the backend keeps one.
    virtual void matmul_forward_fp8(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                    int OC, bool gelu, const Fp8Cast& inp_cast, const Fp8Cast& w_cast,
                                    const Fp8Stash& stash = Fp8Stash()) {
        throw UserError("precision fp8: the " + name() + " backend has no fp8 matmuls");
    }
    // As matmul_backward: first d = dout * gelu'(pre_gelu) rounded to dout's dtype when pre_gelu is
    // given (else d = dout); dbias += column sums of that (unquantized) d; then dinp = q(d) @ q(w)
    // (overwrite, skipped when dinp is empty) and dw += q(d)^T @ q(inp). dout afterwards holds d
    // or dout (CUDA computes d inside the cast where it can and then leaves dout alone). The casts of inp and w should repeat the
    // forward's (same scale; amax may be nullptr, they were recorded in the forward; w is not
    // cast at all when dinp is empty). `stash`: the one the forward of this inp filled (inp
    // unchanged since, the same inp_cast): the backend may read inp's cast from it instead.
    virtual void matmul_backward_fp8(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                     Tensor pre_gelu, int N, int IC, int OC, const Fp8Cast& dout_cast,
                                     const Fp8Cast& inp_cast, const Fp8Cast& w_cast,
                                     const Fp8Stash& stash = Fp8Stash()) {
        throw UserError("precision fp8: the " + name() + " backend has no fp8 matmuls");
    }
    // The scaling state's step on the backend (Fp8Device, all of it backend memory), once per
    // optimizer step: d.wide[i] = double(fp8_abs_bits(d.amax[i])) (exact: what a Max over ranks
    // reduces, NaN and inf kept above every finite amax) ...
    virtual void fp8_widen_amaxes(const Fp8Device& d) {
        throw UserError("precision fp8: the " + name() + " backend has no fp8 matmuls");
    }
    // ... then fp8_update_one for every tensor i with amax = from_wide ? the float of the bits
    // d.wide[i] : d.amax[i]; a non-finite amax adds one to d.overflows[i], and *step_overflows
    // (backend memory) = the number of them this step, as a float. Nothing is read back.
    virtual void fp8_update_scales(const Fp8Device& d, bool from_wide, float* step_overflows) {
        throw UserError("precision fp8: the " + name() + " backend has no fp8 matmuls");
    }

protected:
    OpsCounters counters_;
};
