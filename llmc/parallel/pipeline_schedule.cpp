// Pipeline schedules as action lists, their layer split, and the rendezvous simulation that
// checks and times them. See pipeline_schedule.h for the model.
#include "llmc/parallel/pipeline_schedule.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/core/config.h"

// ---- names, layer split, validation -----------------------------------------------------------

PpScheduleKind parse_pp_schedule(const std::string& name) {
    if (name == "gpipe") return PpScheduleKind::GPipe;
    if (name == "1f1b") return PpScheduleKind::OneFOneB;
    if (name == "interleaved") return PpScheduleKind::Interleaved;
    throw UserError(strfmt("parallel.pp_schedule = \"%s\": expected gpipe, 1f1b or interleaved", name.c_str()));
}

const char* pp_schedule_name(PpScheduleKind kind) {
    switch (kind) {
        case PpScheduleKind::GPipe: return "gpipe";
        case PpScheduleKind::OneFOneB: return "1f1b";
        case PpScheduleKind::Interleaved: return "interleaved";
    }
    return "?";
}

namespace {

std::string int_list(const std::vector<int>& xs) {
    std::string s = "[";
    for (size_t i = 0; i < xs.size(); i++) s += (i ? ", " : "") + std::to_string(xs[i]);
    return s + "]";
}

// The checks make_pipeline_schedule needs too. allow_single_rank_chunks: pp == 1 with v > 1 is a
// well-defined schedule (chunks hand over locally) but pointless for training, so only the
// trainer's validation refuses it.
void check_schedule_args(PpScheduleKind kind, int pp, int micro_batches, int virtual_chunks,
                         bool allow_single_rank_chunks) {
    if (pp < 1) throw UserError(strfmt("parallel.pp = %d: must be at least 1", pp));
    if (virtual_chunks < 1) throw UserError(strfmt("parallel.pp_virtual = %d: must be at least 1", virtual_chunks));
    if (micro_batches < 1)
        throw UserError(strfmt("train.grad_accum = %d: the pipeline needs at least one micro-batch", micro_batches));
    if (virtual_chunks > 1 && kind != PpScheduleKind::Interleaved)
        throw UserError(strfmt("parallel.pp_virtual = %d needs parallel.pp_schedule = \"interleaved\" (got \"%s\")",
                               virtual_chunks, pp_schedule_name(kind)));
    if (virtual_chunks > 1 && pp == 1 && !allow_single_rank_chunks)
        throw UserError(strfmt("parallel.pp_virtual = %d needs parallel.pp >= 2: chunks interleave across "
                               "pipeline ranks, and one rank has no pipeline bubble to shrink",
                               virtual_chunks));
    if (kind == PpScheduleKind::Interleaved && micro_batches % pp != 0)
        throw UserError(strfmt("parallel.pp_schedule = \"interleaved\" needs train.grad_accum (micro-batches, %d) "
                               "to be a multiple of parallel.pp (%d)",
                               micro_batches, pp));
}

}  // namespace

std::vector<std::pair<int, int>> pp_layer_split(int n_layer, int pp, int virtual_chunks,
                                                const std::vector<int>& pp_layers) {
    if (pp < 1) throw UserError(strfmt("parallel.pp = %d: must be at least 1", pp));
    if (virtual_chunks < 1) throw UserError(strfmt("parallel.pp_virtual = %d: must be at least 1", virtual_chunks));
    const int n_stages = pp * virtual_chunks;
    std::vector<int> sizes;
    if (pp_layers.empty()) {
        if (n_layer < n_stages)
            throw UserError(strfmt("model.n_layer = %d is fewer than the %d pipeline stages (parallel.pp = %d x "
                                   "parallel.pp_virtual = %d): a stage would hold no layer",
                                   n_layer, n_stages, pp, virtual_chunks));
        for (int s = 0; s < n_stages; s++) sizes.push_back(n_layer / n_stages + (s < n_layer % n_stages ? 1 : 0));
    } else {
        if ((int)pp_layers.size() != n_stages)
            throw UserError(strfmt("parallel.pp_layers = %s has %zu entries, needs parallel.pp x parallel.pp_virtual "
                                   "= %d x %d = %d (one per virtual stage)",
                                   int_list(pp_layers).c_str(), pp_layers.size(), pp, virtual_chunks, n_stages));
        int sum = 0;
        for (size_t s = 0; s < pp_layers.size(); s++) {
            if (pp_layers[s] < 1)
                throw UserError(strfmt("parallel.pp_layers = %s: entry %zu is %d, every stage needs at least one layer",
                                       int_list(pp_layers).c_str(), s, pp_layers[s]));
            sum += pp_layers[s];
        }
        if (sum != n_layer)
            throw UserError(strfmt("parallel.pp_layers = %s sums to %d, needs model.n_layer = %d",
                                   int_list(pp_layers).c_str(), sum, n_layer));
        sizes = pp_layers;
    }
    std::vector<std::pair<int, int>> ranges;
    int begin = 0;
    for (int size : sizes) {
        ranges.emplace_back(begin, begin + size);
        begin += size;
    }
    return ranges;
}

