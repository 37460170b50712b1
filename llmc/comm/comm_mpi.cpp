// Comm over MPI on host buffers: one MPI_Comm per process group (MPI_Comm_split of the world).
// Errors use MPI's default handler (MPI_ERRORS_ARE_FATAL): a failed call ends the whole job.
// A call that never completes (a member died, hung or took another path) is the watchdog's:
// a helper thread per communicator times every blocking call and ends the job.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "llmc/comm/comm.h"
#include "llmc/core/common.h"
#include "llmc/core/exit_codes.h"

[[noreturn]] void comm_fatal(const std::string& op, const std::string& group, const std::string& detail,
                             const std::string& what, const std::function<void()>& cleanup) {
    std::fprintf(stderr, "%serror: %s on the %s group%s%s%s %s; ending the job\n", rank_prefix().c_str(), op.c_str(),
                 group.c_str(), detail.empty() ? "" : " (", detail.c_str(), detail.empty() ? "" : ")", what.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    // Should MPI_Abort hang (its launcher gone, say), SIGALRM's default action still ends this
    // process, and a launcher ends a job whose rank was killed by a signal.
    ::alarm(10);
    if (cleanup) cleanup();
    // MPI_Abort asks the launcher to end every rank, whatever the launcher, so the rank that
    // hangs outside MPI goes too. From a helper thread (the MPI watchdog's, while the main thread
    // sits inside an MPI call) that is legal only at MPI_THREAD_MULTIPLE, which the runtime asks
    // for; without it, _exit: mpirun ends a job one of whose ranks exits non-zero (srun only with
    // --kill-on-bad-exit). MPI_Query_thread and MPI_Is_thread_main may be called from any thread.
    int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE, is_main = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Query_thread(&level);
        MPI_Is_thread_main(&is_main);
        if (level == MPI_THREAD_MULTIPLE || is_main) MPI_Abort(MPI_COMM_WORLD, kExitCommFailure);
    }
    ::_exit(kExitCommFailure);
}

