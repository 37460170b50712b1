// Local SGD / DiLoCo (parallel.local_sgd; Douillard et al. 2023, "DiLoCo: Distributed Low-Communication
// Training of Language Models"): the DP ranks train replicas of their own and meet every H steps.
//
// Inner steps: DataParallel's local updates (llmc/train/data_parallel.h, built with local = true):
// each DP rank's AdamW updates its whole replica from its own gradients (the mean over its own
// tokens), with its own moments, and nothing crosses the DP group. The gradient norm and clipping
// are the replica's.
//
// The sync, after the AdamW update of every step s with s % H == 0 and of the run's last step (so
// that the final model is the outer one), on every DP rank alike:
//   mean     = (1/dp) sum_i w_i              the replicas' fp32 weights (the master weights where
//                                            kept) averaged: a sum over the DP group
//   delta    = anchor - mean                 the averaged parameter delta (the anchor, the weights at
//                                            the last sync, is the same on every rank, so this is the
//                                            mean of the ranks' deltas), the outer pseudo-gradient
//   momentum = mu momentum + delta           SGD with Nesterov momentum mu (outer_momentum), PyTorch's
//   anchor   = anchor - lr (delta + mu momentum)   form, learning rate lr (outer_lr)
//   w_i      = anchor                        every replica starts the next interval from the outer weights
// With H = 1, lr = 1 and mu = 0 a sync is plain parameter averaging after every step: the run equals
// plain data parallelism exactly when the inner update is linear in the gradient (SGD; AdamW with an
// epsilon far above sqrt(v), which the test uses). With AdamW as usual it does not: the mean of the
// ranks' AdamW steps is not the AdamW step of the mean gradient.
//
// Where the outer state lives (anchor and momentum, fp32, host memory: two floats per element of the
// outer range, and a host copy of the weights during a sync): ZeRO-0 keeps the whole range on every
// rank and sums the weights with an all-reduce; ZeRO-1 shards it over the DP group like the
// optimizer's shards (rank r owns [r S, (r + 1) S), S = padded / dp): a reduce-scatter gives each rank
// its shard's sum, the outer step runs on the shard, and an all-gather hands every rank the new
// weights (the same bytes on the wire as the all-reduce). The inner AdamW is whole on every rank at
// either stage (each replica is updated by its rank alone). Collectives go in pieces of a gradient
// bucket through CommStage (an NCCL group through backend scratch). On CUDA a sync copies the fp32
// weights to the host and back once.
//
// Checkpoints (llmc/io/checkpoint.h, LocalSgdState) hold the outer state whole and every DP rank's
// replica (weights, moments, master), so a run resumes bit-exactly at any step of an interval; it
// resumes at the dp that saved it only.
#pragma once
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/io/checkpoint.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/comm_stage.h"

class LocalSgd {
public:
    // padded: the flat buffer's elements (a multiple of dp's pad_multiple); dp: the DP group;
    // zero: 0 (outer state whole) or 1 (sharded); piece: elements per collective.
    LocalSgd(const LocalSgdConfig& cfg, size_t padded, Ops& ops, Comm& dp, int zero, size_t piece);

    int every() const { return cfg_.every; }
    // After completed step `step` (1-based) of `steps`: is it a sync step?
    bool due(int step, int steps) const { return step % cfg_.every == 0 || step == steps; }
    // A fresh start: anchor = the optimizer's weights (the outer range), momentum 0.
    void start(const AdamW& opt);
    // The sync (collective over the DP group): the outer step, every replica set to its result.
    // opt: the inner AdamW over the whole buffer.
    void sync(AdamW& opt);

    size_t begin() const { return begin_; }  // the outer range of the flat buffer
    size_t end() const { return end_; }
    int zero() const { return zero_; }
    const std::vector<float>& anchor() const { return anchor_; }
    const std::vector<float>& momentum() const { return momentum_; }
    // The outer state's host bytes (anchor and momentum).
    size_t host_bytes() const { return 2 * (end_ - begin_) * sizeof(float); }
    // Ring-model bytes the syncs have sent from this rank so far (DataParallel::bytes_sent's measure).
    double bytes_sent() const { return bytes_sent_; }

    // Checkpoints, memory order over the whole padded buffer. gather: DP rank 0 gets the outer
    // state whole and the replicas of DP ranks 1.. (each rank passes its own: params, m, v, master),
    // the others nothing. Collective over the DP group.
    LocalSgdState gather(const ReplicaState& mine);
    // resume: this rank's part of a whole (padded, memory order) anchor and momentum
    void set_state(const std::vector<float>& anchor_whole, const std::vector<float>& momentum_whole);

private:
    // [begin, end) of the flat buffer as every DP rank's share of it (its ZeRO-1 shard's part)
    std::vector<size_t> counts(size_t begin, size_t end) const;
    // DP rank 0 gets the whole buffer from every rank's range (range: end - begin elements)
    std::vector<float> gather_ranges(const std::vector<float>& range);

    const LocalSgdConfig cfg_;
    const size_t padded_;
    Comm& comm_;
    CommStage stage_;
    const int zero_;
    const size_t piece_;
    size_t begin_ = 0, end_ = 0;
    std::vector<float> anchor_, momentum_;  // over [begin_, end_)
    double bytes_sent_ = 0;
};