void validate_pipeline(PpScheduleKind kind, int n_layer, int pp, int virtual_chunks,
                       const std::vector<int>& pp_layers, int micro_batches) {
    check_schedule_args(kind, pp, micro_batches, virtual_chunks, false);
    pp_layer_split(n_layer, pp, virtual_chunks, pp_layers);
}

void validate_pipeline(const Config& cfg) {
    validate_pipeline(parse_pp_schedule(cfg.parallel.pp_schedule), cfg.model.n_layer, cfg.parallel.pp,
                      cfg.parallel.pp_virtual, cfg.parallel.pp_layers, cfg.train.grad_accum);
}

// ---- actions ----------------------------------------------------------------------------------

int pp_message_tag(PpPayload payload, int micro, int boundary, int n_virtual_stages) {
    return (micro * (n_virtual_stages - 1) + boundary) * 2 + (int)payload;
}

PpAction pp_forward(int micro, int chunk) {
    PpAction a;
    a.op = PpOp::Forward;
    a.micro = micro;
    a.chunk = chunk;
    return a;
}

PpAction pp_backward(int micro, int chunk) {
    PpAction a = pp_forward(micro, chunk);
    a.op = PpOp::Backward;
    return a;
}

PpAction pp_comm(std::vector<PpTransfer> transfers) {
    LLMC_ASSERT(!transfers.empty(), "a communication action needs at least one transfer");
    PpAction a;
    if (transfers.size() > 1) a.op = PpOp::SendRecv;
    else a.op = transfers[0].is_send ? PpOp::Send : PpOp::Recv;
    a.transfers = std::move(transfers);
    return a;
}

namespace {

std::string to_string(const PpTransfer& t) {
    return strfmt("%s %s micro %d chunk %d %s rank %d (tag %d)", t.is_send ? "send" : "recv",
                  t.payload == PpPayload::Activation ? "activation" : "gradient", t.micro, t.chunk,
                  t.is_send ? "->" : "<-", t.peer, t.tag);
}

}  // namespace

std::string to_string(const PpAction& a) {
    switch (a.op) {
        case PpOp::Forward: return strfmt("Forward(micro %d, chunk %d)", a.micro, a.chunk);
        case PpOp::Backward: return strfmt("Backward(micro %d, chunk %d)", a.micro, a.chunk);
        case PpOp::Send:
        case PpOp::Recv:
        case PpOp::SendRecv: break;
    }
    std::string s = a.op == PpOp::Send ? "Send[" : a.op == PpOp::Recv ? "Recv[" : "SendRecv[";
    for (size_t i = 0; i < a.transfers.size(); i++) s += (i ? ", " : "") + to_string(a.transfers[i]);
    return s + "]";
}

// ---- schedules --------------------------------------------------------------------------------

