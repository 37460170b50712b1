// Data parallelism and ZeRO over the DP group: where the parameters and gradients live (the
// model's ParamStore), gradient buckets, their all-reduce or reduce-scatter, the optimizer
// shard, the parameter all-gather, and the memory table. It works on the parameter layout
// (llmc/model/param_table.h), never on the model.
//
// The flat parameter/gradient buffer (memory order, see model.h) is padded to a multiple of
// dp * kShardAlign elements and cut into dp equal shards: DP rank r owns
// [r * S, (r + 1) * S), S = padded / dp. Gradients move in buckets of parallel.bucket_mb
// (fp32 elements), cut from the end of the buffer backwards because backward finishes the
// last layers first; each bucket crosses the shards it crosses (the v-collectives take per-rank counts).
//
// One optimizer step, per ZeRO stage (stages 0 and 1 keep whole buffers: their store is a
// WholeStore, llmc/model/param_store.h; stages 2 and 3 hand the model this class as its store):
//   stage 0  every bucket is all-reduced; every rank updates the whole model (AdamW over
//            [0, padded)); replicas stay bitwise identical.
//   stage 1  every bucket is reduce-scattered: rank r keeps the summed gradient of its shard;
//            AdamW (m, v, master) exists only for the shard; after the update each bucket
//            of parameters is all-gathered.
//   stage 2  no whole gradient buffer: the model takes its gradients unit by unit from this
//            class (a ParamStore, llmc/model/param_store.h). A layer's gradient buffer lives for that
//            layer's backward and is reduce-scattered into this rank's shard of the gradient
//            (accumulating over micro-steps) as soon as the layer is done, in every micro-step.
//            The embedding's and the head's buffers (wte's gradient comes from both ends of the
//            backward, and the pipeline syncs the tied copy) live for the whole step and are
//            reduce-scattered once, in finish_grad_sync. Parameters are all-gathered after the update.
//   stage 3  as stage 2, and no whole parameter buffer either: rank r keeps its shard of the
//            parameters, and each unit is all-gathered into a working buffer just before the
//            model uses it (forward, and again in backward), the next unit's gather issued as
//            the current one is taken (prefetch), and freed after use. AdamW updates the shard
//            in place; nothing is gathered after the update.
// Stages 0 and 1 launch their buckets from the backward of the last micro-step, as soon as the
// model reports (Model::backward's grads_ready) that every gradient in them is final; no
// communication happens in the earlier micro-steps.
//
// Overlap: the bucket all-reduces and reduce-scatters, stages 2 and 3's unit reduce-scatters and
// stage 3's gathers are posted non-blocking (Comm's *_async) and waited for only where their
// buffer is needed next: a staged collective (through send_/recv_) before the staging buffers'
// next use or in finish_grad_sync, where its result is stored; a stage-3 gather (fp32 on a
// communicator that reads the backend's memory: straight from the shard into the unit's working
// buffer, no staging) when the model acquires the unit, so the prefetched next unit arrives
// while the current one computes. after_update's all-gathers are all posted, then waited for.
// With Comm::set_overlap(false) each wait follows its post (parallel.overlap); the results are
// the same bits either way.
//
// Expert parallelism (parallel.ep; llmc/parallel/process_grid.h): the group this class is given is the
// expert-dp group (the dp x cp / ep ranks holding the same experts), and ep the expert-parallel group.
// Every reduction runs over the expert-dp group as above, which completes the expert tensors'
// gradients (their owner already summed its ep group's tokens); the other elements (every tensor
// but the experts, and the padding: the dense ones) are then summed over the ep group as well,
// which completes their sum over all of dp (x cp): at ZeRO-0 by an all-reduce, at ZeRO >= 1 by a
// reduce-scatter that gives each ep rank the sums of the dense elements whose optimizer state it
// owns (below; the rest of its gradient shard's dense elements are not read, and gather_gradients
// collects the parts from their owners). The ep ranks of one group hold the same shard range (the
// same expert-dp rank), where the expert elements are different parameters on each ep rank and the
// dense ones the same. So with ZeRO >= 1 the optimizer of ep rank k owns, of its shard range, every
// expert element and the k-th of ep contiguous parts of the dense elements (cut by count in flat
// order: zero_optimizer_runs): the experts' state is sharded over the expert-dp group, the dense
// state over all of dp. After the update each rank's dense part is all-gathered over the ep group
// into the shard range (stages 1, 2: before the expert-dp all-gather; stage 3: into the parameter
// shard); checkpoints gather the parts the same way. ZeRO-0 keeps whole replicas (every rank
// updates everything, as without ep). The losses are averaged over all of dp.
//
// Local updates (local SGD, llmc/train/local_sgd.h; built with local = true, stage 0): no
// collective at all in the step: the gradients stay this rank's own (no bucket goes out), every
// rank updates its whole replica from them, the gradient norm and the losses' check are this
// replica's (summed over the model-parallel group only). LocalSgd averages the replicas every
// parallel.local_sgd.every steps.
//
// Compressed gradients (PowerSGD, llmc/train/powersgd.h; set_compression, stage 0, no ep): no bucket
// goes out during the backward; finish_grad_sync hands the whole gradient buffer to PowerSgd, which
// replaces it by the compressed sum over the DP group (the same on every rank, as the all-reduce's).
//
// bytes_sent() counts what this class's gradient and parameter collectives send from this rank
// over the DP group (and the ep group under expert parallelism), as a ring algorithm sends them:
// an all-reduce of B bytes 2 (p - 1) / p B, a reduce-scatter or all-gather of B bytes (the whole
// buffer) (p - 1) / p B; the scalars of the loss and the norm and the checkpoints' gathers are not
// counted (the trainer logs the step's difference as dp_bytes).
//
// The gradient norm is computed on each rank's optimizer elements (stage >= 1: its shard, or
// under ep its owned runs) or on the replicated full gradient (stage 0) and the squares summed
// over the group. The loss is averaged over DP.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/io/checkpoint.h"
#include "llmc/comm/comm.h"
#include "llmc/parallel/comm_stage.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/param_store.h"