namespace {

using Clock = std::chrono::steady_clock;

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

std::vector<int> int_counts(const std::vector<size_t>& counts, std::vector<int>* displs) {
    std::vector<int> c(counts.size());
    size_t off = 0;
    displs->resize(counts.size());
    for (size_t i = 0; i < counts.size(); i++) {
        LLMC_ASSERT(counts[i] <= size_t(INT_MAX) && off <= size_t(INT_MAX),
                    "MPI v-collectives take int counts: split the call into buckets");
        c[i] = int(counts[i]);
        (*displs)[i] = int(off);
        off += counts[i];
    }
    return c;
}

size_t total(const std::vector<size_t>& counts) { return count_offsets(counts).back(); }

// Completes reqs by polling: MPI_Testall, then a sleep growing from 10 us to 200 us (latency in
// exchange for a core left to the computation). The polls are also the progress of every other
// message of the process (a large message's rendezvous takes several), so the cap stays short.
void poll(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>* st = nullptr) {
    if (st) st->resize(reqs.size());
    for (int us = 10;; us = std::min(2 * us, 200)) {
        int flag = 0;
        MPI_Testall(int(reqs.size()), reqs.data(), &flag, st ? st->data() : MPI_STATUSES_IGNORE);
        if (flag) return;
        ::usleep(useconds_t(us));
    }
}

// Times one communicator's blocking calls on a helper thread: the main thread arms it before a
// call and disarms it after. A call still armed at its deadline is reported, and the helper ends
// the job, since the main thread is stuck inside MPI. The helper never calls MPI otherwise.
//
// Naming the rank that stalled: every call is numbered per communicator (#1, #2, ... alike on every
// member, which make the same calls in the same order). A helper whose call timed out sends its
// report ("all_reduce #57 on dp") to every other rank over a side channel, a duplicate of the
// world made with the first group, and collects theirs for a grace period: the ranks that arrived
// time out on their own calls at about the same moment and report too; a rank that sends nothing
// is in no call at all (stuck outside communication, or dead): the one that stalled. The reports
// are small messages sent eagerly, so a stalled receiver costs nothing, and the side channel
// returns errors instead of ending the job. Without MPI_THREAD_MULTIPLE (no MPI from the helper)
// the message says which call and whom this rank waits with.
MPI_Comm g_reports = MPI_COMM_NULL;
constexpr int kReportTag = 7;

// "; world rank 1 sent no report: ...; the others wait in: ..." or "" without the side channel.
std::string exchange_reports(const std::string& mine, double grace_s) {
    static std::mutex once;
    std::lock_guard<std::mutex> lock(once);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (g_reports == MPI_COMM_NULL || level != MPI_THREAD_MULTIPLE) return "";
    int me = 0, n = 1;
    MPI_Comm_rank(g_reports, &me);
    MPI_Comm_size(g_reports, &n);
    // the sends are never completed (the job ends): their buffer and requests outlive this call
    static const std::string report = mine;
    static std::vector<MPI_Request> sent(size_t(n), MPI_REQUEST_NULL);
    for (int r = 0; r < n; r++)
        if (r != me)
            MPI_Isend(report.data(), int(report.size()), MPI_CHAR, r, kReportTag, g_reports, &sent[size_t(r)]);
    std::vector<std::string> got(static_cast<size_t>(n));
    got[size_t(me)] = mine;
    int have = 1;
    const auto until = comm_deadline(grace_s);
    while (have < n && Clock::now() < until) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, g_reports, &flag, &st) != MPI_SUCCESS) break;
        if (!flag) {
            ::usleep(10000);
            continue;
        }
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string text(size_t(std::max(len, 0)), '\0');
        MPI_Recv(&text[0], len, MPI_CHAR, st.MPI_SOURCE, kReportTag, g_reports, MPI_STATUS_IGNORE);
        if (got[size_t(st.MPI_SOURCE)].empty()) have++;
        got[size_t(st.MPI_SOURCE)] = text.empty() ? "?" : text;
    }
    std::string silent, waiting;
    for (int r = 0; r < n; r++) {
        if (got[size_t(r)].empty()) silent += strfmt("%s%d", silent.empty() ? "" : ", ", r);
        else if (r != me) waiting += strfmt("%srank %d in %s", waiting.empty() ? "" : ", ", r, got[size_t(r)].c_str());
    }
    std::string out = silent.empty() ? "; every rank reports a call that timed out (a deadlock: the calls disagree)"
                                     : strfmt("; stalled: world rank%s %s (no report within %g s: in no call, hung or "
                                              "dead)",
                                              silent.find(',') == std::string::npos ? "" : "s", silent.c_str(), grace_s);
    return out + (waiting.empty() ? "" : "; waiting: " + waiting);
}

class Watchdog {
public:
    Watchdog(std::string group, double timeout_s, std::string others)
        : group_(std::move(group)),
          timeout_s_(timeout_s),
          others_(std::move(others)) {
        LLMC_ASSERT(timeout_s > 0, "the communicator watchdog needs timeout_s > 0");
        thread_ = std::thread([this] { run(); });
    }
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    void arm(const char* op, std::string detail) {
        std::lock_guard<std::mutex> lock(mu_);
        op_ = op;
        detail_ = std::move(detail);
        calls_++;
        deadline_ = comm_deadline(timeout_s_);
        armed_ = true;
        // A helper still waiting on the previous call's deadline wakes by itself, before this
        // (later) one, and waits again; only an idle one needs the wake-up (a system call).
        if (idle_) cv_.notify_one();
    }
    void disarm() {
        std::lock_guard<std::mutex> lock(mu_);
        armed_ = false;
    }

private:
    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop_) {
            if (!armed_) {
                idle_ = true;
                cv_.wait(lock);
                idle_ = false;
            } else if (Clock::now() >= deadline_) {
                const std::string op = strfmt("%s #%llu", op_, (unsigned long long)calls_);
                std::string reports = exchange_reports(op + " on " + group_, std::min(timeout_s_, 5.0));
                if (reports.empty()) reports = " (a member that reports no call of its own has stalled)";
                comm_fatal(op, group_, (detail_.empty() ? "" : detail_ + "; ") + others_,
                           timeout_text(timeout_s_) + reports);
            } else {
                cv_.wait_until(lock, deadline_);
            }
        }
    }

    const std::string group_;
    const double timeout_s_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool armed_ = false, idle_ = false, stop_ = false;
    Clock::time_point deadline_;
    const char* op_ = "";
    std::string detail_;
    const std::string others_;  // "waiting with world ranks ...": the other members
    uint64_t calls_ = 0;        // calls armed so far on this communicator: the current one's number
    std::thread thread_;
};

