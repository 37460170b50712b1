// AdamW over a range of the flat parameter buffer, gradient-norm clipping and the LR schedules.
//
// The optimizer works on [begin, end) of the flat (padded) buffer: the whole model, or this
// rank's ZeRO shard (llmc/train/data_parallel.h), and owns runs of it (all of it, or under expert
// parallelism with ZeRO the shard's expert elements and this rank's part of its dense ones:
// DataParallel::opt_runs): fp32 moments m and v, and fp32 master weights when the model's dtype
// is not fp32, for the owned elements only, packed run after run (the state's order).
// It updates the parameters and reads the gradients of the owned runs where they live: views of
// the whole buffers (llmc/model/param_store.h), or ZeRO's shard buffers (DataParallel::opt_params / opt_grads).
// Weight decay applies per parameter tensor (ParamSpec::decay), so the update walks the
// parameter table and runs the fused AdamW op on each tensor's intersection with the range.
//
// Optimizer offload (train.offload_optimizer): m, v and the master weights live in host memory
// (Ops::alloc_host: pinned on CUDA) and the update runs on the host, by the CPU backend's AdamW
// kernel (llmc/cpu/kernels.h, OpenMP and SIMD). The owned runs stream through three host staging
// slots in pieces (each within one run): a piece's gradients (and, without master weights, its parameters) go down, the
// host updates it, its new parameters go up (bf16 from the master by the CUDA kernel's stochastic
// rounding, llmc/precision/bf16.h); where the backend copies asynchronously (CUDA: a copy stream per
// direction) the next piece's download and the previous piece's upload overlap the update. On the
// CPU backend the same path runs with host memory on both sides and is bitwise the update without
// offload; on CUDA the two differ only by the float rounding of the device kernel against the host's.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "llmc/core/config.h"
#include "llmc/backend/ops.h"
#include "llmc/model/param_table.h"

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
};

struct OptimizerOffload {
    bool enabled = false;
    size_t piece = 0;  // elements streamed per piece (capped at the range; 0: the whole range)
};

class AdamW {
public:
    using Runs = std::vector<std::pair<size_t, size_t>>;  // [begin, end) of the flat buffer, ascending
    // layout: the flat buffers' tensors; params, grads: the range's parameters and gradients
    // (end - begin elements each, in the model's dtype); runs: the owned ones, disjoint, within
    // [begin, end) (empty: all of it).
    AdamW(const ParamLayout& layout, Ops& ops, size_t begin, size_t end, Tensor params, Tensor grads,
          OptimizerOffload offload = {}, Runs runs = {});
    // fp32 master weights are kept for a model in any other dtype (and under the CPU's fp16
    // emulation, whose fp32 tensors hold fp16 values: Ops::emulates_fp16).
    static bool keeps_master(DType model_dtype) { return model_dtype != DType::F32; }
    // The elements of one streamed piece over a range of n elements.
    static size_t offload_piece(size_t n, size_t piece) { return piece == 0 || piece > n ? n : piece; }
    // Host bytes of an offloaded optimizer over n elements streamed in pieces of `piece` (after
    // offload_piece): m, v (and master) fp32, kStageSlots staging slots of a piece's gradients and
    // parameters in the model's dtype, and a piece of fp32 gradients when that dtype is not fp32.
    static constexpr int kStageSlots = 3;  // the piece downloading, the one updated, the one uploading
    static size_t offload_host_bytes(size_t n, size_t piece, size_t dtype_bytes, bool master) {
        return n * sizeof(float) * (master ? 3 : 2) + kStageSlots * 2 * piece * dtype_bytes +
               (dtype_bytes == sizeof(float) ? 0 : piece * sizeof(float));
    }
    ~AdamW();
    AdamW(const AdamW&) = delete;
    AdamW& operator=(const AdamW&) = delete;

    // t: 1-based step for bias correction; ctl (backend memory, Ops::step_control's): ctl[0]
    // multiplies the gradients (clipping), ctl[1] == 0 skips the update. One multi-tensor op over
    // every owned piece of every tensor; the host never reads ctl (but with offload, where the
    // host does the update).
    void step(const AdamWHyper& h, int t, const float* ctl, uint32_t seed);
    // The same with the scale from the host (always an update).
    void step(const AdamWHyper& h, int t, float grad_scale, uint32_t seed);