struct Bucket {
    size_t begin, end;  // element range of the flat buffer
};

// The [begin, end) runs of a layout's flat buffer that are not an expert's tensor (padding
// included), ascending: the whole buffer without experts.
std::vector<std::pair<size_t, size_t>> dense_runs(const ParamLayout& layout);
// Expert parallelism with ZeRO >= 1: the runs of the flat buffer whose optimizer state the rank
// (edp_rank, ep_rank) owns. Of its shard [edp_rank S, (edp_rank + 1) S), S = padded / edp: every
// expert element, and the dense elements with index [ep_rank nd / ep, (ep_rank + 1) nd / ep)
// among the shard's nd dense ones (flat order). Ascending, merged where adjacent. Every layout
// of the ep group has its experts at the same offsets, so the dense runs and the cuts are alike.
std::vector<std::pair<size_t, size_t>> zero_optimizer_runs(const ParamLayout& layout, int edp, int edp_rank, int ep,
                                                           int ep_rank);
// The elements of runs.
size_t runs_numel(const std::vector<std::pair<size_t, size_t>>& runs);
// dev: n doubles in backend memory, op-reduced over c where c reads them (a host communicator
// over device memory: through host copies; a group of one: nothing).
void reduce_backend_doubles(Ops& ops, Comm& c, double* dev, size_t n, ReduceOp op);
// The most elements any rank's zero_optimizer_runs hold (the memory plan's): over the shards j,
// the shard's expert elements plus ceil(nd_j / ep) of its nd_j dense ones.
size_t zero_optimizer_most(const ParamLayout& layout, int edp, int ep);

