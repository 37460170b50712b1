// Pipeline parallelism: the engine that executes a schedule's action lists
// (llmc/pipeline_schedule.h) on this rank's chunks of the model, moving activations and their
// gradients between neighbouring stages, and the forward-only passes of evaluation and sampling.
//
// Messages are keyed by (payload, micro-batch, boundary): the boundary e between virtual stages
// e and e + 1 carries micro-batch m's activation forward and its gradient back. Every tensor a
// compute step produces for another stage is copied to a host buffer right away (the model's
// scratch is reused by the next step) and leaves with the schedule's Send; received tensors wait
// in host buffers for the compute that consumes them. With one stage (pp == 1) the lists are
// plain forward/backward alternation and no message is sent.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "llmc/comm.h"
#include "llmc/model.h"
#include "llmc/pipeline_schedule.h"

// Activation slots each of a rank's chunks needs under a schedule: the most micro-batches whose
// forward through that chunk is done and whose backward is not.
std::vector<int> pipeline_slots(const std::vector<PpAction>& actions, int virtual_chunks);

class PipelineEngine {
public:
    // pp: the pipeline group (this rank's stage = pp->rank()); null for one stage. embed: the group of
    // the first and the last stage that share the tied embedding (null when pp == 1).
    PipelineEngine(Model& model, Comm* pp, Comm* embed, PpSchedule schedule, int micro_batches, int virtual_chunks);

    Model& model() { return model_; }
    int stages() const { return pp_ ? pp_->size() : 1; }
    int stage() const { return pp_ ? pp_->rank() : 0; }
    bool is_last_stage() const { return stage() == stages() - 1; }

    // One optimizer step's forwards and backwards: x[m], y[m] hold micro-batch m's B*T ids (every
    // stage reads the same data; each uses what it needs). Gradients accumulate; the tied
    // embedding's gradient is summed over the first and last stage at the end. grads_ready goes to
    // the last backward when the model is one chunk on one stage (data parallelism's overlap).
    // Returns the mean loss over the micro-batches, on every stage.
    double train_step(const std::vector<std::vector<int32_t>>& x, const std::vector<std::vector<int32_t>>& y,
                      float dloss, const std::function<void(size_t)>& grads_ready);
    // Forward only; returns the mean loss of the b*t tokens on every stage (y null: logits only, returns 0).
    double forward_only(const int32_t* x, const int32_t* y, int b, int t);
    // The last stage's x, on every stage.
    double broadcast_from_last(double x);

private:
    using Key = std::tuple<int, int, int>;  // (payload, micro, boundary)
    int vstage(int chunk) const { return chunk * stages() + stage(); }
    int n_virtual() const { return stages() * vchunks_; }
    void transfer(const PpAction& a);
    void run_forward(int micro, int chunk, const int32_t* x, const int32_t* y, int b, int t, float dloss,
                     double* loss);
    int take_slot(int chunk, int micro);
    // The host tensor waiting under k, consumed into dst (what: the message if it is missing).
    void take(const Key& k, Tensor dst, const char* what);
    // src copied to a host tensor under k, for a Send or this rank's next chunk.
    void put(const Key& k, Tensor src);

    Model& model_;
    Comm* pp_;
    Comm* embed_;
    PpSchedule schedule_;
    int micro_batches_, vchunks_;
    std::map<Key, std::vector<float>> buffers_;         // produced or received, not yet consumed
    std::vector<std::map<int, int>> slot_of_;           // [chunk] micro -> slot
    std::vector<std::vector<int>> free_slots_;          // [chunk]
    int cur_b_ = 0, cur_t_ = 0;
};
