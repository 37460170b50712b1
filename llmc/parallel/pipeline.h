// Pipeline parallelism: the engine that executes a schedule's action lists
// (llmc/parallel/pipeline_schedule.h) on this rank's chunks of the model (a PipelineStage: the Model
// implements it), moving activations and their
// gradients between neighbouring stages, and the forward-only passes of evaluation and sampling.
//
// Messages are keyed by (payload, micro-batch, boundary): the boundary e between virtual stages
// e and e + 1 carries micro-batch m's activation forward and its gradient back. Every tensor a
// compute step produces for another stage is copied to a message buffer right away (the model's
// scratch is reused by the next step) and leaves with the schedule's Send; received tensors wait
// in message buffers for the compute that consumes them. The buffers are where the pp
// communicator reads (CommStage, llmc/parallel/comm_stage.h): backend memory in the model's dtype (NCCL;
// MPI over the CPU backend), else fp32 host memory (MPI with CUDA). The tied embedding's gradient
// sum over the embed group takes the same routes. With one stage (pp == 1) the lists are
// plain forward/backward alternation and no message is sent.
//
// Overlap: receives are posted (Comm::exchange_async) kRecvAhead actions before their transfer
// action (at their action on a communicator that runs operations in posting order: NCCL) and
// waited for when a compute step takes the tensor; sends are posted at their action
// and waited for two transfers later (their host buffers then go) or at the end of the step. MPI
// matches the messages by peer and tag, so posting early changes no pairing
// (parallel.overlap=false: each waited for right after its post).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/parallel/comm_stage.h"
#include "llmc/backend/ops.h"
#include "llmc/parallel/pipeline_schedule.h"
#include "llmc/core/tensor.h"

// What the engine asks of this rank's part of the model: its chunks (consecutive layer ranges),
// each run forward or backward for the micro-batch in one of its activation slots, and the
// tensors that cross a chunk boundary.
class PipelineStage {
public:
    virtual ~PipelineStage() = default;
    virtual int num_chunks() const = 0;
    // Elements of the activation (and of its gradient) that crosses a chunk boundary for a b x t batch.
    virtual size_t boundary_numel(int b, int t) const = 0;
    // Where a received activation goes right before forward_chunk (chunks that do not start the model).
    virtual Tensor chunk_input(int chunk, int slot, int b, int t) const = 0;
    // The activation forward_chunk left for the next chunk (chunks that do not end the model), valid
    // until the stage's next call (slots may share it: activation offload, llmc/model/model.h).
    virtual Tensor chunk_output(int chunk, int slot, int b, int t) const = 0;
    // The gradient buffer of the residual stream: before backward_chunk of a chunk that does not
    // end the model, the received gradient of its output goes here; after backward_chunk of a
    // chunk that does not start the model, it holds the gradient of its input (to send back).
    virtual Tensor residual_grad(int b, int t) const = 0;
    // Forward of one chunk. tokens: host ids, used by the chunk that starts the model; targets:
    // host ids used by the chunk that ends it (null: logits only). Returns the mean loss of the
    // b*t tokens when this chunk ends the model and targets are given, else 0. With dloss != 0
    // the head leaves d(dloss * sum of token losses)/dlogits for backward_chunk.
    virtual float forward_chunk(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int b, int t,
                                float dloss) = 0;
    // Backward of one chunk for the micro-batch in slot; parameter gradients accumulate.
    // grads_ready (optional) is called with an element offset o: from here on no gradient at or
    // above o changes in this backward (data parallelism launches its buckets from it).
    virtual void backward_chunk(int chunk, int slot, const std::function<void(size_t)>& grads_ready) = 0;
    // The LM head is the token embedding; then f gets the gradient of the copy this stage holds
    // (the first stage's embedding, the last stage's head copy) and may change it.
    virtual bool tied_head() const = 0;
    virtual void update_head_weight_grad(const std::function<void(Tensor)>& f) = 0;
};

// Activation slots each of a rank's chunks needs under a schedule: the most micro-batches whose
// forward through that chunk is done and whose backward is not.
std::vector<int> pipeline_slots(const std::vector<PpAction>& actions, int virtual_chunks);

