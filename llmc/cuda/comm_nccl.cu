// Comm over NCCL on device buffers: one ncclComm per process group, bootstrapped over the group's
// MPI communicator (group rank 0's ncclUniqueId is broadcast over it).
//
// Blocking calls on a non-blocking communicator: every operation is enqueued on this
// communicator's own stream, and the host then polls that stream and the communicator's
// asynchronous error state until the result is in the buffer, an error shows, or
// parallel.timeout_s passes. (A blocking NCCL communicator would wait inside NCCL, where no
// deadline can reach it.) A stall or an error aborts the communicator (ncclCommAbort) and ends
// the job with a message naming the call and the group (comm_fatal).
//
// Non-blocking calls (all_reduce_async, reduce_scatter_async, all_gather_async, exchange_async):
// the same operation, enqueued on the same stream behind the compute stream's work, then an event
// recorded behind it; the post returns once NCCL has taken the operation (the communicator no
// longer in progress), and wait(handle) polls that event (and the error state, under the
// deadline). The compute stream goes on meanwhile: communication overlaps the kernels queued
// after the post. Operations run in posting order (one stream: runs_in_order), and a blocking call
// waits for the stream, so for every operation posted before it too. Posting order is program
// order on every rank, so the communicators' streams never wait on one another in a cycle.
//
// Determinism: NCCL chooses an algorithm (ring, tree, NVLS, ...) and a protocol per call from
// the topology, the number of ranks, the size and the NCCL version (and NCCL_ALGO/NCCL_PROTO);
// for a fixed choice the order of the floating-point sums is fixed, so a run repeats bitwise on
// the same machines, and every rank receives the same bits (each element is reduced once, then
// copied to every rank). Another topology, group size or NCCL version may round differently.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "llmc/comm/comm.h"
#include "llmc/core/common.h"
#include "llmc/cuda/common.cuh"

namespace {

using Clock = std::chrono::steady_clock;

// A failing NCCL call outside the timed operations (ids, queries, set-up) is a bug or a broken
// installation: report file, line and NCCL's message, then abort (same policy as CUDA_CHECK).
void nccl_check_impl(ncclResult_t r, const char* expr, const char* file, int line) {
    if (r != ncclSuccess && r != ncclInProgress) {
        std::fprintf(stderr, "%sNCCL error at %s:%d: %s (%s): %s\n", rank_prefix().c_str(), file, line,
                     ncclGetErrorString(r), expr, ncclGetLastError(nullptr));
        std::fflush(stderr);
        std::abort();
    }
}
#define NCCL_CHECK(x) nccl_check_impl((x), #x, __FILE__, __LINE__)

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

bool all_equal(const std::vector<size_t>& counts) {
    for (size_t c : counts)
        if (c != counts[0]) return false;
    return true;
}

class NcclComm : public Comm {
public:
    NcclComm(const Comm& bootstrap, const ncclUniqueId& id, double timeout_s)
        : Comm(bootstrap.members(), bootstrap.rank(), bootstrap.group()), timeout_s_(timeout_s) {
        LLMC_ASSERT(timeout_s > 0, "the communicator watchdog needs timeout_s > 0");
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
        CUDA_CHECK(device_malloc(&barrier_word_, sizeof(float)));
        CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;  // calls return at once (ncclInProgress); wait() polls with a deadline
        const ncclResult_t started = ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
        if (started != ncclSuccess && started != ncclInProgress) {
            comm_ = nullptr;  // no communicator to abort
            failed("init", strfmt("%d ranks", size()), started);
        }
        const Clock::time_point deadline = deadline_from_now();
        for (int polls = 0;; polls++) {
            ncclResult_t state = ncclInProgress;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
            if (state == ncclSuccess) break;
            if (state != ncclInProgress) failed("init", strfmt("%d ranks", size()), state);
            if (Clock::now() >= deadline) stalled("init", strfmt("%d ranks", size()));
            pause(polls);
        }
        // NCCL connects the ranks lazily, in a communicator's first collective: one word all-reduced
        // here, at start-up (every rank builds the same groups in the same order), so that the
        // connection's time falls into the set-up and not into the first step's first call
        barrier();
    }
    ~NcclComm() override {
        if (comm_) {
            // Every call has waited for its own work, so finalize has nothing to flush; it still
            // runs non-blocking, so give it the deadline and abort the communicator past it.
            ncclResult_t state = ncclCommFinalize(comm_);
            const Clock::time_point deadline = deadline_from_now();
            for (int polls = 0; state == ncclInProgress && Clock::now() < deadline; polls++) {
                pause(polls);
                ncclCommGetAsyncError(comm_, &state);
            }
            if (state == ncclSuccess) ncclCommDestroy(comm_);
            else ncclCommAbort(comm_);
        }
        device_free(barrier_word_);
        device_free(scratch_dev_);
        cudaFreeHost(scratch_host_);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
        cudaEventDestroy(ready_);
        cudaStreamDestroy(stream_);
    }
    std::string name() const override { return "nccl"; }
    bool on_device() const override { return true; }
    void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }
    bool runs_in_order() const override { return true; }

