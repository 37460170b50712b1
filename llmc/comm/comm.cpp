// The group of one (no MPI) and helpers shared by every Comm implementation.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "llmc/comm/comm.h"
#include "llmc/core/common.h"

void Comm::check_counts(const std::vector<size_t>& counts) const {
    LLMC_ASSERT(int(counts.size()) == size(), "counts must have one entry per group member");
}

void Comm::check_peer(int peer, const char* op) const {
    LLMC_ASSERT(peer >= 0 && peer < size(), strfmt("%s: group rank %d outside the %s group", op, peer, group().c_str()));
}

void Comm::check_tag(int tag, const char* op) const {
    LLMC_ASSERT(tag >= 0 && tag <= kMaxCommTag, strfmt("%s: tag %d outside 0..32767", op, tag));
}

void Comm::check_p2p(int peer, int tag, const char* op) const {
    check_peer(peer, op);
    LLMC_ASSERT(peer != rank(), strfmt("%s: a blocking %s with oneself never completes (use sendrecv)", op, op));
    check_tag(tag, op);
}

void Comm::check_sendrecv(size_t send_n, int send_peer, size_t recv_n, int recv_peer, int tag) const {
    check_peer(send_peer, "sendrecv");
    check_peer(recv_peer, "sendrecv");
    LLMC_ASSERT((send_peer == rank()) == (recv_peer == rank()),
                "sendrecv: a send to oneself needs the receive from oneself in the same call");
    LLMC_ASSERT(send_peer != rank() || send_n == recv_n, "sendrecv with oneself: the sizes differ");
    check_tag(tag, "sendrecv");
}

void Comm::all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                        const std::vector<size_t>& recv_counts) {
    check_counts(send_counts);
    check_counts(recv_counts);
    const std::vector<size_t> so = count_offsets(send_counts), ro = count_offsets(recv_counts);
    std::vector<CommP2P> msgs;
    for (int p = 0; p < size(); p++) {  // per peer: the receive, then the send (a pair with oneself matches by tag)
        if (recv_counts[size_t(p)]) msgs.push_back({false, recv + ro[size_t(p)], recv_counts[size_t(p)], p, 0});
        if (send_counts[size_t(p)])
            msgs.push_back({true, const_cast<float*>(send) + so[size_t(p)], send_counts[size_t(p)], p, 0});
    }
    exchange(msgs);
}

std::vector<size_t> count_offsets(const std::vector<size_t>& counts) {
    std::vector<size_t> off(counts.size() + 1, 0);
    for (size_t i = 0; i < counts.size(); i++) off[i + 1] = off[i] + counts[i];
    return off;
}

std::string count_text(size_t n, const char* unit) { return strfmt("%zu %s%s", n, unit, n == 1 ? "" : "s"); }

std::string exchange_text(const std::vector<CommP2P>& msgs) {
    std::string t;
    for (const CommP2P& m : msgs)
        t += strfmt("%s%s ", t.empty() ? "" : "; ", m.is_send ? "send" : "recv") + count_text(m.n, "float") +
             strfmt(" %s group rank %d, tag %d", m.is_send ? "to" : "from", m.peer, m.tag);
    return t;
}

std::string timeout_text(double timeout_s) {
    return strfmt("did not complete within parallel.timeout_s = %g s", timeout_s);
}

std::chrono::steady_clock::time_point comm_deadline(double timeout_s) {
    using Clock = std::chrono::steady_clock;
    const double s = std::min(timeout_s, kCommTimeoutCapS);  // also turns +inf into the cap
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double comm_delay_s() {
    static const double d = [] {
        const char* e = std::getenv("LLMC_COMM_DELAY_MS");
        if (!e || !*e) return 0.0;
        char* end = nullptr;
        const double ms = std::strtod(e, &end);
        if (*end || !(ms >= 0) || !std::isfinite(ms))
            throw UserError(strfmt("LLMC_COMM_DELAY_MS: \"%s\" is not a number of milliseconds >= 0", e));
        return ms / 1000.0;
    }();
    return d;
}

void comm_delay_until(std::chrono::steady_clock::time_point started) {
    const double d = comm_delay_s();
    if (d > 0)
        std::this_thread::sleep_until(started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                    std::chrono::duration<double>(d)));
}