class PipelineEngine {
public:
    // pp: the pipeline group (this rank's stage = pp->rank()); null for one stage. embed: the group of
    // the first and the last stage that share the tied embedding (null when pp == 1). ops: the
    // backend of the stage's tensors.
    PipelineEngine(PipelineStage& stage, Ops& ops, Comm* pp, Comm* embed, PpSchedule schedule, int micro_batches,
                   int virtual_chunks);

    int stages() const { return pp_ ? pp_->size() : 1; }
    int stage() const { return pp_ ? pp_->rank() : 0; }
    bool is_last_stage() const { return stage() == stages() - 1; }

    // One optimizer step's forwards and backwards: x[m], y[m] hold micro-batch m's b*t ids (every
    // stage reads the same data; each uses what it needs). Gradients accumulate; the tied
    // embedding's gradient is summed over the first and last stage at the end. grads_ready goes to
    // the last backward when the model is one chunk on one stage (data parallelism's overlap).
    // Returns the mean loss over the micro-batches, on every stage.
    double train_step(const std::vector<std::vector<int32_t>>& x, const std::vector<std::vector<int32_t>>& y, int b,
                      int t, float dloss, const std::function<void(size_t)>& grads_ready);
    // With the model's losses deferred (Model::defer_losses): train_step returns this rank's sum of
    // what the forwards returned (their MoE part) without the sum over the stages, and
    // finish_loss(that plus the deferred forwards' means, read back) gives train_step's result.
    void set_defer_loss(bool on) { defer_loss_ = on; }
    double finish_loss(double loss);
    // Forward only; returns the mean loss of the b*t tokens on every stage (y null: logits only, returns 0).
    double forward_only(const int32_t* x, const int32_t* y, int b, int t);
    // The last stage's x, on every stage.
    double broadcast_from_last(double x);

private:
    using Key = std::tuple<int, int, int>;  // (payload, micro, boundary)
    int vstage(int chunk) const { return chunk * stages() + stage(); }
    int n_virtual() const { return stages() * vchunks_; }
    void transfer(const PpAction& a);       // posts the action's sends and receives not posted yet
    void post_receives(const PpAction& a);  // posts the action's receives ahead of it
    void post(const PpAction& a, bool sends);
    Key key_of(const PpTransfer& x) const;
    static constexpr size_t kRecvAhead = 3;
    void run_forward(int micro, int chunk, const int32_t* x, const int32_t* y, int b, int t, float dloss,
                     double* loss);
    int take_slot(int chunk, int micro);
    // The tensor waiting under k, consumed into dst (what: the message if it is missing).
    void take(const Key& k, Tensor dst, const char* what);
    // src copied to a message buffer under k, for a Send or this rank's next chunk.
    void put(const Key& k, Tensor src);
    void drop(const Key& k);  // k's buffer back to the pool
    // What crosses a boundary for the current batch (size and dtype; no memory).
    Tensor boundary() const {
        return Tensor(nullptr, stage_.boundary_numel(cur_b_, cur_t_), stage_.residual_grad(cur_b_, cur_t_).dtype);
    }

    PipelineStage& stage_;
    Ops& ops_;
    Comm* pp_;
    Comm* embed_;
    PpSchedule schedule_;
    int micro_batches_, vchunks_;
    bool defer_loss_ = false;
    CommStage pp_stage_, embed_stage_;
    std::map<Key, CommStage::Message> buffers_;  // produced or received, not yet consumed
    // posted transfers: the receives' by key (waited for by take), and every one in posting order
    // (waited for at the end of the step, or when its send buffers can go)
    std::map<Key, std::shared_ptr<CommHandle>> receiving_;
    std::vector<std::pair<std::shared_ptr<CommHandle>, std::vector<Key>>> posted_;  // with the keys it sends
    void wait_sent(size_t keep);  // waits for all but the last keep posted transfers, drops what they sent
    std::vector<std::map<int, int>> slot_of_;           // [chunk] micro -> slot
    std::vector<std::vector<int>> free_slots_;          // [chunk]
    int cur_b_ = 0, cur_t_ = 0;
};