// Arms the watchdog for the lifetime of one call.
class Timed {
public:
    Timed(Watchdog& w, const char* op, std::string detail) : w_(w) { w_.arm(op, std::move(detail)); }
    ~Timed() { w_.disarm(); }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

private:
    Watchdog& w_;
};

}  // namespace

// A posted operation of an MpiComm: the call its helper thread runs, and whether it has.
struct MpiOp : CommOp {
    const char* op;
    std::string detail;
    std::function<void()> run;
    Clock::time_point posted;
    bool done = false;
};

namespace {

// Non-blocking operations: each communicator runs its posted operations, one at a time in posting
// order, on a helper thread, which starts MPI's non-blocking call (MPI_Iallreduce,
// MPI_Ireduce_scatter, MPI_Iallgatherv, MPI_Isend/Irecv) and polls it with MPI_Test, sleeping
// between polls. Open MPI advances non-blocking collectives only while some thread is inside MPI,
// so the polling thread is their progress, whatever the main thread computes; a blocking call on
// the helper would busy-wait and take a core from the computation (ranks share cores in tests).
// Open MPI's non-blocking reductions may sum in another order than the blocking ones (other
// algorithms for the same sizes), so a reduction a caller posts is posted whatever
// parallel.overlap says (set_overlap(false) waits at once): one kind per reduction, the same
// bits either way. The runtime asks for MPI_THREAD_MULTIPLE (llmc/run/runtime.cpp); with less, a post
// runs its call at once on the main thread (no overlap).
// Point-to-point: exchange_async starts its MPI_Isend/Irecv in the post itself (messages match by
// peer, tag and order, not by the collectives' sequence), so a receive posted early blocks nothing.
class MpiComm : public Comm {
public:
    MpiComm(std::vector<int> members, int rank, MPI_Comm comm, const std::string& group, double timeout_s)
        : Comm(std::move(members), rank, group), comm_(comm), watchdog_(group, timeout_s, others_text()) {
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        threaded_ = level == MPI_THREAD_MULTIPLE;
        comm_delay_s();  // a bad LLMC_COMM_DELAY_MS fails here, before any call
    }
    ~MpiComm() override {
        if (worker_.joinable()) {
            drain();
            {
                std::lock_guard<std::mutex> lock(mu_);
                stop_ = true;
            }
            cv_.notify_all();
            worker_.join();
        }
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm_);
    }
    std::string name() const override { return "mpi"; }

    void all_reduce(float* buf, size_t n, ReduceOp op) override {
        blocking("all_reduce", count_text(n, "float"), [&] { all_reduce_any(buf, n, MPI_FLOAT, op); });
    }
    void all_reduce(double* buf, size_t n, ReduceOp op) override {
        blocking("all_reduce", count_text(n, "double"), [&] { all_reduce_any(buf, n, MPI_DOUBLE, op); });
    }

