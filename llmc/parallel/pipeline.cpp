#include "llmc/parallel/pipeline.h"

#include <algorithm>

std::vector<int> pipeline_slots(const std::vector<PpAction>& actions, int virtual_chunks) {
    std::vector<int> live(size_t(virtual_chunks), 0), peak(size_t(virtual_chunks), 1);
    for (const PpAction& a : actions) {
        if (a.op == PpOp::Forward) {
            int& n = live[size_t(a.chunk)];
            peak[size_t(a.chunk)] = std::max(peak[size_t(a.chunk)], ++n);
        } else if (a.op == PpOp::Backward) {
            live[size_t(a.chunk)]--;
        }
    }
    return peak;
}

PipelineEngine::PipelineEngine(PipelineStage& chunks, Ops& ops, Comm* pp, Comm* embed, PpSchedule schedule,
                               int micro_batches, int virtual_chunks)
    : stage_(chunks), ops_(ops), pp_(pp), embed_(embed), schedule_(std::move(schedule)), micro_batches_(micro_batches),
      vchunks_(virtual_chunks), pp_stage_(ops, pp), embed_stage_(ops, embed) {
    LLMC_ASSERT(chunks.num_chunks() == virtual_chunks, "the model's chunks and the schedule disagree");
    LLMC_ASSERT(int(schedule_.size()) == stages(), "one action list per pipeline stage");
    const std::vector<int> slots = pipeline_slots(schedule_[size_t(stage())], vchunks_);
    slot_of_.resize(size_t(vchunks_));
    free_slots_.resize(size_t(vchunks_));
    for (int c = 0; c < vchunks_; c++)
        for (int s = slots[size_t(c)] - 1; s >= 0; s--) free_slots_[size_t(c)].push_back(s);
}

int PipelineEngine::take_slot(int chunk, int micro) {
    auto& fr = free_slots_[size_t(chunk)];
    LLMC_ASSERT(!fr.empty(), "pipeline: no free activation slot (the model was built for fewer)");
    const int s = fr.back();
    fr.pop_back();
    slot_of_[size_t(chunk)][micro] = s;
    return s;
}

PipelineEngine::Key PipelineEngine::key_of(const PpTransfer& x) const {
    // The boundary of a message from this rank's point of view: a send carries what its chunk
    // produced (activation: boundary = its stage; gradient: stage - 1), a receive what its chunk
    // will consume (activation: stage - 1; gradient: its stage).
    const int s = vstage(x.chunk);
    return Key{int(x.payload), x.micro, (x.payload == PpPayload::Activation) == x.is_send ? s : s - 1};
}

void PipelineEngine::post_receives(const PpAction& a) { post(a, false); }

void PipelineEngine::transfer(const PpAction& a) { post(a, true); }

void PipelineEngine::post(const PpAction& a, bool sends) {
    const size_t words = pp_stage_.words(boundary());
    std::vector<CommP2P> msgs;
    std::vector<Key> received, sent;
    for (const PpTransfer& x : a.transfers) {
        const Key k = key_of(x);
        if (x.is_send && sends) {
            auto it = buffers_.find(k);
            LLMC_ASSERT(it != buffers_.end(), "pipeline: sending a tensor not produced yet");
            msgs.push_back(CommP2P{true, it->second.data(), words, x.peer, x.tag});
            sent.push_back(k);
        } else if (!x.is_send && !buffers_.count(k)) {  // not posted ahead already
            CommStage::Message& b = buffers_[k];
            b = pp_stage_.take_message(boundary());
            msgs.push_back(CommP2P{false, b.data(), words, x.peer, x.tag});
            received.push_back(k);
        }
    }
    if (msgs.empty()) return;
    auto h = std::make_shared<CommHandle>(pp_->exchange_async(msgs));
    for (const Key& k : received) receiving_[k] = h;
    if (sent.empty()) return;
    posted_.emplace_back(h, std::move(sent));
    // the sent buffers go once their transfer is done: wait for all but the last two posted
    // (in flight for at least one compute step) so that they do not pile up over the step
    wait_sent(2);
}