namespace {

struct Work {
    bool forward;
    int micro, chunk;
};

// The order in which every rank visits (micro, chunk) forwards and backwards. Interleaved:
// Megatron's groups of pp micro-batches through chunk 0, 1, ..., v-1 (backwards v-1, ..., 0), so
// a micro-batch's activation comes back to rank 0 for its next chunk exactly when the group ends.
void visit_orders(int pp, int micro_batches, int v, std::vector<Work>* fwd, std::vector<Work>* bwd) {
    for (int k = 0; k < micro_batches * v; k++) {
        int in_group = k % (pp * v);
        int micro = k / (pp * v) * pp + in_group % pp;
        int chunk = in_group / pp;
        fwd->push_back({true, micro, chunk});
        bwd->push_back({false, micro, v - 1 - chunk});
    }
}

int warmup_forwards(PpScheduleKind kind, int pp, int micro_batches, int v, int rank) {
    const int total = micro_batches * v;
    if (pp == 1 && v == 1) return 0;  // F, B, F, B: exactly a run without pipeline
    switch (kind) {
        case PpScheduleKind::GPipe: return total;
        case PpScheduleKind::OneFOneB: return std::min(pp - rank - 1, total);
        case PpScheduleKind::Interleaved:
            // Megatron: with as many micro-batches as ranks there is no steady state. Otherwise the
            // last rank starts backwards once its (v-1)*pp forwards of the earlier chunks are done;
            // a tick's outputs leave only after the tick, so activations reach the next rank and
            // gradients the previous one a tick later: two waves one rank per tick in opposite
            // directions, hence 2 more warm-up forwards per rank towards rank 0.
            if (micro_batches == pp) return total;
            return std::min((v - 1) * pp + 2 * (pp - 1 - rank), total);
    }
    return total;
}

// Rank `rank`'s ticks: tick i runs forward i (while any are left) and, from the end of warm-up,
// backward i - warmup. Flattened, that is warm-up, one-forward-one-backward, cool-down.
std::vector<std::vector<Work>> rank_ticks(PpScheduleKind kind, int pp, int micro_batches, int v, int rank) {
    std::vector<Work> fwd, bwd;
    visit_orders(pp, micro_batches, v, &fwd, &bwd);
    const int total = (int)fwd.size();
    const int warmup = warmup_forwards(kind, pp, micro_batches, v, rank);
    std::vector<std::vector<Work>> ticks(total + warmup);
    for (int i = 0; i < (int)ticks.size(); i++) {
        if (i < total) ticks[i].push_back(fwd[i]);
        if (i >= warmup) ticks[i].push_back(bwd[i - warmup]);
    }
    return ticks;
}

// The message a compute produces (activation to s+1 after Forward, gradient to s-1 after Backward),
// as its send half on `rank` and its receive half on *dst. False when there is none: the last stage's
// output and the first stage's input gradient go nowhere, and between chunks of one rank (pp == 1)
// the data is handed over in memory.
bool output_message(int pp, int v, int rank, const Work& w, PpTransfer* send, PpTransfer* recv, int* dst) {
    const int n_stages = pp * v;
    const int s = pp_virtual_stage(rank, w.chunk, pp);
    const int to = w.forward ? s + 1 : s - 1;
    if (to < 0 || to >= n_stages || to % pp == rank) return false;
    const PpPayload payload = w.forward ? PpPayload::Activation : PpPayload::Gradient;
    const int tag = pp_message_tag(payload, w.micro, std::min(s, to), n_stages);
    *dst = to % pp;
    *send = {true, payload, *dst, w.micro, w.chunk, tag};
    *recv = {false, payload, rank, w.micro, to / pp, tag};
    return true;
}

// The receive a compute needs first: the activation from s-1 (Forward) or gradient from s+1 (Backward).
bool input_message(int pp, int v, int rank, const Work& w, PpTransfer* recv) {
    const int n_stages = pp * v;
    const int s = pp_virtual_stage(rank, w.chunk, pp);
    const int from = w.forward ? s - 1 : s + 1;
    if (from < 0 || from >= n_stages || from % pp == rank) return false;
    const PpPayload payload = w.forward ? PpPayload::Activation : PpPayload::Gradient;
    const int tag = pp_message_tag(payload, w.micro, std::min(s, from), n_stages);
    *recv = {false, payload, from % pp, w.micro, w.chunk, tag};
    return true;
}

PpAction compute_action(const Work& w) {
    return w.forward ? pp_forward(w.micro, w.chunk) : pp_backward(w.micro, w.chunk);
}

// Receive right before the compute that needs the data, send right after the compute that made it,
// and post a send directly followed by a receive as one SendRecv. In 1F1B's steady state rank r sends
// an activation up while rank r+1 sends a gradient down: as two blocking calls each side would wait
// in its send for the other's receive.
std::vector<PpAction> just_in_time(int pp, int v, int rank, const std::vector<std::vector<Work>>& ticks) {
    std::vector<PpAction> out;
    bool have_send = false;
    PpTransfer send, recv, unused;
    int dst;
    for (const auto& tick : ticks) {
        for (const Work& w : tick) {
            bool have_recv = input_message(pp, v, rank, w, &recv);
            if (have_send && have_recv) out.push_back(pp_comm({send, recv}));
            else if (have_send) out.push_back(pp_comm({send}));
            else if (have_recv) out.push_back(pp_comm({recv}));
            out.push_back(compute_action(w));
            have_send = output_message(pp, v, rank, w, &send, &unused, &dst);
        }
    }
    if (have_send) out.push_back(pp_comm({send}));
    return out;
}

// Megatron's interleaved communication: rank r's tick i is global tick i + r; after each tick every
// rank posts, in one SendRecv, what it produced in that tick and what its neighbours produced in the
// same global tick. Both halves of every message are posted at the same global tick, so the lists
// cannot deadlock, and all ranks meet at tick boundaries whatever the forward/backward time ratio.
// The warm-up of warmup_forwards() makes every message arrive before the tick that consumes it.
// Just-in-time transfers do not work here: the activation rank pp-1 sends to rank 0's next chunk
// is consumed a few computes after it is produced, and under rendezvous the sender would block on it
// (deadlock for some sizes, stalls whenever forward and backward times differ).
PpSchedule tick_exchanges(int pp, int v, const std::vector<std::vector<std::vector<Work>>>& ticks) {
    size_t n_global = 0;
    for (int r = 0; r < pp; r++) n_global = std::max(n_global, ticks[r].size() + r + 1);
    // exchange[r][g + 1]: transfers rank r posts after global tick g (g = r - 1: before its first tick)
    std::vector<std::vector<std::vector<PpTransfer>>> exchange(pp, std::vector<std::vector<PpTransfer>>(n_global + 1));
    for (int r = 0; r < pp; r++)
        for (size_t i = 0; i < ticks[r].size(); i++)
            for (const Work& w : ticks[r][i]) {
                PpTransfer send, recv;
                int dst;
                if (!output_message(pp, v, r, w, &send, &recv, &dst)) continue;
                exchange[r][i + r + 1].push_back(send);
                exchange[dst][i + r + 1].push_back(recv);
            }
    PpSchedule schedule(pp);
    for (int r = 0; r < pp; r++) {
        for (size_t g1 = 0; g1 < exchange[r].size(); g1++) {
            const long i = (long)g1 - 1 - r;  // this rank's tick at global tick g1 - 1
            if (i >= 0 && i < (long)ticks[r].size())
                for (const Work& w : ticks[r][i]) schedule[r].push_back(compute_action(w));
            else
                LLMC_ASSERT(exchange[r][g1].empty() || i == -1, "tick exchange outside the rank's ticks");
            auto& x = exchange[r][g1];
            if (x.empty()) continue;
            // Megatron's argument order: sends before receives, activations before gradients.
            std::stable_sort(x.begin(), x.end(), [](const PpTransfer& a, const PpTransfer& b) {
                if (a.is_send != b.is_send) return a.is_send;
                return (int)a.payload < (int)b.payload;
            });
            schedule[r].push_back(pp_comm(x));
        }
    }
    return schedule;
}

}  // namespace

