// Context parallelism (parallel.cp): every sequence's T tokens split over the cp ranks of a
// group, attention run as a ring. Everything else in a layer acts on single tokens, so only
// attention (and the positions) know about it.
//
// The split is the load-balanced causal order: a sequence is cut into 2*cp chunks of T/(2cp)
// tokens; rank i holds chunks i and 2cp-1-i (in that order: its local rows are [chunk i | chunk
// 2cp-1-i] of each sequence), so every rank does the same amount of causal work.
//
// The ring (forward): each rank starts with its own K/V block and passes the block it holds to
// the next rank (cp_rank + 1) while receiving the previous rank's, cp-1 times. After each step
// it attends its queries to the block it holds (causal mask by global positions:
// Ops::attention_block_forward) and merges the partial result into a running (out, lse) by
// log-sum-exp (Ops::attention_merge). The blocks arrive in a fixed order (origin cp_rank,
// cp_rank-1, ...), so the result is the same every run.
// Backward: the blocks go around again, now with an accumulator of their dK/dV; each rank adds
// its queries' contribution (Ops::attention_block_backward, probabilities recomputed from the
// saved whole-sequence lse) and passes both on; one more pass brings each rank its own block's
// complete dK/dV. dQ stays local.
//
// The messages carry whole qkv rows (q heads included, which the receiver does not read): one
// layout for every buffer; the q heads are 1/3 of a block for multi-head attention.
// Overlap: each K/V block is posted on (Comm::exchange_async) before the attention over it runs, and
// waited for before the next step; a block's dK/dV can only leave once this rank's share is added.
//
// Tensors are backend memory in the model's dtype; the blocks travel as CommStage routes them
// (llmc/parallel/comm_stage.h): themselves on a communicator that reads the backend's memory (NCCL; MPI
// over the CPU backend), else through fp32 host copies (MPI with CUDA).
#pragma once
#include <cstddef>
#include <cstdint>

#include "llmc/comm/comm.h"
#include "llmc/parallel/comm_stage.h"
#include "llmc/backend/ops.h"
#include "llmc/backend/positions.h"

// The global positions of the t local rows of cp rank r (t = T/cp, even).
SeqPositions cp_positions(int t, int cp, int r);
// The global index of local row i of cp rank r (t local rows).
inline int cp_global_row(int i, int t, int cp, int r) { return cp_positions(t, cp, r).at(i); }
// local [B, T/cp] = rank r's rows of the B sequences of T elements in seq [B, T] (token ids).
void cp_take_rows(const int32_t* seq, int32_t* local, int B, int T, int cp, int r);

// Buffers the ring uses (carved by the model with its activations): two K/V blocks in flight,
// two dK/dV accumulators in flight, and one block's partial result.
struct RingBuffers {
    Tensor kv[2], dkv[2];  // [B, t, NH+2*NKV, HS] each
    Tensor blk_out;        // [B, t, NH, HS]
    float* blk_lse = nullptr;  // [B, NH, t]
};

class ContextParallel {
public:
    // comm: the cp group (null = a group of one: attention is Ops::attention_forward/backward).
    ContextParallel(Ops& ops, Comm* comm);

    int size() const { return comm_ ? comm_->size() : 1; }
    int rank() const { return comm_ ? comm_->rank() : 0; }
    Comm* comm() const { return comm_; }
    // This rank's positions for t local rows (SeqPositions() with one rank).
    SeqPositions positions(int t) const { return cp_positions(t, size(), rank()); }
    // Host floats over the group (the MoE layers' routing, llmc/model/model.cpp): x holds size() pieces
    // of n, this rank's at rank() * n; afterwards every rank's. Through backend memory on a device
    // communicator (CommStage::run_host).
    void all_gather_host(float* x, size_t n);

    // Ops::attention_forward over the whole sequences: qkv holds this rank's t rows of each of
    // the B sequences; out and lse get its rows' attention over every rank's keys.
    void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int t, int NH, int NKV, int HS,
                           const RingBuffers& buf);
    // Ops::attention_backward over the whole sequences: dqkv (overwrite) for this rank's rows.
    void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int t, int NH,
                            int NKV, int HS, const RingBuffers& buf);

private:
    // send to cp_rank + 1 and recv from cp_rank - 1, posted; finish_pass waits and delivers recv
    struct Passing {
        CommHandle h;
        bool staged = false;  // through message buffers (CommStage), unpacked into recv at the end
        CommStage::Message out, in;
        Tensor recv;
    };
    Passing post_pass(Tensor send, Tensor recv, int tag);
    void finish_pass(Passing& p);
    Ops& ops_;
    Comm* comm_;
    CommStage stage_;
};