// Per-rank bytes by category, from ZeRO's formulas for this layout (see memory_table()).
struct MemoryPlan {
    size_t padded_params = 0;  // elements, a multiple of dp * kShardAlign
    int dp = 1, zero = 0;
    size_t params = 0, grads = 0, optimizer = 0, comm_buffers = 0, activations = 0;
    size_t unit_params = 0, unit_grads = 0;  // ZeRO-3's gathered units, ZeRO-2/3's unit gradient buffers
    size_t host = 0;  // host memory: the offloaded optimizer (train.offload_optimizer); not in total()
    // the backend's memory (on the CPU backend host memory too; host is then the offload's extra)
    size_t total() const { return params + grads + optimizer + comm_buffers + activations + unit_params + unit_grads; }
};
// The unit sizes (elements) of this rank's model that ZeRO-2/3's working buffers hold.
struct UnitSizes {
    size_t embedding = 0, head = 0, layer = 0;  // the largest of each kind (0: none held)
};
UnitSizes unit_sizes(const std::vector<ParamUnit>& units);
// Psi = padded_params, k = bytes per element of the model dtype, o = 8 (m, v) or 12 (+ master),
// E, H, L = the embedding, head and largest layer unit:
//   params       Psi*k       (stages 0, 1, 2)     Psi/dp*k (stage 3)
//   grads        Psi*k       (stages 0, 1)        Psi/dp*k (stages 2, 3)
//   optimizer    Psi*o       (stage 0)            Psi/dp*o (stages 1, 2, 3)
//   comm         bucket*4    (stage 0: one staging buffer)
//                2*bucket*4  (stages 1, 2, 3: send + receive staging buffers)
//   unit params  (E + H + 2L)*k  (stage 3: the embedding, the head, a layer and the prefetched next)
//   unit grads   (E + H + L)*k   (stages 2, 3: the step-long embedding and head buffers, one layer's)
// With offload_optimizer the optimizer row is 0 and host holds AdamW::offload_host_bytes of the
// optimizer's range (Psi or Psi/dp elements) streamed in pieces of a bucket.
// optimizer_elems: under expert parallelism (stages 1-3), the optimizer's elements in place of
// Psi/dp (zero_optimizer_runs); 0: Psi/dp.
MemoryPlan zero_memory_plan(size_t padded_params, int dp, int zero, size_t dtype_bytes, bool master,
                            size_t bucket_elems, size_t activation_bytes, const UnitSizes& units = UnitSizes(),
                            bool offload_optimizer = false, size_t optimizer_elems = 0);

class PowerSgd;

class DataParallel : public ParamStore {
public:
    static constexpr size_t kShardAlign = 128;  // shard starts stay 512-byte aligned for vector kernels
    // Elements the flat buffers must be a multiple of (param_layout's pad_multiple).
    static size_t pad_multiple(int dp) { return size_t(dp) * kShardAlign; }
    // Elements per gradient bucket for parallel.bucket_mb over a buffer of padded_params.
    static size_t bucket_elems_for(double bucket_mb, size_t padded_params);

    // zero: 0..3. layout: this rank's parameters, padded to pad_multiple(dp.size()); dtype: the
    // model's. Built before the model, which is built on param_store().
    // Communication staging: when the communicator reads the backend's memory (NCCL on CUDA;
    // MPI over the CPU backend, whose memory is host memory) the fp32 staging buffers are
    // backend tensors and the collectives run on them; otherwise (MPI with CUDA: several ranks
    // may share a GPU) they are host arrays and every bucket is copied through the host.
    // host_staging forces the second way (tests compare the two).
    // ep: the expert-parallel group (any communicator: its host vectors go through CommStage), null or
    // of size 1 without.
    // local: local SGD's inner steps (zero must be 0): no gradient sync, see above.
    DataParallel(const ParamLayout& layout, Ops& ops, DType dtype, Comm& dp, int zero, double bucket_mb,
                 bool host_staging = false, Comm* ep = nullptr, bool local = false);
    ~DataParallel() override;
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    // Where the model's parameters and gradients live: whole buffers (stages 0, 1), or this class.
    ParamStore& param_store();
    int zero() const { return zero_; }
    bool local() const { return local_; }
    // PowerSGD in place of the bucket all-reduce (stage 0 without ep or local updates); null: plain.
    void set_compression(PowerSgd* compression);
    // Ring-model bytes this rank's collectives have sent so far (see above).
    double bytes_sent() const { return bytes_sent_; }
    // The ring model's bytes of one collective over `ranks` of `bytes` (the whole buffer).
    static double ring_bytes_all_reduce(double bytes, int ranks) { return 2.0 * (ranks - 1) / ranks * bytes; }
    static double ring_bytes_gather(double bytes, int ranks) { return double(ranks - 1) / ranks * bytes; }
    // Every one of `ranks` ranks' share of [begin, end) when rank r holds [r shard, (r + 1) shard):
    // the intersections, in rank order (the counts of a reduce-scatter or all-gather).
    static std::vector<size_t> shard_counts(size_t begin, size_t end, size_t shard, int ranks);
    int dp() const { return comm_.size(); }
    const Comm& comm() const { return comm_; }  // the DP group: ZeRO's shard group
    int dp_rank() const { return comm_.rank(); }
    // The range of the flat buffer this rank's optimizer owns: everything at stage 0.
    size_t opt_begin() const { return zero_ == 0 ? 0 : size_t(dp_rank()) * shard_; }
    size_t opt_end() const { return zero_ == 0 ? layout_.padded_params : opt_begin() + shard_; }
    const std::vector<Bucket>& buckets() const { return buckets_; }  // launch order
    // The optimizer's parameters and gradients over [opt_begin, opt_end) (AdamW's views).
    Tensor opt_params() const;
    Tensor opt_grads() const;
    // The runs of [opt_begin, opt_end) whose optimizer state this rank owns: all of it, or under
    // expert parallelism with ZeRO >= 1 zero_optimizer_runs (AdamW's runs).
    const std::vector<std::pair<size_t, size_t>>& opt_runs() const { return opt_runs_; }