    void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) override {
        blocking("reduce_scatter", count_text(total(counts), "float"), reduce_scatter_call(send, recv, counts));
    }
    void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) override {
        blocking("all_gather", count_text(total(counts), "float"), all_gather_call(send, recv, counts));
    }
    void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) override {
        check_counts(counts);
        check_peer(root, "gather");
        std::vector<int> displs, c = int_counts(counts, &displs);
        blocking("gather", count_text(total(counts), "float") + strfmt(" to group rank %d", root), [&] {
            MPI_Gatherv(send, c[rank()], MPI_FLOAT, recv, c.data(), displs.data(), MPI_FLOAT, root, comm_);
        });
    }
    void broadcast(float* buf, size_t n, int root) override {
        check_peer(root, "broadcast");
        blocking("broadcast", count_text(n, "float") + strfmt(" from group rank %d", root), [&] {
            for (size_t off = 0; off < n; off += kChunk)
                MPI_Bcast(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, root, comm_);
        });
    }
    void send(const float* buf, size_t n, int peer, int tag) override {
        check_p2p(peer, tag, "send");
        blocking("send", count_text(n, "float") + strfmt(" to group rank %d, tag %d", peer, tag), [&] {
            for (size_t off = 0; off < n; off += kChunk)
                MPI_Send(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, peer, tag, comm_);
        });
    }
    void recv(float* buf, size_t n, int peer, int tag) override {
        check_p2p(peer, tag, "recv");
        blocking("recv", count_text(n, "float") + strfmt(" from group rank %d, tag %d", peer, tag), [&] {
            for (size_t off = 0; off < n; off += kChunk) {
                const int want = int(std::min(kChunk, n - off));
                MPI_Status st;
                MPI_Recv(buf + off, want, MPI_FLOAT, peer, tag, comm_, &st);
                check_received(st, want, "recv");
            }
        });
    }
    void sendrecv(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n, int recv_peer,
                  int tag) override {
        check_sendrecv(send_n, send_peer, recv_n, recv_peer, tag);
        const std::string detail = count_text(send_n, "float") + strfmt(" to group rank %d, ", send_peer) +
                                   count_text(recv_n, "float") + strfmt(" from group rank %d, tag %d", recv_peer, tag);
        blocking("sendrecv", detail, [&] { sendrecv_call(sendbuf, send_n, send_peer, recvbuf, recv_n, recv_peer, tag); });
    }
    void sendrecv_call(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n,
                       int recv_peer, int tag) {
        // Chunk i of each direction travels in call i. The side with fewer chunks sits the last
        // calls out (MPI_PROC_NULL): each direction then carries exactly chunks(n) messages,
        // which is what its peer, computing from the same n, posts.
        const size_t calls = std::max(chunks(send_n), chunks(recv_n));
        for (size_t i = 0; i < calls; i++) {
            const size_t off = i * kChunk;
            const bool s = off < send_n, r = off < recv_n;
            const int sc = s ? int(std::min(kChunk, send_n - off)) : 0, rc = r ? int(std::min(kChunk, recv_n - off)) : 0;
            MPI_Status st;
            MPI_Sendrecv(s ? sendbuf + off : nullptr, sc, MPI_FLOAT, s ? send_peer : MPI_PROC_NULL, tag,
                         r ? recvbuf + off : nullptr, rc, MPI_FLOAT, r ? recv_peer : MPI_PROC_NULL, tag, comm_, &st);
            if (r) check_received(st, rc, "sendrecv");
        }
    }
    void exchange(const std::vector<CommP2P>& msgs) override {
        check_exchange(msgs);
        blocking("exchange", exchange_text(msgs), [&] { exchange_call(msgs); });
    }
    void exchange_call(const std::vector<CommP2P>& msgs) {
        std::vector<MPI_Request> reqs;
        std::vector<int> want;
        start_exchange(msgs, &reqs, &want);
        std::vector<MPI_Status> st(reqs.size());
        MPI_Waitall(int(reqs.size()), reqs.data(), st.data());
        check_exchange_received(st, want);
    }
    // Receives first (then a send never waits in the unexpected-message queue); the order of
    // the sends among themselves, and of the receives, is kept, which is what matches
    // messages of the same peer and tag, chunk by chunk.
    void start_exchange(const std::vector<CommP2P>& msgs, std::vector<MPI_Request>* reqs, std::vector<int>* want) {
        for (int pass = 0; pass < 2; pass++)
            for (const CommP2P& m : msgs) {
                if (m.is_send != (pass == 1)) continue;
                for (size_t off = 0; off < m.n; off += kChunk) {
                    const int c = int(std::min(kChunk, m.n - off));
                    reqs->emplace_back();
                    if (m.is_send) MPI_Isend(m.buf + off, c, MPI_FLOAT, m.peer, m.tag, comm_, &reqs->back());
                    else MPI_Irecv(m.buf + off, c, MPI_FLOAT, m.peer, m.tag, comm_, &reqs->back());
                    want->push_back(m.is_send ? -1 : c);  // per request: elements a receive expects, -1 for a send
                }
            }
    }
    static void check_exchange_received(const std::vector<MPI_Status>& st, const std::vector<int>& want) {
        for (size_t i = 0; i < st.size(); i++)
            if (want[i] >= 0) check_received(st[i], want[i], "exchange");
    }
    void barrier() override {
        blocking("barrier", "", [&] { MPI_Barrier(comm_); });
    }

    CommHandle all_reduce_async(float* buf, size_t n, ReduceOp op) override {
        return post("all_reduce", count_text(n, "float"), [this, buf, n, op] {
            for (size_t off = 0; off < n; off += kChunk) {
                std::vector<MPI_Request> r(1);
                MPI_Iallreduce(MPI_IN_PLACE, buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, mpi_op(op), comm_,
                               &r[0]);
                poll(r);
            }
        });
    }
    CommHandle reduce_scatter_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        return post("reduce_scatter", count_text(total(counts), "float"), reduce_scatter_call(send, recv, counts, true));
    }
    CommHandle all_gather_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        return post("all_gather", count_text(total(counts), "float"), all_gather_call(send, recv, counts, true));
    }
    CommHandle exchange_async(const std::vector<CommP2P>& msgs) override {
        check_exchange(msgs);
        // Started here, not in the helper's queue: messages match by peer, tag and order whatever
        // the collectives queued before them, and a receive posted early blocks nothing. The
        // helper polls them in turn.
        auto reqs = std::make_shared<std::vector<MPI_Request>>();
        auto want = std::make_shared<std::vector<int>>();
        if (threaded_) start_exchange(msgs, reqs.get(), want.get());
        return post("exchange", exchange_text(msgs), [this, msgs, reqs, want] {
            if (!threaded_) start_exchange(msgs, reqs.get(), want.get());
            std::vector<MPI_Status> st;
            poll(*reqs, &st);
            check_exchange_received(st, *want);
        });
    }
    void wait(CommHandle& h) override {
        if (!h.pending()) return;
        CommWaitTimer timer;
        wait_op(static_cast<MpiOp&>(*h.op()));
        h = CommHandle();
    }