    size_t begin() const { return begin_; }
    size_t end() const { return end_; }
    const Runs& runs() const { return runs_; }
    size_t owned() const { return owned_; }  // elements of the runs: of m, v (and master)
    size_t device_bytes() const;  // m, v and master in backend memory (0 when offloaded)
    size_t host_bytes() const;    // the offloaded state and its staging in host memory (0 when not)
    bool has_master() const { return master_ != nullptr; }
    bool offloaded() const { return offload_.enabled; }

    // Host fp32 copies of the state of the owned runs (packed), for checkpoints (master empty
    // where the model is fp32).
    void get_state(std::vector<float>& m, std::vector<float>& v, std::vector<float>& master) const;
    // One array of that state (owned() elements; Master: only where has_master()), and the reverse:
    // a save and a resume take them one at a time, so that the host holds one array of this
    // rank's piece, not three.
    enum class Array { M, V, Master };
    void get_state(Array which, std::vector<float>& out) const;
    // n elements of one array from packed position at, into out: a one-process save reads the
    // state where it lies, a piece at a time, with no copy of the whole
    void read_state(Array which, size_t at, size_t n, float* out) const;
    void set_state(Array which, const std::vector<float>& x);
    // Copies the current parameters into the master weights (after loading parameters).
    void sync_master_from_params();
    // The fp32 weights of the owned runs (packed): the master weights where kept, else the
    // parameters; and the reverse, which sets the master (where kept) and the parameters (rounded
    // to nearest in the model's dtype). Local SGD's outer step reads and writes them.
    std::vector<float> get_weights() const;
    void set_weights(const std::vector<float>& w);

private:
    float* array(Array which) const;  // m_, v_ or master_ (asserted kept)
    void step_offloaded(const AdamWHyper& h, int t, const float* ctl, uint32_t seed);
    // the host update of the piece [o, o + n) of the range, staged in slot s
    struct Piece {
        size_t begin, n, state;  // [begin, begin + n) of the flat buffer, at m_ + state
    };
    void update_piece(const Piece& p, int s, const AdamWHyper& h, int t, float grad_scale, uint32_t seed);
    // bf16 stochastic rounding hashes (a seed per tensor, from its offset in the buffer; the
    // element's index in the tensor): wherever ZeRO shards or runs cut a tensor, its elements get
    // the bits they get in one piece
    static uint32_t tensor_seed(uint32_t seed, size_t offset) {
        return seed ^ uint32_t((uint64_t(offset) * 0x9E3779B97F4A7C15ull) >> 32);
    }

    const ParamLayout& layout_;
    Ops& ops_;
    size_t begin_, end_;
    Runs runs_;
    std::vector<size_t> run_state_;  // each run's offset in m_, v_, master_
    size_t owned_ = 0;
    Tensor params_, grads_;
    OptimizerOffload offload_;
    float* m_ = nullptr;  // backend memory, or host memory when offloaded
    float* v_ = nullptr;
    float* master_ = nullptr;
    float* ctl_ = nullptr;  // backend memory: the host scale's step_control (step with a float)
    // offload: per staging slot a piece of gradients and of parameters (model dtype), and a piece
    // of fp32 gradients (bf16 models)
    void* stage_grads_[kStageSlots] = {};
    void* stage_params_[kStageSlots] = {};
    float* grads_f32_ = nullptr;
    std::vector<Piece> pieces_;  // offload: the owned runs cut into pieces of at most offload_.piece
    // offload with master weights: the stretches [first, second) of the owned runs (flat buffer)
    // that no tensor covers (padding); the uploads write their never-updated parameters back from the master
    std::vector<std::pair<size_t, size_t>> gaps_;
};

// torch's clip_grad_norm_ factor: min(1, clip / (norm + 1e-6)); 1 when clip <= 0.
float clip_scale(double grad_norm, double clip);
// Learning rate of step (0-based) under the configured schedule with linear warmup.
double lr_at(const TrainConfig& t, int step);