    // The gradient synchronisation of one step. Pass grads_ready() to the backward of the last
    // micro-step, then call finish_grad_sync(): afterwards this rank's optimizer range holds
    // the sum of every rank's gradients.
    std::function<void(size_t)> grads_ready();
    void finish_grad_sync();
    // sqrt of the sum of squares of the summed gradient of the whole model, identical on every
    // rank: each tensor counted once (primary copies), summed over the model-parallel group
    // (tp x pp (x ep) ranks holding the model's pieces; null or size 1 when the rank holds it all).
    double grad_norm(Comm* model_parallel = nullptr);
    // The same without a read back: ss (backend memory, two doubles) gets in ss[0] the summed
    // squares whose sqrt grad_norm returns; ss[1] (this rank's, set by the caller) is summed over
    // every rank of the group and of model_parallel (the losses' check: Ops::step_control).
    void grad_norm_squares(double* ss, Comm* model_parallel = nullptr);
    // Before the optimizer step: ZeRO-3 lets go of the units gathered from the shards (the
    // prefetched one's gathers may still read them).
    void before_update();
    // After the optimizer step: every rank gets every shard's new parameters (stages 1, 2).
    void after_update();
    // This rank's whole parameter buffer (host, memory order, padded) on DP rank 0, empty
    // elsewhere; stage 3 gathers the shards. Collective. Into out: its memory is reused (a
    // checkpoint's buffers, kept from one save to the next, take no fresh pages).
    void gather_params(std::vector<float>& out);
    std::vector<float> gather_params() {
        std::vector<float> out;
        gather_params(out);
        return out;
    }
    // This rank's own whole parameter buffer (host, memory order, padded; stages 0-2).
    std::vector<float> local_params();
    // Its elements [at, at + n) as fp32 into out, read where they lie (stages 0-2): a one-process
    // save's, with no copy of the whole.
    void read_params(size_t at, size_t n, float* out) const;
    // ZeRO-3: elements [at, at + n) of this rank's shard of the parameters (from opt_begin()), the same
    void read_param_shard(size_t at, size_t n, float* out) const;
    // Mean of x over the DP group (all of dp under expert parallelism).
    double mean(double x);
    // Asserts that the parameter replicas are bitwise identical on every DP rank (stages 0-2).
    void check_replicas();

    // Checkpoints: the whole optimizer state (memory order, padded) on DP rank 0, empty elsewhere
    // (under ep: each ep rank's, whole in its dense elements too); collective. (The reverse, on
    // resume: each rank reads AdamW::runs() of the checkpoint, Model::from_file_order.) Into out:
    // its memory is reused. weights_only: the master weights alone (none where the model is fp32),
    // for a save of the final weights without a checkpoint. An array at a time.
    void gather_optimizer_state(const AdamW& opt, OptimizerState& out, bool weights_only = false);
    OptimizerState gather_optimizer_state(const AdamW& opt) {
        OptimizerState out;
        gather_optimizer_state(opt, out);
        return out;
    }
    // The summed gradient (after finish_grad_sync) of this rank's whole buffer on DP rank 0, host
    // memory order; empty elsewhere. Collective (tests and debugging).
    std::vector<float> gather_gradients();