PpSchedule make_pipeline_schedule(PpScheduleKind kind, int pp, int micro_batches, int virtual_chunks) {
    check_schedule_args(kind, pp, micro_batches, virtual_chunks, true);
    std::vector<std::vector<std::vector<Work>>> ticks;
    for (int r = 0; r < pp; r++) ticks.push_back(rank_ticks(kind, pp, micro_batches, virtual_chunks, r));
    if (kind == PpScheduleKind::Interleaved && micro_batches != pp) return tick_exchanges(pp, virtual_chunks, ticks);
    PpSchedule schedule;
    for (int r = 0; r < pp; r++) schedule.push_back(just_in_time(pp, virtual_chunks, r, ticks[r]));
    return schedule;
}

// ---- rendezvous simulation --------------------------------------------------------------------

namespace {

// All ranks execute their lists in order. A compute takes its time; a communication action is
// posted when the rank reaches it (at its clock) and each transfer completes when the peer's current
// action holds the opposite half with the same payload and tag, at the later of the two post times.
// Nothing is buffered: that is the strictest semantics MPI allows, so lists that pass here pass with
// any buffering too.
class Rendezvous {
   public:
    Rendezvous(const PpSchedule& s, int pp, int m, int v, double t_forward, double t_backward)
        : sched_(s), pp_(pp), m_(m), v_(v), n_stages_(pp * v), t_fwd_(t_forward), t_bwd_(t_backward) {
        const size_t slots = (size_t)m * v;
        pc_.assign(pp, 0);
        clock_.assign(pp, 0.0);
        checked_.assign(pp, false);
        matched_.assign(pp, {});
        match_time_.assign(pp, 0.0);
        for (auto* flags : {&fwd_done_, &bwd_done_, &act_sent_, &grad_sent_})
            flags->assign(pp, std::vector<char>(slots, 0));
        act_in_.assign(pp, std::vector<char>(slots, kNone));
        grad_in_.assign(pp, std::vector<char>(slots, kNone));
        stats_.busy.assign(pp, 0.0);
        stats_.idle_fraction.assign(pp, 0.0);
        stats_.peak_in_flight.assign(pp, 0);
        stats_.peak_buffered.assign(pp, 0);
        in_flight_.assign(pp, 0);
        buffered_.assign(pp, 0);
    }