void PipelineEngine::wait_sent(size_t keep) {
    if (posted_.size() <= keep) return;
    const size_t done = posted_.size() - keep;
    for (size_t i = 0; i < done; i++) {
        pp_->wait(*posted_[i].first);
        for (const Key& k : posted_[i].second) drop(k);
    }
    posted_.erase(posted_.begin(), posted_.begin() + long(done));
}

void PipelineEngine::take(const Key& k, Tensor dst, const char* what) {
    auto r = receiving_.find(k);
    if (r != receiving_.end()) {  // still arriving
        pp_->wait(*r->second);
        receiving_.erase(r);
    }
    auto it = buffers_.find(k);
    LLMC_ASSERT(it != buffers_.end() && dst.n == boundary().n, std::string("pipeline: ") + what);
    pp_stage_.unpack(dst, it->second);
    drop(k);
}

void PipelineEngine::put(const Key& k, Tensor src) {
    LLMC_ASSERT(src.n == boundary().n && !buffers_.count(k), "pipeline: a boundary tensor produced twice");
    CommStage::Message& m = buffers_[k];
    m = pp_stage_.take_message(boundary());
    pp_stage_.pack(m, src);
}

void PipelineEngine::drop(const Key& k) {
    auto it = buffers_.find(k);
    pp_stage_.release_message(std::move(it->second));
    buffers_.erase(it);
}

void PipelineEngine::run_forward(int micro, int chunk, const int32_t* x, const int32_t* y, int b, int t, float dloss,
                                 double* loss) {
    const int s = vstage(chunk);
    const int slot = take_slot(chunk, micro);
    if (s > 0)  // the activation from stage s - 1: received, or produced by this rank's previous chunk
        take(Key{int(PpPayload::Activation), micro, s - 1}, stage_.chunk_input(chunk, slot, b, t),
             "forward without its input activation");
    // the last stage's mean cross-entropy, and every stage's MoE load-balancing losses
    *loss += stage_.forward_chunk(chunk, slot, x, y, b, t, dloss);
    if (s == n_virtual() - 1) return;
    put(Key{int(PpPayload::Activation), micro, s}, stage_.chunk_output(chunk, slot, b, t));
}

