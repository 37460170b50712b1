#include "llmc/parallel/context_parallel.h"

#include <cstring>

#include "llmc/core/common.h"

SeqPositions cp_positions(int t, int cp, int r) {
    if (cp == 1) return SeqPositions();
    LLMC_ASSERT(t % 2 == 0 && r >= 0 && r < cp, "context parallelism: odd local length or rank outside the group");
    const int chunk = t / 2;
    return SeqPositions{r * chunk, (2 * cp - 1 - r) * chunk, chunk};
}

void cp_take_rows(const int32_t* seq, int32_t* local, int B, int T, int cp, int r) {
    if (cp == 1) {
        std::memcpy(local, seq, size_t(B) * T * sizeof(int32_t));
        return;
    }
    LLMC_ASSERT(T % (2 * cp) == 0, "context parallelism: T must divide by 2 * cp");
    const int t = T / cp;
    const SeqPositions p = cp_positions(t, cp, r);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < t; i++) local[size_t(b) * t + i] = seq[size_t(b) * T + p.at(i)];
}

ContextParallel::ContextParallel(Ops& ops, Comm* comm) : ops_(ops), comm_(comm), stage_(ops, comm) {}

void ContextParallel::all_gather_host(float* x, size_t n) {
    if (size() == 1) return;
    const size_t at = size_t(rank()) * n;
    stage_.run_host(x, n * size_t(size()), [&](float* buf) {
        comm_->all_gather(buf + at, buf, std::vector<size_t>(size_t(size()), n));
    });
}

ContextParallel::Passing ContextParallel::post_pass(Tensor send, Tensor recv, int tag) {
    LLMC_ASSERT(send.n == recv.n && send.dtype == recv.dtype, "context parallelism: ring blocks differ");
    const int n = size(), r = rank();
    const size_t words = stage_.words(send);
    Passing p;
    p.recv = recv;
    float* out = static_cast<float*>(send.ptr);
    float* in = static_cast<float*>(recv.ptr);
    if (!stage_.direct() || send.bytes() != words * sizeof(float)) {  // else the blocks themselves
        p.out = stage_.take_message(send);
        p.in = stage_.take_message(recv);
        stage_.pack(p.out, send);
        out = p.out.data();
        in = p.in.data();
        p.staged = true;
    }
    // (with cp = 2 both messages are with the same peer: they pair by direction)
    p.h = comm_->exchange_async({CommP2P{false, in, words, (r + n - 1) % n, tag}, CommP2P{true, out, words, (r + 1) % n, tag}});
    return p;
}

void ContextParallel::finish_pass(Passing& p) {
    comm_->wait(p.h);
    if (!p.staged) return;
    stage_.unpack(p.recv, p.in);
    stage_.release_message(std::move(p.out));
    stage_.release_message(std::move(p.in));
}

void ContextParallel::attention_forward(Tensor out, float* lse, Tensor qkv, int B, int t, int NH, int NKV, int HS,
                                        const RingBuffers& buf) {
    if (size() == 1) {
        ops_.attention_forward(out, lse, qkv, B, t, NH, NKV, HS);
        return;
    }
    const int n = size(), r = rank();
    const size_t nqkv = size_t(B) * t * (NH + 2 * NKV) * HS, nout = size_t(B) * t * NH * HS;
    const SeqPositions qp = positions(t);
    Tensor held = qkv.slice(0, nqkv);
    // each block travels on while the one held is attended to
    Passing passing = post_pass(held, buf.kv[1].slice(0, nqkv), 1);
    ops_.attention_block_forward(out, lse, qkv, qkv, B, t, t, NH, NKV, HS, qp, qp);  // the own block
    for (int s = 1; s < n; s++) {
        finish_pass(passing);
        held = buf.kv[s % 2].slice(0, nqkv);
        if (s + 1 < n) passing = post_pass(held, buf.kv[(s + 1) % 2].slice(0, nqkv), s + 1);
        const int origin = (r + n - s) % n;
        ops_.attention_block_forward(buf.blk_out.slice(0, nout), buf.blk_lse, qkv, held, B, t, t, NH, NKV, HS, qp,
                                     cp_positions(t, n, origin));
        ops_.attention_merge(out, lse, buf.blk_out.slice(0, nout), buf.blk_lse, B, t, NH, HS);
    }
}

void ContextParallel::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B,
                                         int t, int NH, int NKV, int HS, const RingBuffers& buf) {
    if (size() == 1) {
        ops_.attention_backward(dqkv, dout, qkv, out, lse, B, t, NH, NKV, HS);
        return;
    }
    const int n = size(), r = rank();
    const size_t nqkv = size_t(B) * t * (NH + 2 * NKV) * HS;
    const SeqPositions qp = positions(t);
    ops_.zero(dqkv.slice(0, nqkv));
    Tensor held = qkv.slice(0, nqkv), dheld = buf.dkv[0].slice(0, nqkv);
    ops_.zero(dheld);
    // the K/V blocks travel on while the one held is worked on; a block's dK/dV leaves once this
    // rank's share is added
    Passing kv = post_pass(held, buf.kv[1].slice(0, nqkv), 2);
    ops_.attention_block_backward(dqkv, dheld, dout, qkv, held, out, lse, B, t, t, NH, NKV, HS, qp, qp);
    for (int s = 1; s < n; s++) {
        Passing dkv = post_pass(dheld, buf.dkv[s % 2].slice(0, nqkv), 2 * s + 1);
        finish_pass(kv);
        held = buf.kv[s % 2].slice(0, nqkv);
        if (s + 1 < n) kv = post_pass(held, buf.kv[(s + 1) % 2].slice(0, nqkv), 2 * (s + 1));
        finish_pass(dkv);
        dheld = buf.dkv[s % 2].slice(0, nqkv);
        const int origin = (r + n - s) % n;
        ops_.attention_block_backward(dqkv, dheld, dout, qkv, held, out, lse, B, t, t, NH, NKV, HS, qp,
                                      cp_positions(t, n, origin));
    }
    // dheld is now the next rank's complete dK/dV: pass it on and take this rank's own
    Tensor mine = buf.dkv[n % 2].slice(0, nqkv);
    Passing last = post_pass(dheld, mine, 2 * n);
    finish_pass(last);
    ops_.residual_forward(dqkv.slice(0, nqkv), dqkv.slice(0, nqkv), mine);  // dq + 0, 0 + dk, 0 + dv
}