    // "" or the first problem found.
    std::string run() {
        if ((int)sched_.size() != pp_)
            return strfmt("the schedule has %zu rank lists, expected pp = %d", sched_.size(), pp_);
        bool progress = true;
        while (progress && error_.empty()) {
            progress = false;
            for (int r = 0; r < pp_ && error_.empty(); r++)
                while (error_.empty() && step(r)) progress = true;
        }
        if (!error_.empty()) return error_;
        std::string stuck;
        for (int r = 0; r < pp_; r++) {
            stuck += r ? "; " : "";
            if (done(r)) stuck += strfmt("rank %d finished", r);
            else stuck += strfmt("rank %d waits at action %zu %s", r, pc_[r], to_string(current(r)).c_str());
        }
        for (int r = 0; r < pp_; r++)
            if (!done(r)) return "deadlock: " + stuck;
        for (int r = 0; r < pp_; r++)
            for (int c = 0; c < v_; c++)
                for (int mb = 0; mb < m_; mb++) {
                    if (!fwd_done_[r][slot(mb, c)])
                        return strfmt("rank %d: Forward(micro %d, chunk %d) is missing", r, mb, c);
                    if (!bwd_done_[r][slot(mb, c)])
                        return strfmt("rank %d: Backward(micro %d, chunk %d) is missing", r, mb, c);
                }
        stats_.makespan = *std::max_element(clock_.begin(), clock_.end());
        double busy = 0;
        for (int r = 0; r < pp_; r++) {
            busy += stats_.busy[r];
            stats_.idle_fraction[r] = stats_.makespan > 0 ? 1.0 - stats_.busy[r] / stats_.makespan : 0.0;
        }
        stats_.idle_fraction_total = stats_.makespan > 0 ? 1.0 - busy / (pp_ * stats_.makespan) : 0.0;
        return "";
    }

    const PipelineStats& stats() const { return stats_; }

   private:
    enum : char { kNone = 0, kReceived = 1, kConsumed = 2 };

    const PpSchedule& sched_;
    const int pp_, m_, v_, n_stages_;
    const double t_fwd_, t_bwd_;
    std::vector<size_t> pc_;
    std::vector<double> clock_;  // when the rank reached its current action
    std::vector<char> checked_;  // current communication action validated
    std::vector<std::vector<char>> matched_;  // per transfer of the current action
    std::vector<double> match_time_;          // latest match of the current action
    std::vector<std::vector<char>> fwd_done_, bwd_done_, act_sent_, grad_sent_, act_in_, grad_in_;  // [rank][slot]
    std::vector<int> in_flight_, buffered_;
    PipelineStats stats_;
    std::string error_;

    size_t slot(int micro, int chunk) const { return (size_t)micro * v_ + chunk; }
    bool done(int r) const { return pc_[r] >= sched_[r].size(); }
    const PpAction& current(int r) const { return sched_[r][pc_[r]]; }
    bool is_comm(const PpAction& a) const { return a.op != PpOp::Forward && a.op != PpOp::Backward; }

    bool fail(int r, const std::string& what) {
        error_ = strfmt("rank %d action %zu %s: %s", r, pc_[r], to_string(current(r)).c_str(), what.c_str());
        return false;
    }

    bool in_range(int r, int micro, int chunk) {
        if (micro < 0 || micro >= m_ || chunk < 0 || chunk >= v_)
            return fail(r, strfmt("micro-batch %d / chunk %d out of range (%d micro-batches, %d chunks)", micro, chunk,
                                  m_, v_));
        return true;
    }

    void bump(std::vector<int>& count, std::vector<int>& peak, int r, int delta) {
        count[r] += delta;
        peak[r] = std::max(peak[r], count[r]);
    }