private:
    std::string others_text() const {
        std::string s;
        for (int i = 0; i < size(); i++)
            if (i != rank()) s += strfmt("%s%d", s.empty() ? "" : ", ", members()[size_t(i)]);
        return "waiting with world rank" + std::string(size() > 2 ? "s " : " ") + s;
    }
    static constexpr size_t kChunk = size_t(1) << 30;  // elements per call (MPI counts are int)
    MPI_Comm comm_;
    Watchdog watchdog_;
    bool threaded_ = false;  // MPI_THREAD_MULTIPLE: posted operations run on worker_
    // the posted operations not yet run, and their thread (started by the first post)
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<MpiOp>> queue_;
    std::shared_ptr<MpiOp> last_;  // the latest posted operation (drain waits for it)
    bool stop_ = false;
    std::thread worker_;

    // A blocking call: after every posted operation, timed by the watchdog, counted as a wait.
    void blocking(const char* op, std::string detail, const std::function<void()>& call) {
        CommWaitTimer timer;
        drain();
        const Clock::time_point started = Clock::now();
        {
            Timed t(watchdog_, op, std::move(detail));
            call();
        }
        comm_delay_until(started);
    }
    CommHandle post(const char* op, std::string detail, std::function<void()> call) {
        auto o = std::make_shared<MpiOp>();
        o->op = op;
        o->detail = std::move(detail);
        o->run = std::move(call);
        o->posted = Clock::now();
        CommHandle h(o);
        if (!threaded_) {
            run_op(*o);
        } else {
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
                queue_.push_back(o);
                last_ = o;
            }
            cv_.notify_all();
        }
        if (!overlap()) wait(h);
        return h;
    }
    void run_op(MpiOp& o) {
        {
            Timed t(watchdog_, o.op, o.detail);
            o.run();
        }
        std::lock_guard<std::mutex> lock(mu_);
        o.done = true;
        o.run = nullptr;  // its captures (a copy of an exchange's messages) go now
    }
    void work() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stop_
            std::shared_ptr<MpiOp> o = queue_.front();
            queue_.pop_front();
            lock.unlock();
            run_op(*o);
            cv_.notify_all();
            lock.lock();
        }
    }
    // Completion: the helper has run it, and the delay hook's time since its post has passed.
    void wait_op(MpiOp& o) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return o.done; });
        }
        comm_delay_until(o.posted);
    }
    void drain() {
        std::shared_ptr<MpiOp> last;
        {
            std::lock_guard<std::mutex> lock(mu_);
            last = std::move(last_);
            last_ = nullptr;
        }
        if (last) wait_op(*last);
    }
    void check_exchange(const std::vector<CommP2P>& msgs) const {
        for (const CommP2P& m : msgs) {
            check_peer(m.peer, "exchange");
            check_tag(m.tag, "exchange");
        }
    }
    // The calls behind reduce_scatter and all_gather, blocking or non-blocking and polled (the
    // helper thread's): they own their counts.
    std::function<void()> reduce_scatter_call(const float* send, float* recv, const std::vector<size_t>& counts,
                                              bool polled = false) {
        check_counts(counts);
        auto displs = std::make_shared<std::vector<int>>();
        auto c = std::make_shared<std::vector<int>>(int_counts(counts, displs.get()));
        return [this, send, recv, c, polled] {
            if (!polled) return void(MPI_Reduce_scatter(send, recv, c->data(), MPI_FLOAT, MPI_SUM, comm_));
            std::vector<MPI_Request> r(1);
            MPI_Ireduce_scatter(send, recv, c->data(), MPI_FLOAT, MPI_SUM, comm_, &r[0]);
            poll(r);
        };
    }
    std::function<void()> all_gather_call(const float* send, float* recv, const std::vector<size_t>& counts,
                                          bool polled = false) {
        check_counts(counts);
        auto displs = std::make_shared<std::vector<int>>();
        auto c = std::make_shared<std::vector<int>>(int_counts(counts, displs.get()));
        const void* from = send == recv + (*displs)[size_t(rank())] ? MPI_IN_PLACE : send;
        return [this, from, recv, c, displs, polled] {
            const int mine = (*c)[size_t(rank())];
            if (!polled)
                return void(MPI_Allgatherv(from, mine, MPI_FLOAT, recv, c->data(), displs->data(), MPI_FLOAT, comm_));
            std::vector<MPI_Request> r(1);
            MPI_Iallgatherv(from, mine, MPI_FLOAT, recv, c->data(), displs->data(), MPI_FLOAT, comm_, &r[0]);
            poll(r);
        };
    }

    static size_t chunks(size_t n) { return (n + kChunk - 1) / kChunk; }
    template <typename T>
    void all_reduce_any(T* buf, size_t n, MPI_Datatype type, ReduceOp op) {
        for (size_t off = 0; off < n; off += kChunk)
            MPI_Allreduce(MPI_IN_PLACE, buf + off, int(std::min(kChunk, n - off)), type, mpi_op(op), comm_);
    }
    // A shorter message than posted would leave the tail of the buffer stale (a longer one is an
    // MPI truncation error): the two sides disagree on the size.
    static void check_received(const MPI_Status& st, int want, const char* op) {
        int got = -1;
        MPI_Get_count(&st, MPI_FLOAT, &got);
        LLMC_ASSERT(got == want, strfmt("%s: %d floats arrived, %d expected (the peers disagree on the size)", op,
                                        got, want));
    }
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(const std::vector<std::vector<int>>& partition, int world_rank,
                                    const std::string& group, double timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    LLMC_ASSERT(initialized, "make_mpi_comm needs MPI (launch with mpirun/srun)");
    if (g_reports == MPI_COMM_NULL) {  // with the first group, on every rank alike: the reports' side channel
        MPI_Comm_dup(MPI_COMM_WORLD, &g_reports);
        MPI_Comm_set_errhandler(g_reports, MPI_ERRORS_RETURN);
    }
    int color = -1, key = -1;
    for (size_t g = 0; g < partition.size(); g++)
        for (size_t i = 0; i < partition[g].size(); i++)
            if (partition[g][i] == world_rank) color = int(g), key = int(i);
    LLMC_ASSERT(color >= 0, "this rank is in no group of the partition");
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
    int r = -1;
    MPI_Comm_rank(comm, &r);
    LLMC_ASSERT(r == key, "MPI_Comm_split ordered the group differently");
    return std::unique_ptr<Comm>(new MpiComm(partition[color], r, comm, group, timeout_s));
}
