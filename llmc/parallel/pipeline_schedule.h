// Pipeline-parallel schedules as data (pure functions, no MPI, no tensors).
//
// A pipeline of pp ranks holds the model's layers split into V = pp * v virtual stages
// (v = parallel.pp_virtual model chunks per rank). Megatron's interleaved assignment: rank r
// holds virtual stages r, r + pp, r + 2 pp, ..., so its chunk c is virtual stage s = c * pp + r.
// Micro-batches m = train.grad_accum.
//
// make_pipeline_schedule() gives every pipeline rank the ordered list of actions it executes in
// one optimizer step: Forward / Backward of one (micro-batch, chunk), and the point-to-point
// transfers between neighbouring virtual stages (activations forward, gradients backward).
// The engine (llmc/parallel/pipeline.*) executes the lists literally; check_pipeline_schedule() proves a
// list deadlock-free and dependency-correct under rendezvous sends, and simulate_pipeline()
// measures its bubble and its activation memory, so both are settled before a tensor moves.
#pragma once
#include <string>
#include <utility>
#include <vector>

struct Config;

enum class PpScheduleKind { GPipe, OneFOneB, Interleaved };

// "gpipe" | "1f1b" | "interleaved"; anything else is a UserError naming parallel.pp_schedule.
PpScheduleKind parse_pp_schedule(const std::string& name);
const char* pp_schedule_name(PpScheduleKind kind);

// Chunk c of pipeline rank r is virtual stage c * pp + r.
inline int pp_virtual_stage(int rank, int chunk, int pp) { return chunk * pp + rank; }

// [begin, end) layer range of every virtual stage s = chunk * pp + rank, in stage order
// (contiguous, stage 0 starts at layer 0). pp_layers empty = balanced: sizes differ by at most
// one and the extra layers go to the EARLIER stages, because the last stage also runs the LM
// head (the largest matmul of a GPT-2 step) and the first only an embedding lookup.
// Throws UserError (naming parallel.pp_layers / model.n_layer and the values) when pp_layers has
// the wrong length (must be pp * virtual_chunks), an entry below 1, a sum other than n_layer,
// or when n_layer < pp * virtual_chunks (a stage with no layer).
std::vector<std::pair<int, int>> pp_layer_split(int n_layer, int pp, int virtual_chunks,
                                                const std::vector<int>& pp_layers);

// Every check on the pipeline layout the config alone can decide; throws UserError naming the key:
// the layer split above; pp_virtual > 1 only with pp_schedule "interleaved" and pp >= 2 (one rank
// has no pipeline to fill, its chunks would only cost activation memory); interleaved needs
// train.grad_accum to be a multiple of pp (Megatron's requirement: micro-batches go through the
// chunks in groups of pp).
void validate_pipeline(PpScheduleKind kind, int n_layer, int pp, int virtual_chunks,
                       const std::vector<int>& pp_layers, int micro_batches);
void validate_pipeline(const Config& cfg);  // reads parallel.*, model.n_layer, train.grad_accum

// ---- actions ---------------------------------------------------------------------------------

enum class PpOp {
    Forward,   // run chunk `chunk` forward on micro-batch `micro`
    Backward,  // run chunk `chunk` backward on micro-batch `micro`
    Send,      // one outgoing transfer
    Recv,      // one incoming transfer
    SendRecv,  // 2 to 4 transfers posted together; returns when all are done (MPI_Sendrecv for
               // one send + one recv, else Isend/Irecv + Waitall or an NCCL group)
};

enum class PpPayload { Activation = 0, Gradient = 1 };

// One half of a point-to-point message, as seen from the rank that executes it.
// An activation travels from virtual stage e to e + 1, a gradient from e + 1 to e; e is the
// message's boundary. The hidden state at a boundary is (micro_batch, seq_len, d_model) both ways.
struct PpTransfer {
    bool is_send = false;
    PpPayload payload = PpPayload::Activation;
    int peer = -1;   // pipeline rank on the other side
    int micro = -1;  // micro-batch the tensor belongs to
    int chunk = -1;  // THIS rank's chunk that produced it (send) or will consume it (recv); the
                     // two sides differ where the message wraps from rank pp-1 to rank 0
    int tag = -1;    // pp_message_tag(): the same number on both sides, unique within one step
};

struct PpAction {
    PpOp op = PpOp::Forward;
    int micro = -1;  // Forward / Backward
    int chunk = -1;  // Forward / Backward
    std::vector<PpTransfer> transfers;  // Send / Recv / SendRecv
};

using PpSchedule = std::vector<std::vector<PpAction>>;  // [pipeline rank][position]