    // activation_bytes: the model's (Model::activation_bytes).
    MemoryPlan memory_plan(bool master, size_t activation_bytes, bool offload_optimizer = false) const;
    // What this class actually allocated, in the plan's categories, with the optimizer's bytes
    // (AdamW::device_bytes() and host_bytes()) and the model's activations: the trainer checks the
    // two agree.
    MemoryPlan allocated(size_t optimizer_bytes, size_t host_bytes, size_t activation_bytes) const;
    size_t bucket_elems() const { return bucket_elems_; }

    // ---- ParamStore (stages 2 and 3; called by the model; stage 2's parameters are whole) ----
    const ParamLayout& layout() const override { return layout_; }
    Tensor acquire_params(int unit) override;
    void release_params(int unit) override;
    void prefetch_params(int unit) override;
    void load_params(const float* mem) override { load_params_held(mem + params_held().first); }
    std::pair<size_t, size_t> params_held() const override;
    void load_params_held(const float* held) override;
    Tensor acquire_grads(int unit) override;
    void release_grads(int unit) override;
    void zero_grads() override;

private:
    // An fp32 buffer of bucket_elems_ in the communicator's memory (see the constructor).
    struct Staging {
        std::vector<float> host;
        Tensor dev;
        float* data() { return dev.ptr ? dev.f32() : host.data(); }
        size_t bytes() const { return dev.ptr ? dev.bytes() : host.size() * sizeof(float); }
    };
    void load(Staging& s, Tensor src);                     // s[0, src.n) = src as fp32
    void store(Tensor dst, Staging& s);                    // dst = s[0, dst.n)
    void load_host(Staging& s, const float* src, size_t n);  // s[0, n) = host src
    void store_host(float* dst, Staging& s, size_t n);
    void accumulate(Tensor dst);  // dst += recv_[0, dst.n) (send_ is the scratch)
    // Expert parallelism: s[0, n) holds elements [begin, begin + n) of the flat buffer summed over
    // the expert-dp group; the dense ones among them are summed over the ep group too (an all-reduce
    // at ZeRO-0; at ZeRO >= 1 a reduce-scatter: this rank's dense part only, the others left as they were).
    void reduce_dense(Staging& s, size_t begin, size_t n);
    // Expert parallelism with ZeRO: every ep rank's dense part of the shard range, from its owner,
    // read by get(flat begin, n, dst) on the owner and written by put(flat begin, n, src) elsewhere
    // (all-gathered over ep in pieces of a bucket, through host memory).
    void share_dense_parts(const std::function<void(size_t, size_t, float*)>& get,
                           const std::function<void(size_t, size_t, const float*)>& put);
    void share_dense_parts(Tensor range);  // range: the shard range's parameters (opt_params)
    void share_dense_parts(float* range);  // range: host, shard_ elements
    // f(flat begin, n, packed index) for the stretches of the shard range's dense elements with
    // packed indices [a, b)
    void for_each_dense(size_t a, size_t b, const std::function<void(size_t, size_t, size_t)>& f) const;
    // the shard range (host, shard_ elements) from this rank's optimizer state (packed opt_runs_)
    std::vector<float> range_state(const std::vector<float>& packed);
    void launch(const Bucket& b);
    // The collective posted on send_/recv_ and what completes it (a store of its result).
    CommHandle staged_;
    std::function<void()> staged_then_;
    void post_staged(CommHandle h, std::function<void()> then);
    void settle();  // waits for it and runs its completion; call before the staging buffers' next use
    // stages 2 and 3: one unit's gradient reduce-scattered and added to this rank's shard, and
    // one unit's parameters all-gathered from every shard, in pieces of bucket_elems_
    void reduce_scatter_unit(int unit, Tensor grads);
    // In place (fp32 on a communicator that reads the backend's memory), for the step-long units
    // (the embedding, the head: reduce-scattered once per step, into a part of the shard nothing
    // else adds to, zero until then): every piece straight from the unit's gradient buffer into
    // the shard, all posted at once
    void posted_step_long(int unit, Tensor grads, std::vector<CommHandle>* posted);
    // f(begin, end, every rank's share: shard_counts) for each bucket-sized piece of a unit
    void for_each_piece(int unit, const std::function<void(size_t, size_t, const std::vector<size_t>&)>& f) const;
    // posted into dst (in place) or gathered through the staging buffers (returns no handles)
    std::vector<CommHandle> gather_unit(int unit, Tensor dst);
    void drop_prefetched();
    // every DP rank's share of [begin, end): its intersection with that rank's shard, in rank order
    std::vector<size_t> shard_counts(size_t begin, size_t end) const { return shard_counts(begin, end, shard_, dp()); }
    // The whole buffer into out on DP rank 0 (emptied elsewhere) from every rank's shard (shard_
    // elements). Collective.
    void gather_shards(const float* shard, std::vector<float>& out);