double PipelineEngine::train_step(const std::vector<std::vector<int32_t>>& x,
                                  const std::vector<std::vector<int32_t>>& y, int b, int t, float dloss,
                                  const std::function<void(size_t)>& grads_ready) {
    LLMC_ASSERT(int(x.size()) == micro_batches_ && int(y.size()) == micro_batches_, "one batch per micro-batch");
    cur_b_ = b;
    cur_t_ = t;
    double loss = 0.0;
    const std::vector<PpAction>& actions = schedule_[size_t(stage())];
    int backwards_left = 0;
    for (const PpAction& a : actions) backwards_left += a.op == PpOp::Backward;
    for (size_t i = 0; i < actions.size(); i++) {
        const PpAction& a = actions[i];
        // receives are posted kRecvAhead actions before theirs, so that they arrive during the
        // compute in between (the buffers of that many actions' receives wait at most)
        // (with overlap only: a receive waited for at its post would wait for what this rank has not sent yet)
        // (not on a communicator that runs its operations in posting order: there a receive posted
        // early would hold back the sends posted after it, which its peer may be waiting for)
        const size_t ahead = pp_->overlap() && !pp_->runs_in_order() ? kRecvAhead : 0;
        for (size_t j = i == 0 ? 0 : i + ahead; ahead && j <= i + ahead && j < actions.size(); j++)
            post_receives(actions[j]);
        switch (a.op) {
            case PpOp::Forward:
                run_forward(a.micro, a.chunk, x[size_t(a.micro)].data(), y[size_t(a.micro)].data(), b, t, dloss, &loss);
                break;
            case PpOp::Backward: {
                const int s = vstage(a.chunk);
                auto& slots = slot_of_[size_t(a.chunk)];
                const int slot = slots.at(a.micro);
                if (s < n_virtual() - 1)  // the gradient of this chunk's output, from stage s + 1
                    take(Key{int(PpPayload::Gradient), a.micro, s}, stage_.residual_grad(b, t),
                         "backward without its output gradient");
                const bool last = --backwards_left == 0;
                const bool overlap = last && stages() == 1 && vchunks_ == 1;
                stage_.backward_chunk(a.chunk, slot, overlap ? grads_ready : std::function<void(size_t)>());
                slots.erase(a.micro);
                free_slots_[size_t(a.chunk)].push_back(slot);
                if (s > 0) put(Key{int(PpPayload::Gradient), a.micro, s - 1}, stage_.residual_grad(b, t));
                break;
            }
            default:
                transfer(a);
                break;
        }
    }
    wait_sent(0);
    LLMC_ASSERT(receiving_.empty(), "pipeline: a received tensor left over after the step");
    LLMC_ASSERT(buffers_.empty(), "pipeline: tensors left over after the step");
    // the tied embedding: the first stage's wte and the last stage's head copy get the sum of both gradients
    // (the loss's all-reduce over the stages, which only the last one had, runs meanwhile)
    bool loss_summed = stages() == 1 || defer_loss_;  // (deferred: finish_loss, after the read back)
    if (embed_ && embed_->size() > 1 && stage_.tied_head()) {
        stage_.update_head_weight_grad([&](Tensor g) {
            embed_stage_.run(g, g, [&](const float*, float* buf) {
                CommHandle sum = embed_->all_reduce_async(buf, g.n, ReduceOp::Sum);
                if (!loss_summed) pp_->all_reduce(&loss, 1, ReduceOp::Sum);
                loss_summed = true;
                embed_->wait(sum);
            });
        });
    }
    if (!loss_summed) pp_->all_reduce(&loss, 1, ReduceOp::Sum);
    return defer_loss_ ? loss : loss / micro_batches_;
}

double PipelineEngine::finish_loss(double loss) {
    if (stages() > 1) pp_->all_reduce(&loss, 1, ReduceOp::Sum);
    return loss / micro_batches_;
}

double PipelineEngine::forward_only(const int32_t* x, const int32_t* y, int b, int t) {
    // stage by stage in pipeline order: every transfer is met by its peer's next call
    cur_b_ = b;
    cur_t_ = t;
    const size_t words = pp_stage_.words(boundary());
    CommStage::Message buf = pp_stage_.take_message(boundary());
    double loss = 0.0;
    for (int s = 0; s < n_virtual(); s++) {
        const int owner = s % stages(), chunk = s / stages();
        const int prev = (s - 1 + stages()) % stages(), next = (s + 1) % stages();
        if (owner != stage()) continue;
        if (s > 0) {
            if (prev != stage()) pp_->recv(buf.data(), words, prev, kMaxCommTag);
            pp_stage_.unpack(stage_.chunk_input(chunk, 0, b, t), buf);
        }
        const double l = stage_.forward_chunk(chunk, 0, x, y, b, t, 0.0f);
        if (s == n_virtual() - 1) {
            loss = l;
            break;
        }
        pp_stage_.pack(buf, stage_.chunk_output(chunk, 0, b, t));
        if (next != stage()) pp_->send(buf.data(), words, next, kMaxCommTag);
    }
    pp_stage_.release_message(std::move(buf));
    if (stages() > 1) pp_->all_reduce(&loss, 1, ReduceOp::Sum);
    return loss;
}

double PipelineEngine::broadcast_from_last(double x) {
    if (stages() == 1) return x;
    double v = is_last_stage() ? x : 0.0;
    pp_->all_reduce(&v, 1, ReduceOp::Sum);
    return v;
}