    // Runs rank r's current action if it can; true when anything moved.
    bool step(int r) {
        if (done(r)) return false;
        const PpAction& a = current(r);
        if (!is_comm(a)) return compute(r, a);
        if (!check_comm(r)) return false;
        bool progress = false;
        for (size_t i = 0; i < a.transfers.size(); i++)
            if (!matched_[r][i] && match(r, i)) progress = true;
        if (!error_.empty()) return false;
        if (std::find(matched_[r].begin(), matched_[r].end(), 0) != matched_[r].end()) return progress;
        clock_[r] = std::max(clock_[r], match_time_[r]);
        advance(r);
        return true;
    }

    void advance(int r) {
        pc_[r]++;
        checked_[r] = false;
        matched_[r].clear();  // check_comm() sizes it when the rank reaches its next transfer
    }

    bool compute(int r, const PpAction& a) {
        if (!in_range(r, a.micro, a.chunk)) return false;
        const size_t k = slot(a.micro, a.chunk);
        const int s = pp_virtual_stage(r, a.chunk, pp_);
        if (a.op == PpOp::Forward) {
            if (fwd_done_[r][k]) return fail(r, "duplicate Forward");
            if (s > 0) {
                if ((s - 1) % pp_ == r) {  // pp == 1: the previous chunk is on this rank
                    if (!fwd_done_[r][slot(a.micro, a.chunk - 1)])
                        return fail(r, "runs before its input: Forward of the previous chunk not done");
                } else {
                    if (act_in_[r][k] != kReceived)
                        return fail(r, strfmt("runs before its input: the activation from rank %d (virtual stage %d) "
                                              "has not arrived",
                                              (s - 1) % pp_, s - 1));
                    act_in_[r][k] = kConsumed;
                    bump(buffered_, stats_.peak_buffered, r, -1);
                }
            }
            fwd_done_[r][k] = 1;
            bump(in_flight_, stats_.peak_in_flight, r, +1);
            clock_[r] += t_fwd_ / v_;
            stats_.busy[r] += t_fwd_ / v_;
        } else {
            if (bwd_done_[r][k]) return fail(r, "duplicate Backward");
            if (!fwd_done_[r][k]) return fail(r, "runs before its Forward");
            if (s < n_stages_ - 1) {
                if ((s + 1) % pp_ == r) {
                    if (!bwd_done_[r][slot(a.micro, a.chunk + 1)])
                        return fail(r, "runs before its gradient: Backward of the next chunk not done");
                } else {
                    if (grad_in_[r][k] != kReceived)
                        return fail(r, strfmt("runs before its gradient: the gradient from rank %d (virtual stage %d) "
                                              "has not arrived",
                                              (s + 1) % pp_, s + 1));
                    grad_in_[r][k] = kConsumed;
                    bump(buffered_, stats_.peak_buffered, r, -1);
                }
            }
            bwd_done_[r][k] = 1;
            in_flight_[r]--;
            clock_[r] += t_bwd_ / v_;
            stats_.busy[r] += t_bwd_ / v_;
        }
        advance(r);
        return true;
    }

    // Validates rank r's current communication action once, when the rank reaches it.
    bool check_comm(int r) {
        if (checked_[r]) return true;
        const PpAction& a = current(r);
        if (a.transfers.empty()) return fail(r, "a communication action without transfers");
        matched_[r].assign(a.transfers.size(), 0);
        match_time_[r] = clock_[r];
        for (const PpTransfer& t : a.transfers) {
            if (!in_range(r, t.micro, t.chunk)) return false;
            const size_t k = slot(t.micro, t.chunk);
            const int s = pp_virtual_stage(r, t.chunk, pp_);
            const bool act = t.payload == PpPayload::Activation;
            // the other end: activations go up a stage, gradients down; a receive names the sender
            const int other = (act == t.is_send) ? s + 1 : s - 1;
            const char* what = act ? "activation" : "gradient";
            if (other < 0 || other >= n_stages_)
                return fail(r, strfmt("virtual stage %d has no %s to %s", s, what, t.is_send ? "send" : "receive"));
            if (other % pp_ == r)
                return fail(r, strfmt("virtual stage %d is on this rank: its %s is handed over in memory", other,
                                      what));
            if (t.peer != other % pp_)
                return fail(r, strfmt("wrong peer %d: that %s comes from or goes to rank %d (virtual stage %d)",
                                      t.peer, what, other % pp_, other));
            const int tag = pp_message_tag(t.payload, t.micro, std::min(s, other), n_stages_);
            if (t.tag != tag) return fail(r, strfmt("tag %d, expected %d", t.tag, tag));
            if (t.is_send) {
                auto& produced = act ? fwd_done_[r][k] : bwd_done_[r][k];
                auto& sent = act ? act_sent_[r][k] : grad_sent_[r][k];
                if (!produced)
                    return fail(r, strfmt("sends a %s not yet produced (its %s has not run)", what,
                                          act ? "Forward" : "Backward"));
                if (sent) return fail(r, strfmt("sends the same %s twice", what));
                sent = 1;
            } else {
                if ((act ? act_in_ : grad_in_)[r][k] != kNone)
                    return fail(r, strfmt("receives the same %s twice", what));
            }
        }
        checked_[r] = true;
        return true;
    }