    const ParamLayout& layout_;
    Ops& ops_;
    const DType dtype_;
    Comm& comm_;
    Comm* ep_;  // null when ep is 1
    CommStage ep_stage_;  // the dense parts' host vectors to the ep group (NCCL: through backend memory)
    std::vector<std::pair<size_t, size_t>> dense_;  // expert parallelism: the [begin, end) runs that are not experts
    int zero_;
    bool local_;
    PowerSgd* compression_ = nullptr;
    double bytes_sent_ = 0;
    void count_all_reduce(size_t n, const Comm& c) { bytes_sent_ += ring_bytes_all_reduce(4.0 * n, c.size()); }
    void count_gather(const std::vector<size_t>& counts, const Comm& c);
    std::vector<std::pair<size_t, size_t>> opt_runs_;
    // expert parallelism with ZeRO >= 1 (split_): the dense runs within the shard range, and each
    // ep rank's part of them as indices into their packed order ([dense_cut_[k], dense_cut_[k + 1]))
    bool split_ = false;
    std::vector<std::pair<size_t, size_t>> range_dense_;
    std::vector<size_t> dense_cut_;
    std::unique_ptr<WholeStore> whole_;  // stages 0-2: the whole parameters (and gradients, stages 0, 1)
    Tensor param_buf_, grad_buf_;        // its buffers (empty where sharded)
    size_t shard_;         // elements per DP rank
    size_t bucket_elems_;  // elements per bucket
    std::vector<Bucket> buckets_;
    size_t next_bucket_ = 0;  // first bucket of buckets_ not yet launched this step
    bool solo_;              // a group of one without ep: no collective, no copy
    bool direct_;            // the staging buffers are backend tensors
    bool in_place_;          // and fp32: stage 3 gathers into the working buffers themselves
    Staging send_, recv_;    // the comm buffers of the memory table
    double* norm_ = nullptr;  // backend memory: grad_norm's two doubles
    Tensor param_shard_;  // stage 3: this rank's shard of the parameters
    Tensor grad_shard_;   // stages 2, 3: this rank's shard of the summed gradient
    // Working buffers by unit kind (ParamUnit::Kind): gathered parameters (stage 3; two layer
    // slots, the current and the prefetched unit) and unit gradients (stages 2, 3).
    struct Slot {
        Tensor buf;
        int unit = -1;        // the unit it holds, -1 when free
        bool in_use = false;  // acquired (else prefetched, or free)
        std::vector<CommHandle> gathering;  // stage 3: the posted gathers filling it
    };
    void wait_gathers(Slot& s);
    std::vector<Slot> param_slots_[3];
    Slot grad_slots_[3];
    UnitSizes unit_sizes_;
    std::vector<void*> allocations_;
    Tensor alloc(size_t n);
};

// Layout-independent resume: the loader position saved at saved_dp (window groups of saved_dp
// windows) expressed for dp ranks. Throws UserError when it does not map exactly.
LoaderPosition convert_loader_position(const LoaderPosition& p, int saved_dp, int dp, bool shuffle);