namespace {
double g_comm_wait_ms = 0;
uint64_t g_comm_waits = 0;
thread_local bool t_uncounted = false;
}

double comm_wait_ms() { return g_comm_wait_ms; }
uint64_t comm_waits() { return g_comm_waits; }
void comm_waits_uncounted_here() { t_uncounted = true; }

CommWaitTimer::CommWaitTimer() : t0_(std::chrono::steady_clock::now()) {
    if (!t_uncounted) ++g_comm_waits;
}

CommWaitTimer::~CommWaitTimer() {
    if (!t_uncounted)
        g_comm_wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

namespace {

class SelfComm : public Comm {
public:
    explicit SelfComm(int world_rank) : Comm({world_rank}, 0, "self") {}
    std::string name() const override { return "self"; }
    void all_reduce(float*, size_t, ReduceOp) override {}
    void all_reduce(double*, size_t, ReduceOp) override {}
    void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) override {
        copy(send, recv, counts);
    }
    void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) override {
        copy(send, recv, counts);
    }
    void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) override {
        LLMC_ASSERT(root == 0, "gather: root outside the group");
        copy(send, recv, counts);
    }
    void broadcast(float*, size_t, int root) override { LLMC_ASSERT(root == 0, "broadcast: root outside the group"); }
    void send(const float*, size_t, int, int) override { LLMC_ASSERT(false, "send to self"); }
    void recv(float*, size_t, int, int) override { LLMC_ASSERT(false, "recv from self"); }
    void sendrecv(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n, int recv_peer,
                  int tag) override {
        check_sendrecv(send_n, send_peer, recv_n, recv_peer, tag);
        if (sendbuf != recvbuf && send_n) std::memmove(recvbuf, sendbuf, send_n * sizeof(float));
    }
    // With oneself: each receive takes the first unmatched send of its tag (MPI's order).
    void exchange(const std::vector<CommP2P>& msgs) override {
        std::vector<bool> used(msgs.size(), false);
        for (const CommP2P& r : msgs) {
            check_peer(r.peer, "exchange");
            check_tag(r.tag, "exchange");
            if (r.is_send) continue;
            size_t s = 0;
            while (s < msgs.size() && (used[s] || !msgs[s].is_send || msgs[s].tag != r.tag)) s++;
            LLMC_ASSERT(s < msgs.size(), "exchange with oneself: a receive without its send");
            LLMC_ASSERT(msgs[s].n == r.n, "exchange with oneself: the sizes differ");
            used[s] = true;
            if (r.buf != msgs[s].buf && r.n) std::memmove(r.buf, msgs[s].buf, r.n * sizeof(float));
        }
        for (size_t s = 0; s < msgs.size(); s++)
            LLMC_ASSERT(!msgs[s].is_send || used[s], "exchange with oneself: a send without its receive");
    }
    void barrier() override {}

private:
    static void copy(const float* src, float* dst, const std::vector<size_t>& counts) {
        LLMC_ASSERT(counts.size() == 1, "counts must have one entry per member");
        if (src != dst && counts[0]) std::memmove(dst, src, counts[0] * sizeof(float));
    }
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(int world_rank) { return std::unique_ptr<Comm>(new SelfComm(world_rank)); }

// Binaries linked without the CUDA objects (the CPU unit tests, the data tools) still link
// make_process_groups, which names make_nccl_comm; they get this definition. train_gpt and the
// GPU tests link llmc/cuda/comm_nccl.cu, whose ordinary (strong) definition replaces it.
__attribute__((weak)) std::unique_ptr<Comm> make_nccl_comm(Comm&, int, double) {
    throw UserError("parallel.comm: \"nccl\" is not available in this binary (built without the CUDA backend)");
}