// (micro * (V - 1) + boundary) * 2 + payload: unique per message of one step, below
// 2 * micro_batches * (V - 1). MPI only guarantees tags up to 32767; larger steps can fall back
// to the payload as the tag, since the lists post every pair's messages in matching order.
int pp_message_tag(PpPayload payload, int micro, int boundary, int n_virtual_stages);

PpAction pp_forward(int micro, int chunk);
PpAction pp_backward(int micro, int chunk);
// Send, Recv or SendRecv from the number and direction of the transfers.
PpAction pp_comm(std::vector<PpTransfer> transfers);

std::string to_string(const PpAction& a);  // "Forward(micro 3, chunk 1)", "SendRecv[send ..., recv ...]"

// Every rank's action list for one optimizer step (pp ranks, micro_batches, virtual_chunks per rank):
//  - GPipe: all forwards, then all backwards (micro-batch order both times).
//  - 1F1B: pp - rank - 1 warm-up forwards, then one forward / one backward, then the remaining
//    backwards. PipeDream-Flush / Megatron's non-interleaved schedule.
//  - Interleaved: Megatron's interleaved 1F1B. Forwards visit micro-batches in groups of pp:
//    group g runs micro-batches g*pp .. g*pp+pp-1 through chunk 0, then chunk 1, ..., chunk v-1;
//    backwards the same groups through the chunks in reverse. Warm-up forwards on rank r:
//    (v-1)*pp + 2*(pp-1-r), or all of them when micro_batches == pp.
// pp == 1 gives Forward, Backward alternation for every kind (what a run without pipeline does).
// Transfers: GPipe, 1F1B and interleaved with micro_batches == pp receive just before the compute
// that needs the data and send just after the compute that made it; a send directly followed by a
// receive becomes one SendRecv (1F1B's steady state deadlocks under rendezvous sends without it).
// Interleaved otherwise runs in Megatron's ticks: a tick is one forward and/or one backward, and
// after each tick a rank exchanges everything its neighbours and it produced in that tick, in one
// SendRecv (rank r's tick i is global tick i + r; both sides of a message meet at the same global
// tick). Slower per message, but it lines the ranks up whatever the forward/backward time ratio.
// Throws UserError for arguments validate_pipeline rejects (except pp == 1 with v > 1, which is
// built with local hand-offs between chunks: no transfers).
PpSchedule make_pipeline_schedule(PpScheduleKind kind, int pp, int micro_batches, int virtual_chunks);

// ---- proofs ----------------------------------------------------------------------------------

// "" when the schedule is correct, else what is wrong. Simulates all ranks executing their lists
// in order under RENDEZVOUS semantics: a transfer completes only when its peer has posted the
// opposite half with the same payload and tag (a send blocks until the receive is posted and vice
// versa); a SendRecv completes when all its halves have. Reports: deadlock (every stuck rank, its
// position and action), a transfer to the wrong peer or with a wrong tag, a send of data not yet
// produced, a Forward without its input (the activation from virtual stage s-1, received or, with
// pp == 1, computed locally), a Backward without its Forward or its incoming gradient, a
// duplicate or missing Forward / Backward of some (micro, chunk), and out-of-range values.
std::string check_pipeline_schedule(const PpSchedule& schedule, int pp, int micro_batches, int virtual_chunks);

struct PipelineStats {
    double makespan = 0;                // when the last rank finishes (all start at 0)
    std::vector<double> busy;           // [rank] time in Forward / Backward
    std::vector<double> idle_fraction;  // [rank] 1 - busy / makespan
    double idle_fraction_total = 0;     // 1 - sum(busy) / (pp * makespan)
    // [rank] most (micro, chunk) pairs whose Forward is done and Backward is not: the activation
    // slots (stored layer activations of one chunk for one micro-batch) the engine must allocate.
    std::vector<int> peak_in_flight;
    // [rank] most received tensors (activations waiting for their Forward, gradients waiting for
    // their Backward) held at once: receive buffers of one boundary hidden state each.
    std::vector<int> peak_buffered;
};

// Timing simulation: a Forward of one chunk takes t_forward / virtual_chunks, a Backward
// t_backward / virtual_chunks (t_* are a whole model stage's times), transfers take no time but
// keep rendezvous semantics (a half completes when both sides have posted it). Each rank runs its
// list in order, waiting where the list makes it wait. The schedule must pass the checker
// (asserted).
PipelineStats simulate_pipeline(const PpSchedule& schedule, int pp, int micro_batches, int virtual_chunks,
                                double t_forward, double t_backward);

// One line for the trainer's start-up output (simulated with t_backward = 2 * t_forward), e.g.
// "1f1b: 4 stages x 8 micro-batches, idle fraction 0.273 ((p-1)/(m+p-1) = 0.273), peak 4 micro-batches
// in flight on stage 0".
std::string describe_pipeline(PpScheduleKind kind, int pp, int micro_batches, int virtual_chunks);
