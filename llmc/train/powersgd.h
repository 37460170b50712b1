// PowerSGD (parallel.grad_compression = "powersgd"; Vogels, Karimireddy, Jaggi 2019, "PowerSGD:
// Practical Low-Rank Gradient Compression for Distributed Optimization"): the DP all-reduce of the
// gradients at ZeRO-0 sends a rank-r approximation of each gradient matrix instead of the matrix.
//
// Which tensors: a parameter of n rows and m columns (its local shape: ParamSpec's rows x
// [col_begin, col_end)) is compressed when r (n + m) < n m, i.e. when its two factors are smaller
// than it. Vectors (biases, norms: m = 1), small matrices and every matrix with r >= min(n, m)
// (the "full rank" case) fail that test and go through the plain all-reduce with the padding: a
// rank at least every matrix's smaller side is the uncompressed all-reduce itself, not an
// approximation of it, so that it equals plain data parallelism exactly (test_powersgd.sh compares
// the losses and weights with plain dp2's; the factorisation itself would match only to rounding).
//
// One round, on every DP rank i, per compressed matrix M_i (this rank's summed gradient, n x m,
// row-major) with its error feedback E_i and the warm-start factor Q (m x r, alike on every rank):
//   M'_i = M_i + E_i
//   P    = sum_i M'_i Q                  all-reduce (one for every matrix's P and the plain elements)
//   P^   = P with orthonormal columns    modified Gram-Schmidt, left to right, in double
//   Q    = sum_i M'_i^T P^               all-reduce (one for every matrix's Q)
//   G    = P^ Q^T                        the gradient the optimizer sees: ~ sum_i M'_i
//   E_i  = M'_i - G / dp                 this rank's residual (each rank's own)
//   Q    = Q / dp                        the next round's warm start (a column that came out all
//                                        zero, a matrix whose gradient was zero, keeps its previous
//                                        value, so that it can come back to life)
// The trainer's gradients are per-rank shares of the mean (summed by the all-reduce), so G is the
// approximation of that sum and E_i the rank's share of what it missed. Q starts from N(0, 1) drawn
// from train.seed (Rng stream per matrix), the same on every rank. Every loop runs in a fixed order
// and the all-reduces are Comm's deterministic ones: the same config gives the same bits.
//
// A round whose sums are not finite (a NaN gradient on some rank: the step is skipped by the
// trainer) leaves E and Q as they were, alike on every rank (the sums are).
//
// Host implementation: the gradient buffer is copied to host memory, the factors computed there,
// and the result copied back (on the CPU backend its memory is host memory already). CUDA is refused
// (train_gpt: a step would copy the gradients through the host, DESIGN.md's first GPU rule).
//
// Bytes: bytes_sent() counts the two all-reduces as DataParallel does (ring model, 2 (p - 1) / p of
// the fp32 buffer); ratio() is the plain all-reduce's floats over the floats sent (the log's
// "compression").
//
// Checkpoints (llmc/io/checkpoint.h, PowerSgdState): every DP rank's E (parameter-shaped, zero
// outside the compressed matrices) and Q, so that a run resumes bit-exactly; at the dp and rank that
// saved it only.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/model/param_table.h"
#include "llmc/parallel/comm_stage.h"

// The compressed matrices of a layout at rank r and the floats each round sends.
struct PowerSgdPlan {
    struct Matrix {
        size_t offset, rows, cols;  // in the flat buffer (elements), row-major
        size_t q_offset;            // its Q (cols x r) in the concatenated Q
    };
    int rank = 0;
    size_t total = 0;  // the flat buffer (padded): what the plain all-reduce sends
    std::vector<Matrix> matrices;
    std::vector<std::pair<size_t, size_t>> plain;  // [begin, end) runs sent as they are, ascending
    size_t plain_elems = 0, p_elems = 0, q_elems = 0;
    size_t sent() const { return plain_elems + p_elems + q_elems; }
    double ratio() const { return sent() ? double(total) / double(sent()) : 1.0; }
};
PowerSgdPlan powersgd_plan(const ParamLayout& layout, int rank);

// Modified Gram-Schmidt on the columns of p (n x r, row-major), in place, left to right, sums in
// double: each column minus its projections on the ones before, then scaled to norm 1; a column
// that is (or becomes) exactly zero stays zero.
void orthonormalize_columns(float* p, size_t n, size_t r);

class PowerSgd {
public:
    // layout: this rank's parameters (padded); piece: floats per collective (a gradient bucket);
    // seed: Q's init.
    PowerSgd(const ParamLayout& layout, int rank, uint64_t seed, Ops& ops, Comm& dp, size_t piece);

    const PowerSgdPlan& plan() const { return plan_; }
    // grads: this rank's whole gradient buffer (padded, memory order); afterwards the compressed
    // sum over the DP group, the same on every rank. Collective.
    void reduce(Tensor grads);
    double bytes_sent() const { return bytes_sent_; }
    // host memory it keeps: E, the gradient's host copy, P (with the plain elements), Q and its sum
    size_t host_bytes() const {
        return (error_.size() + host_.size() + send_.size() + q_.size() + qsum_.size()) * sizeof(float);
    }

    const std::vector<float>& error() const { return error_; }  // this rank's E (padded, memory order)
    const std::vector<float>& q() const { return q_; }          // every matrix's Q, plan order
    // resume: this rank's E (padded, memory order) and the common Q
    void set_state(const std::vector<float>& error, const std::vector<float>& q);
    // DP rank 0 gets every DP rank's E (rank order, memory order) and Q; the others nothing. Collective.
    void gather(std::vector<std::vector<float>>* errors, std::vector<float>* q);

    // One round on host buffers (the unit test's entry): g (padded) becomes the compressed sum;
    // reduce(x, n) sums n floats over the group in place. Returns false (E and Q unchanged) when a
    // sum is not finite.
    bool round(float* g, const std::function<void(float*, size_t)>& all_reduce, int ranks);

private:
    const PowerSgdPlan plan_;
    Ops& ops_;
    Comm& comm_;
    CommStage stage_;
    const size_t piece_;
    std::vector<float> error_, q_;
    std::vector<float> host_, send_, qsum_;  // scratch: the gradient, plain + P, Q
    double bytes_sent_ = 0;
};