    void all_reduce(float* buf, size_t n, ReduceOp op) override {
        if (n == 0) return;
        const std::string detail = count_text(n, "float");
        enqueue_all_reduce(buf, n, op, detail);
        wait("all_reduce", detail);
    }
    CommHandle all_reduce_async(float* buf, size_t n, ReduceOp op) override {
        if (n == 0) return {};
        std::string detail = count_text(n, "float");
        enqueue_all_reduce(buf, n, op, detail);
        return posted("all_reduce", std::move(detail));
    }
    // Host doubles (a few scalars): through pinned scratch, so that the copies stay asynchronous
    // and under the deadline (a copy from pageable memory would wait for the stream unbounded).
    void all_reduce(double* buf, size_t n, ReduceOp op) override {
        if (n == 0) return;
        const std::string detail = count_text(n, "double");
        reserve_scratch(n);
        std::memcpy(scratch_host_, buf, n * sizeof(double));
        start();
        CUDA_CHECK(cudaMemcpyAsync(scratch_dev_, scratch_host_, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
        check_enqueue(ncclAllReduce(scratch_dev_, scratch_dev_, n, ncclDouble, nccl_op(op), comm_, stream_),
                      "all_reduce", detail);
        // Enqueued only once the communicator is no longer in progress (wait's first phase).
        wait("all_reduce", detail, [&] {
            CUDA_CHECK(cudaMemcpyAsync(scratch_host_, scratch_dev_, n * sizeof(double), cudaMemcpyDeviceToHost,
                                       stream_));
        });
        std::memcpy(buf, scratch_host_, n * sizeof(double));
    }

    // Device doubles (the gradient norm's sums): in place, no copies.
    void all_reduce_dev(double* buf, size_t n, ReduceOp op) override {
        if (n == 0) return;
        const std::string detail = count_text(n, "double");
        check_device(buf, "all_reduce");
        start();
        check_enqueue(ncclAllReduce(buf, buf, n, ncclDouble, nccl_op(op), comm_, stream_), "all_reduce", detail);
        wait("all_reduce", detail);
    }

    void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) override {
        std::string detail;
        if (enqueue_reduce_scatter(send, recv, counts, &detail)) wait("reduce_scatter", detail);
    }
    CommHandle reduce_scatter_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        std::string detail;
        if (!enqueue_reduce_scatter(send, recv, counts, &detail)) return {};
        return posted("reduce_scatter", std::move(detail));
    }
    void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) override {
        std::string detail;
        if (enqueue_all_gather(send, recv, counts, &detail)) wait("all_gather", detail);
    }
    CommHandle all_gather_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        std::string detail;
        if (!enqueue_all_gather(send, recv, counts, &detail)) return {};
        return posted("all_gather", std::move(detail));
    }
    void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) override {
        check_counts(counts);
        check_peer(root, "gather");
        const std::vector<size_t> off = count_offsets(counts);
        if (off.back() == 0) return;
        const size_t mine = counts[size_t(rank())];
        if (mine) check_device(send, "gather");
        if (rank() == root) check_device(recv, "gather");
        const std::string detail = count_text(off.back(), "float") + strfmt(" to group rank %d", root);
        start();
        if (rank() == root && mine)
            CUDA_CHECK(cudaMemcpyAsync(recv + off[size_t(root)], send, mine * sizeof(float), cudaMemcpyDeviceToDevice,
                                       stream_));
        check_enqueue(ncclGroupStart(), "gather", detail);
        if (rank() == root) {
            for (int r = 0; r < size(); r++)
                if (r != root && counts[size_t(r)])
                    check_enqueue(ncclRecv(recv + off[size_t(r)], counts[size_t(r)], ncclFloat, r, comm_, stream_),
                                  "gather", detail);
        } else if (mine) {
            check_enqueue(ncclSend(send, mine, ncclFloat, root, comm_, stream_), "gather", detail);
        }
        check_enqueue(ncclGroupEnd(), "gather", detail);
        wait("gather", detail);
    }
    void broadcast(float* buf, size_t n, int root) override {
        check_peer(root, "broadcast");
        if (n == 0) return;
        check_device(buf, "broadcast");
        const std::string detail = count_text(n, "float") + strfmt(" from group rank %d", root);
        start();
        check_enqueue(ncclBroadcast(buf, buf, n, ncclFloat, root, comm_, stream_), "broadcast", detail);
        wait("broadcast", detail);
    }
    // NCCL has no tags: a pair's messages match in call order (comm.h), the tag only labels the call.
    void send(const float* buf, size_t n, int peer, int tag) override {
        check_p2p(peer, tag, "send");
        if (n == 0) return;
        check_device(buf, "send");
        const std::string detail = count_text(n, "float") + strfmt(" to group rank %d, tag %d", peer, tag);
        start();
        check_enqueue(ncclSend(buf, n, ncclFloat, peer, comm_, stream_), "send", detail);
        wait("send", detail);
    }
    void recv(float* buf, size_t n, int peer, int tag) override {
        check_p2p(peer, tag, "recv");
        if (n == 0) return;
        check_device(buf, "recv");
        const std::string detail = count_text(n, "float") + strfmt(" from group rank %d, tag %d", peer, tag);
        start();
        check_enqueue(ncclRecv(buf, n, ncclFloat, peer, comm_, stream_), "recv", detail);
        wait("recv", detail);
    }
    void sendrecv(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n, int recv_peer,
                  int tag) override {
        check_sendrecv(send_n, send_peer, recv_n, recv_peer, tag);
        if (send_n) check_device(sendbuf, "sendrecv");
        if (recv_n) check_device(recvbuf, "sendrecv");
        const std::string detail = count_text(send_n, "float") + strfmt(" to group rank %d, ", send_peer) +
                                   count_text(recv_n, "float") + strfmt(" from group rank %d, tag %d", recv_peer, tag);
        start();
        if (send_peer == rank()) {
            if (send_n && sendbuf != recvbuf)
                CUDA_CHECK(cudaMemcpyAsync(recvbuf, sendbuf, send_n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
        } else {
            // one group: both halves progress together, so neighbours that send to each other
            // do not wait on one another
            check_enqueue(ncclGroupStart(), "sendrecv", detail);
            if (send_n) check_enqueue(ncclSend(sendbuf, send_n, ncclFloat, send_peer, comm_, stream_), "sendrecv", detail);
            if (recv_n) check_enqueue(ncclRecv(recvbuf, recv_n, ncclFloat, recv_peer, comm_, stream_), "sendrecv", detail);
            check_enqueue(ncclGroupEnd(), "sendrecv", detail);
        }
        wait("sendrecv", detail);
    }
    // One group: every message progresses together. NCCL pairs a peer's messages in posting
    // order (no tags), within the group as across calls.
    void exchange(const std::vector<CommP2P>& msgs) override {
        const std::string detail = exchange_text(msgs);
        enqueue_exchange(msgs, detail);
        wait("exchange", detail);
    }
    CommHandle exchange_async(const std::vector<CommP2P>& msgs) override {
        std::string detail = exchange_text(msgs);
        enqueue_exchange(msgs, detail);
        return posted("exchange", std::move(detail));
    }
    void wait(CommHandle& h) override {
        if (!h.pending()) return;
        CommWaitTimer timer;
        NcclOp& o = static_cast<NcclOp&>(*h.op());
        const Clock::time_point deadline = deadline_from_now();
        for (int polls = 0;; polls++) {
            ncclResult_t state = ncclInProgress;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
            if (state != ncclSuccess && state != ncclInProgress) failed(o.op, o.detail, state);
            const cudaError_t q = cudaEventQuery(o.done);
            if (q == cudaSuccess) break;
            if (q != cudaErrorNotReady) CUDA_CHECK(q);
            if (Clock::now() >= deadline) stalled(o.op, o.detail);
            pause(polls);
        }
        free_events_.push_back(o.done);
        o.done = nullptr;
        comm_delay_until(o.posted);
        h = CommHandle();
    }
    // NCCL has no barrier: an all-reduce of one word is one.
    void barrier() override {
        start();
        check_enqueue(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat, ncclSum, comm_, stream_), "barrier", "");
        wait("barrier", "");
    }

private:
    // A posted operation: the event recorded behind it on the stream.
    struct NcclOp : CommOp {
        const char* op = "";
        std::string detail;
        cudaEvent_t done = nullptr;  // back to the communicator's free events once waited for
        Clock::time_point posted;
        ~NcclOp() override {
            if (done) cudaEventDestroy(done);  // a handle dropped without a wait
        }
    };
    std::vector<cudaEvent_t> free_events_;  // events of waited operations, for reuse

    // The operation just enqueued becomes a handle: once NCCL has taken it (a non-blocking
    // communicator may still be enqueueing: ncclInProgress), an event is recorded behind it.
    CommHandle posted(const char* op, std::string detail) {
        const Clock::time_point deadline = deadline_from_now();
        for (int polls = 0;; polls++) {
            ncclResult_t state = ncclInProgress;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
            if (state == ncclSuccess) break;
            if (state != ncclInProgress) failed(op, detail, state);
            if (Clock::now() >= deadline) stalled(op, detail);
            pause(polls);
        }
        auto o = std::make_shared<NcclOp>();
        o->op = op;
        o->detail = std::move(detail);
        o->posted = started_;
        if (free_events_.empty()) {
            o->done = nullptr;
            CUDA_CHECK(cudaEventCreateWithFlags(&o->done, cudaEventDisableTiming));
        } else {
            o->done = free_events_.back();
            free_events_.pop_back();
        }
        CUDA_CHECK(cudaEventRecord(o->done, stream_));
        CommHandle h(o);
        if (!overlap()) wait(h);
        return h;
    }

    // The NCCL calls of each operation, after start() (the enqueue_ functions of the collectives
    // with counts return false, enqueueing nothing, when every count is 0).
    void enqueue_all_reduce(float* buf, size_t n, ReduceOp op, const std::string& detail) {
        check_device(buf, "all_reduce");
        start();
        check_enqueue(ncclAllReduce(buf, buf, n, ncclFloat, nccl_op(op), comm_, stream_), "all_reduce", detail);
    }
    // NCCL's reduce-scatter and all-gather take one count for every rank; unequal pieces (a
    // bucket that straddles shard boundaries) become one reduce / broadcast per member, fused
    // into one group so that they progress together.
    bool enqueue_reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts, std::string* detail) {
        check_counts(counts);
        const std::vector<size_t> off = count_offsets(counts);
        if (off.back() == 0) return false;
        check_device(send, "reduce_scatter");
        if (counts[size_t(rank())]) check_device(recv, "reduce_scatter");
        *detail = count_text(off.back(), "float");
        start();
        if (all_equal(counts)) {
            check_enqueue(ncclReduceScatter(send, recv, counts[0], ncclFloat, ncclSum, comm_, stream_),
                          "reduce_scatter", *detail);
            return true;
        }
        check_enqueue(ncclGroupStart(), "reduce_scatter", *detail);
        for (int r = 0; r < size(); r++)
            if (counts[size_t(r)])  // recvbuff only matters on the root
                check_enqueue(ncclReduce(send + off[size_t(r)], r == rank() ? recv : nullptr, counts[size_t(r)],
                                         ncclFloat, ncclSum, r, comm_, stream_),
                              "reduce_scatter", *detail);
        check_enqueue(ncclGroupEnd(), "reduce_scatter", *detail);
        return true;
    }
    bool enqueue_all_gather(const float* send, float* recv, const std::vector<size_t>& counts, std::string* detail) {
        check_counts(counts);
        const std::vector<size_t> off = count_offsets(counts);
        if (off.back() == 0) return false;
        if (counts[size_t(rank())]) check_device(send, "all_gather");
        check_device(recv, "all_gather");
        *detail = count_text(off.back(), "float");
        start();
        if (all_equal(counts)) {
            check_enqueue(ncclAllGather(send, recv, counts[0], ncclFloat, comm_, stream_), "all_gather", *detail);
            return true;
        }
        check_enqueue(ncclGroupStart(), "all_gather", *detail);
        for (int r = 0; r < size(); r++)
            if (counts[size_t(r)])  // sendbuff only matters on the root (elsewhere: in place)
                check_enqueue(ncclBroadcast(r == rank() ? send : recv + off[size_t(r)], recv + off[size_t(r)],
                                            counts[size_t(r)], ncclFloat, r, comm_, stream_),
                              "all_gather", *detail);
        check_enqueue(ncclGroupEnd(), "all_gather", *detail);
        return true;
    }
    void enqueue_exchange(const std::vector<CommP2P>& msgs, const std::string& detail) {
        for (const CommP2P& m : msgs) {
            check_peer(m.peer, "exchange");
            check_tag(m.tag, "exchange");
            if (m.n) check_device(m.buf, "exchange");
        }
        start();
        check_enqueue(ncclGroupStart(), "exchange", detail);
        for (const CommP2P& m : msgs) {
            if (m.n == 0) continue;
            if (m.is_send) check_enqueue(ncclSend(m.buf, m.n, ncclFloat, m.peer, comm_, stream_), "exchange", detail);
            else check_enqueue(ncclRecv(m.buf, m.n, ncclFloat, m.peer, comm_, stream_), "exchange", detail);
        }
        check_enqueue(ncclGroupEnd(), "exchange", detail);
    }

    double timeout_s_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaStream_t compute_ = nullptr;  // the ops' stream (set_compute_stream)
    cudaEvent_t ready_ = nullptr;
    float* barrier_word_ = nullptr;
    double* scratch_dev_ = nullptr;   // the double all-reduce's buffers
    double* scratch_host_ = nullptr;  // (pinned)
    size_t scratch_n_ = 0;
    Clock::time_point started_;  // the current call's start()

    Clock::time_point deadline_from_now() const { return comm_deadline(timeout_s_); }
    // Spins briefly (a small collective ends in microseconds), then sleeps between polls.
    static void pause(int polls) {
        if (polls < 1000) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }

    // Orders this call after all work already queued on the compute stream that wrote the
    // buffers: an event recorded there, which this communicator's stream waits for on the device.
    // (Until set_compute_stream, the legacy default stream, which waits for every blocking stream.)
    void start() {
        started_ = Clock::now();
        CUDA_CHECK(cudaEventRecord(ready_, compute_ ? compute_ : cudaStreamLegacy));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    }

    // Blocks until the enqueued work is done: first until the communicator has finished
    // enqueueing it (a non-blocking communicator reports ncclInProgress meanwhile, e.g. while it
    // connects to peers on first use), then, once `then` has enqueued any follow-up work behind
    // it, until the stream is idle. An NCCL error or the deadline ends the job.
    // The host's time here is comm_ms's (CommWaitTimer); LLMC_COMM_DELAY_MS counts from start().
    void wait(const char* op, const std::string& detail, const std::function<void()>& then = nullptr) {
        CommWaitTimer timer;
        wait_stream(op, detail, then);
        comm_delay_until(started_);
    }
    void wait_stream(const char* op, const std::string& detail, const std::function<void()>& then) {
        const Clock::time_point deadline = deadline_from_now();
        bool enqueued = false;
        for (int polls = 0;; polls++) {
            ncclResult_t state = ncclInProgress;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
            if (state != ncclSuccess && state != ncclInProgress) failed(op, detail, state);
            if (state == ncclSuccess) {
                if (!enqueued) {
                    enqueued = true;
                    if (then) then();
                }
                const cudaError_t q = cudaStreamQuery(stream_);
                if (q == cudaSuccess) return;
                if (q != cudaErrorNotReady) CUDA_CHECK(q);
            }
            if (Clock::now() >= deadline) stalled(op, detail);
            pause(polls);
        }
    }
    void check_enqueue(ncclResult_t r, const char* op, const std::string& detail) {
        if (r != ncclSuccess && r != ncclInProgress) failed(op, detail, r);
    }
    [[noreturn]] void stalled(const char* op, const std::string& detail) {
        comm_fatal(op, group(), detail, timeout_text(timeout_s_), [this] { abort_comm(); });
    }
    [[noreturn]] void failed(const char* op, const std::string& detail, ncclResult_t r) {
        comm_fatal(op, group(), detail,
                   strfmt("failed: NCCL %s (%s)", ncclGetErrorString(r), comm_ ? ncclGetLastError(comm_) : ""),
                   [this] { abort_comm(); });
    }
    // Stops this communicator's kernels and proxy threads so the process can end. Some NCCL
    // versions have hung here; comm_fatal's alarm covers that.
    void abort_comm() {
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
    }

    void reserve_scratch(size_t n) {
        if (n <= scratch_n_) return;
        device_free(scratch_dev_);
        cudaFreeHost(scratch_host_);
        CUDA_CHECK(device_malloc(&scratch_dev_, n * sizeof(double)));
        CUDA_CHECK(cudaMallocHost(&scratch_host_, n * sizeof(double)));
        scratch_n_ = n;
    }
    // A host pointer here is a caller's mistake NCCL would report only as an invalid argument
    // (or, with unified addressing, read slowly): name it instead.
    static void check_device(const void* p, const char* op) {
        cudaPointerAttributes a;
        const bool ok = p && cudaPointerGetAttributes(&a, p) == cudaSuccess &&
                        (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
        if (!ok) (void)cudaGetLastError();
        LLMC_ASSERT(ok, strfmt("%s: the NCCL communicator takes device buffers (on_device()); got host memory or "
                               "null", op));
    }
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int cuda_device, double timeout_s) {
    LLMC_ASSERT(!bootstrap.on_device(), "make_nccl_comm bootstraps over a host communicator");
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw UserError(strfmt("parallel.comm: \"nccl\" needs a CUDA device (%s)", cudaGetErrorString(err)));
    }
    if (cuda_device < 0 || cuda_device >= n)
        throw UserError(strfmt("parallel.comm: \"nccl\": device index %d out of range (%d devices)", cuda_device, n));
    // NCCL binds a communicator to the device current at its creation.
    CUDA_CHECK(cudaSetDevice(cuda_device));
    // The id is 128 opaque bytes; the host communicator moves floats, whose bits a broadcast
    // copies unchanged.
    static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "ncclUniqueId is not a whole number of floats");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    float words[sizeof(ncclUniqueId) / sizeof(float)];
    std::memcpy(words, &id, sizeof(id));
    bootstrap.broadcast(words, sizeof(words) / sizeof(float), 0);
    std::memcpy(&id, words, sizeof(id));
    return std::unique_ptr<Comm>(new NcclComm(bootstrap, id, timeout_s));
}