    // Matches transfer i of rank r with the opposite half on its peer's current action, if posted.
    bool match(int r, size_t i) {
        const PpTransfer& t = current(r).transfers[i];
        const int q = t.peer;
        if (done(q) || !is_comm(current(q))) return false;
        if (!check_comm(q)) return false;
        const PpAction& b = current(q);
        for (size_t j = 0; j < b.transfers.size(); j++) {
            const PpTransfer& u = b.transfers[j];
            if (matched_[q][j] || u.peer != r || u.is_send == t.is_send || u.payload != t.payload || u.tag != t.tag)
                continue;
            const double when = std::max(clock_[r], clock_[q]);
            matched_[r][i] = matched_[q][j] = 1;
            match_time_[r] = std::max(match_time_[r], when);
            match_time_[q] = std::max(match_time_[q], when);
            const int receiver = t.is_send ? q : r;
            const PpTransfer& half = t.is_send ? u : t;
            auto& in = half.payload == PpPayload::Activation ? act_in_ : grad_in_;
            in[receiver][slot(half.micro, half.chunk)] = kReceived;
            bump(buffered_, stats_.peak_buffered, receiver, +1);
            return true;
        }
        return false;
    }
};

}  // namespace

std::string check_pipeline_schedule(const PpSchedule& schedule, int pp, int micro_batches, int virtual_chunks) {
    if (pp < 1 || micro_batches < 1 || virtual_chunks < 1)
        return strfmt("pp = %d, micro-batches = %d, chunks = %d: all must be at least 1", pp, micro_batches,
                      virtual_chunks);
    return Rendezvous(schedule, pp, micro_batches, virtual_chunks, 1.0, 1.0).run();
}

PipelineStats simulate_pipeline(const PpSchedule& schedule, int pp, int micro_batches, int virtual_chunks,
                                double t_forward, double t_backward) {
    LLMC_ASSERT(pp >= 1 && micro_batches >= 1 && virtual_chunks >= 1, "simulate_pipeline: bad sizes");
    Rendezvous sim(schedule, pp, micro_batches, virtual_chunks, t_forward, t_backward);
    std::string error = sim.run();
    LLMC_ASSERT(error.empty(), "simulate_pipeline on a schedule that fails the checker: " + error);
    return sim.stats();
}

std::string describe_pipeline(PpScheduleKind kind, int pp, int micro_batches, int virtual_chunks) {
    PipelineStats st = simulate_pipeline(make_pipeline_schedule(kind, pp, micro_batches, virtual_chunks), pp,
                                         micro_batches, virtual_chunks, 1.0, 2.0);
    const int stage = (int)(std::max_element(st.peak_in_flight.begin(), st.peak_in_flight.end()) -
                            st.peak_in_flight.begin());
    const bool interleaved = kind == PpScheduleKind::Interleaved;
    const double ideal = (pp - 1.0) / ((interleaved ? virtual_chunks : 1) * micro_batches + pp - 1.0);
    std::string sizes = strfmt("%d stage%s x ", pp, pp == 1 ? "" : "s");
    if (interleaved) sizes += strfmt("%d chunks x ", virtual_chunks);
    sizes += strfmt("%d micro-batches", micro_batches);
    return strfmt("%s: %s, idle fraction %.3f (%s = %.3f), peak %d %s in flight on stage %d", pp_schedule_name(kind),
                  sizes.c_str(), st.idle_fraction_total, interleaved ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)", ideal,
                  st.peak_in_flight[stage], interleaved ? "(micro-batch, chunk) pairs" : "micro-batches", stage);
}
