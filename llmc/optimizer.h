// AdamW over a range of the flat parameter buffer, gradient-norm clipping and the LR schedules.
//
// The optimizer owns [begin, end) of the flat (padded) buffer: the whole model, or this
// rank's ZeRO shard (llmc/data_parallel.h): fp32 moments m and v, and fp32 master weights when the model's dtype is not fp32.
// It updates the parameters and reads the gradients of that range where they live: views of
// the whole buffers (llmc/param_store.h), or ZeRO's shard buffers (DataParallel::opt_params / opt_grads).
// Weight decay applies per parameter tensor (ParamSpec::decay), so the update walks the
// parameter table and runs the fused AdamW op on each tensor's intersection with the range.
#pragma once
#include <cstdint>
#include <vector>

#include "llmc/config.h"
#include "llmc/ops.h"
#include "llmc/param_table.h"

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
};

class AdamW {
public:
    // layout: the flat buffers' tensors; params, grads: the range's parameters and gradients
    // (end - begin elements each, in the model's dtype).
    AdamW(const ParamLayout& layout, Ops& ops, size_t begin, size_t end, Tensor params, Tensor grads);
    // fp32 master weights are kept for a model in any other dtype.
    static bool keeps_master(DType model_dtype) { return model_dtype != DType::F32; }
    ~AdamW();
    AdamW(const AdamW&) = delete;
    AdamW& operator=(const AdamW&) = delete;

    // t: 1-based step for bias correction; grad_scale multiplies the gradients (clipping).
    void step(const AdamWHyper& h, int t, float grad_scale, uint32_t seed);

    size_t begin() const { return begin_; }
    size_t end() const { return end_; }
    size_t state_bytes() const;  // m, v and master
    bool has_master() const { return master_ != nullptr; }

    // Host fp32 copies of the state over [begin, end), for checkpoints.
    void get_state(std::vector<float>& m, std::vector<float>& v, std::vector<float>& master) const;
    void set_state(const std::vector<float>& m, const std::vector<float>& v, const std::vector<float>& master);
    // Copies the current parameters into the master weights (after loading parameters).
    void sync_master_from_params();

private:
    const ParamLayout& layout_;
    Ops& ops_;
    size_t begin_, end_;
    Tensor params_, grads_;
    float* m_ = nullptr;
    float* v_ = nullptr;
    float* master_ = nullptr;
};

// torch's clip_grad_norm_ factor: min(1, clip / (norm + 1e-6)); 1 when clip <= 0.
float clip_scale(double grad_norm, double clip);
// Learning rate of step (0-based) under the configured schedule with linear warmup.
double lr_at(const TrainConfig& t, int step);
