// Where a model's parameters and gradients live. The store is built first, from the parameter
// layout (llmc/model/param_table.h), and handed to the model, which never asks where they are: it takes
// each unit (the embedding, a layer, the head) from its store around each use and gives it back.
// WholeStore is the trivial store (whole buffers: one process, ZeRO 0 and 1); DataParallel
// (llmc/train/data_parallel.h) is the store of ZeRO 2 and 3, which shard them over the DP group.
#pragma once
#include "llmc/backend/ops.h"
#include "llmc/model/param_table.h"
#include "llmc/core/tensor.h"

// What the model asks of a store, unit by unit, around each use (forward_chunk, backward_chunk).
// Every rank of the store's group makes the same calls in the same order, so the store may run
// collectives in them.
class ParamStore {
public:
    virtual ~ParamStore() = default;
    virtual const ParamLayout& layout() const = 0;
    // A unit's parameters, whole, valid until release_params(unit).
    virtual Tensor acquire_params(int unit) = 0;
    virtual void release_params(int unit) = 0;
    virtual void prefetch_params(int unit) = 0;      // a hint: acquire_params(unit) comes next
    virtual void load_params(const float* mem) = 0;  // this rank's whole buffer, host, memory order
    // The part [first, second) of the flat buffer the store keeps on this rank (ZeRO-3: its shard),
    // and load_params of that part alone (host, memory order): what a resume reads of a checkpoint.
    virtual std::pair<size_t, size_t> params_held() const { return {0, layout().padded_params}; }
    virtual void load_params_held(const float* held) { load_params(held); }
    // The unit's gradient buffer for this backward (accumulated into), valid until
    // release_grads(unit): no more of its gradients this backward.
    virtual Tensor acquire_grads(int unit) = 0;
    virtual void release_grads(int unit) = 0;
    virtual void zero_grads() = 0;  // start of an optimizer step
};

// Whole parameter and gradient buffers (padded_params elements each, one allocation each):
// acquiring a unit returns a view into them and costs nothing. grads = false: parameters only
// (ZeRO-2 keeps its parameters whole and shards its gradients).
class WholeStore : public ParamStore {
public:
    WholeStore(Ops& ops, const ParamLayout& layout, DType dtype, bool grads = true);
    ~WholeStore() override;
    WholeStore(const WholeStore&) = delete;
    WholeStore& operator=(const WholeStore&) = delete;

    Tensor params, grads;  // grads empty when built without

    const ParamLayout& layout() const override { return layout_; }
    Tensor acquire_params(int unit) override { return unit_of(params, unit); }
    void release_params(int) override {}
    void prefetch_params(int) override {}
    void load_params(const float* mem) override;
    Tensor acquire_grads(int unit) override;
    void release_grads(int) override {}
    void zero_grads() override;

private:
    Tensor unit_of(const Tensor& buf, int unit) const;
    Ops& ops_;
    const ParamLayout& layout_;
};
