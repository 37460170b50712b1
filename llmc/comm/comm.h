// Comm: the collective-communication interface every parallel layout is written over.
//
// A Comm is one process group: an ordered set of world ranks; rank() and size() are this
// process's position in it and its size, and peers/roots are group ranks. group() names the
// group in messages ("dp", "tp", "pp", "world").
//
// Memory: fp32 buffers are in the communicator's memory space: host memory for MPI and SelfComm,
// device memory for NCCL (on_device()). double buffers (a few scalars: losses, norms) are host
// memory on every communicator; NCCL copies them through the device itself. Callers that hold
// device tensors and talk to a host communicator stage them through host buffers.
//
// Every call is blocking and collective over the group (send/recv: over the pair; sendrecv:
// over the two pairs it joins), and every call must be made in the same order on all members.
// A call returns when its result is in the buffer. On device buffers (NCCL) a call also starts
// only after all work already launched on the device's blocking streams (CudaOps's stream is
// one; streams made with cudaStreamNonBlocking are not): the caller need not synchronize first,
// and work launched after the call, on any stream, sees the result.
//
// Results are deterministic for a fixed group, sizes and (NCCL) topology, and every member
// receives bitwise the same reduction result.
//
// Point-to-point (pipeline stages): send/recv/sendrecv/exchange carry a tag in 0..32767. MPI
// matches messages by tag; NCCL has no tags and matches a pair's messages in posting order, so
// the messages between two ranks must be posted in the same order on both sides (the blocking
// calls force that across calls; within one exchange it is the caller's care) and the tag only
// labels the call. Sizes must match exactly.
//
// Non-blocking calls (all_reduce_async, reduce_scatter_async, all_gather_async, exchange_async)
// post the same operation and return a CommHandle; its buffers belong to the communicator until
// wait(handle) returns (then the result is in them). They count as calls in the order above: a
// member posts them in the same order as the others, interleaved with blocking calls alike. The
// results are bitwise those of the blocking call (MPI runs the same blocking call on a helper
// thread: see comm_mpi.cpp). A blocking call first completes every operation posted before it.
// With set_overlap(false) every post waits for its own completion before returning (the
// blocking behaviour, for comparison: parallel.overlap). SelfComm, which has no non-blocking
// path, completes the operation inside the post; NCCL enqueues it on its stream and waits for
// its event (llmc/cuda/comm_nccl.cu).
//
// Test hook LLMC_COMM_DELAY_MS=D (a slow network): on MPI and NCCL every call and every posted
// operation completes no sooner than D ms after it started (was posted); the wait sleeps, it
// does not spin. (SelfComm moves nothing and is not delayed.) comm_wait_ms() is the time this process's main thread has spent inside
// communication: blocking calls and waits on handles (the trainer's comm_ms per step).
//
// Watchdog (MPI, NCCL): every blocking call and every posted operation is timed. One that does not complete within
// timeout_s (parallel.timeout_s) prints which call stalled on which group, e.g.
//   [rank 1] error: all_reduce on the dp group (2621 floats) did not complete within
//   parallel.timeout_s = 5 s; ending the job
// and ends every process of the job with exit code 1: a member that died, hung or took
// another path never leaves the others waiting forever.
//
// Implementations: SelfComm (a group of one: copies, no MPI needed), MPI (comm_mpi.cpp,
// one MPI_Comm per group), NCCL (llmc/cuda/comm_nccl.cu, one ncclComm per group,
// bootstrapped over the group's MPI communicator).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/core/common.h"

enum class ReduceOp { Sum, Max };

// One message of Comm::exchange: a send of n elements of buf to group rank peer, or a receive
// of n elements from it into buf.
struct CommP2P {
    bool is_send;
    float* buf;  // only read by a send
    size_t n;
    int peer;
    int tag;
};

// A posted operation (see Comm's non-blocking calls); empty: none, or already waited for. Each
// implementation derives its own record of what it posted.
struct CommOp {
    virtual ~CommOp() = default;
};
class CommHandle {
public:
    CommHandle() = default;
    explicit CommHandle(std::shared_ptr<CommOp> op) : op_(std::move(op)) {}
    bool pending() const { return op_ != nullptr; }
    std::shared_ptr<CommOp>& op() { return op_; }

private:
    std::shared_ptr<CommOp> op_;
};

class Comm {
public:
    virtual ~Comm() = default;
    virtual std::string name() const = 0;  // "self", "mpi", "nccl"
    virtual bool on_device() const { return false; }
    // A device communicator's calls wait for the work already queued on this stream (the ops'
    // compute stream, Ops::compute_stream); host communicators need none.
    virtual void set_compute_stream(void* stream) {}

    int rank() const { return rank_; }
    int size() const { return int(members_.size()); }
    const std::vector<int>& members() const { return members_; }  // world ranks, in group order
    const std::string& group() const { return group_; }

    // buf[i] = op over the group of every member's buf[i]
    virtual void all_reduce(float* buf, size_t n, ReduceOp op) = 0;
    virtual void all_reduce(double* buf, size_t n, ReduceOp op) = 0;  // host memory on every Comm
    // Doubles in the memory this communicator reads (on_device: the backend's; else the host's).
    virtual void all_reduce_dev(double* buf, size_t n, ReduceOp op) {
        LLMC_ASSERT(!on_device(), "all_reduce_dev: a device communicator without a device path");
        all_reduce(buf, n, op);
    }
    // send holds sum(counts) elements on every member; recv gets this member's piece
    // (counts[rank()] elements at offset sum(counts[0..rank()))) of their element-wise sum.
    virtual void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) = 0;
    // send holds counts[rank()] elements; recv (sum(counts)) gets every member's piece in group order.
    // send may be this member's piece of recv itself (recv + offset of rank(): in place).
    virtual void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) = 0;
    // as all_gather, but only root's recv is written (others may pass nullptr)
    virtual void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) = 0;
    virtual void broadcast(float* buf, size_t n, int root) = 0;
    // n elements to / from group rank peer (not this rank: a blocking send to oneself never completes).
    // The default tag is 0 (overrides do not repeat it: a default argument binds to the static type).
    virtual void send(const float* buf, size_t n, int peer, int tag = 0) = 0;
    virtual void recv(float* buf, size_t n, int peer, int tag = 0) = 0;
    // Posts both halves at once (no deadlock between neighbours that send to each other):
    // send_n elements to send_peer and recv_n elements from recv_peer, both with tag. The peers
    // may differ (a pipeline stage receives from the previous one and sends to the next), or
    // both be this rank (then send_n == recv_n and it is a copy), but not one of them only.
    virtual void sendrecv(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n,
                          int recv_peer, int tag = 0) = 0;
    // sendrecv's generalisation (a pipeline action that moves several tensors): posts every
    // message at once and returns when all are done. Peers may be this rank (a send and a
    // receive of the same size and tag then pair up, in order). Several messages between the
    // same two ranks must be posted in the same order on both sides.
    virtual void exchange(const std::vector<CommP2P>& msgs) = 0;
    // Personalised all-to-all (expert parallelism's dispatch and combine): this member sends
    // send_counts[p] elements, from send at offset sum(send_counts[0..p)), to group rank p, and
    // receives recv_counts[p] elements from p into recv at offset sum(recv_counts[0..p)). Counts
    // may be uneven and zero; recv_counts[p] must equal member p's send_counts[rank()]. Written
    // once over exchange (one message per nonzero count, this rank's own piece included), so it
    // runs on every implementation: MPI's Isend/Irecv, NCCL's grouped ncclSend/ncclRecv.
    void all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                      const std::vector<size_t>& recv_counts);
    virtual void barrier() = 0;

    // Non-blocking: as the calls above, completed by wait(). The defaults complete the call
    // inside the post (an empty handle).
    virtual CommHandle all_reduce_async(float* buf, size_t n, ReduceOp op) {
        all_reduce(buf, n, op);
        return {};
    }
    virtual CommHandle reduce_scatter_async(const float* send, float* recv, const std::vector<size_t>& counts) {
        reduce_scatter(send, recv, counts);
        return {};
    }
    virtual CommHandle all_gather_async(const float* send, float* recv, const std::vector<size_t>& counts) {
        all_gather(send, recv, counts);
        return {};
    }
    virtual CommHandle exchange_async(const std::vector<CommP2P>& msgs) {
        exchange(msgs);
        return {};
    }
    // Returns when h's operation is complete (at once for an empty handle); h is then empty.
    virtual void wait(CommHandle& h) { h = CommHandle(); }
    // false: every non-blocking post waits for its completion before it returns.
    virtual void set_overlap(bool on) { overlap_ = on; }
    bool overlap() const { return overlap_; }
    // true: posted operations run one after another in posting order (NCCL: one stream), so a
    // receive posted ahead of its turn holds back everything posted after it; a caller then posts
    // each operation at its turn (the pipeline's receives). false (MPI): point-to-point messages
    // match by peer and tag, and a receive posted early blocks nothing.
    virtual bool runs_in_order() const { return false; }

protected:
    Comm(std::vector<int> members, int rank, std::string group)
        : members_(std::move(members)), rank_(rank), group_(std::move(group)) {}

    // Argument checks every implementation makes (assertions naming the call and the group).
    void check_counts(const std::vector<size_t>& counts) const;
    void check_peer(int peer, const char* op) const;
    void check_tag(int tag, const char* op) const;
    void check_p2p(int peer, int tag, const char* op) const;  // send / recv: another member
    void check_sendrecv(size_t send_n, int send_peer, size_t recv_n, int recv_peer, int tag) const;

private:
    std::vector<int> members_;
    int rank_;
    std::string group_;
    bool overlap_ = true;
};

// The tags every implementation accepts (MPI guarantees at least 0..32767).
constexpr int kMaxCommTag = 32767;

// A group of one process (no MPI needed): reductions are copies.
std::unique_ptr<Comm> make_self_comm(int world_rank);
// A group over MPI (host buffers). Collective over MPI_COMM_WORLD: every world rank calls it
// with the same list of groups (a partition of the world ranks) and gets the group holding it.
// group names it in messages; timeout_s (> 0) bounds every blocking call (the watchdog above).
std::unique_ptr<Comm> make_mpi_comm(const std::vector<std::vector<int>>& partition, int world_rank,
                                    const std::string& group, double timeout_s);
// A group over NCCL (device buffers) on CUDA device cuda_device (made current here: call it
// before any other CUDA work of this process). bootstrap is a host communicator over the same
// group (make_mpi_comm's): group rank 0 creates the ncclUniqueId and broadcasts it over it; it
// is not used afterwards. Collective over the group. Defined in llmc/cuda/comm_nccl.cu; a
// binary built without the CUDA objects gets a definition that throws UserError.
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int cuda_device, double timeout_s);

// LLMC_COMM_DELAY_MS in seconds (0 when unset); a value that is not a number >= 0 throws UserError.
double comm_delay_s();
// Sleeps until started + comm_delay_s() (the delay hook; returns at once without it).
void comm_delay_until(std::chrono::steady_clock::time_point started);
// Milliseconds this process has spent inside communication waits (blocking calls, waits on
// handles) so far; a CommWaitTimer adds the time of its scope. Main thread only.
double comm_wait_ms();
// How many such waits (a CommWaitTimer each): on NCCL every one is the host polling the device
// (log.jsonl's comm_waits, beside the backend's host_syncs).
uint64_t comm_waits();
// The calling thread's waits are not counted from now on: a thread of its own (checkpoint.async's
// writer and servers) on a communicator no other thread uses, whose waits are not the step's.
void comm_waits_uncounted_here();
class CommWaitTimer {
public:
    CommWaitTimer();
    ~CommWaitTimer();
    CommWaitTimer(const CommWaitTimer&) = delete;
    CommWaitTimer& operator=(const CommWaitTimer&) = delete;

private:
    std::chrono::steady_clock::time_point t0_;
};

// Prefix sums of counts: offsets[i] = counts[0] + ... + counts[i-1].
std::vector<size_t> count_offsets(const std::vector<size_t>& counts);
// "1 float", "2621 floats": call sizes in messages.
std::string count_text(size_t n, const char* unit);
// "send 12 floats to group rank 1, tag 3; recv ...": an exchange's messages.
std::string exchange_text(const std::vector<CommP2P>& msgs);

// For the watchdogs. Prints "<rank prefix>error: <op> on the <group> group (<detail>) <what>;
// ending the job" to stderr, then ends every process of the job with exit code 1 (MPI_Abort,
// or _exit where this thread may not call MPI: the launcher then ends the others). Callable
// from any thread. Defined in comm_mpi.cpp.
// cleanup runs between the two (NCCL aborts its communicator there), under a 10 s alarm that
// ends the process should it hang.
[[noreturn]] void comm_fatal(const std::string& op, const std::string& group, const std::string& detail,
                             const std::string& what, const std::function<void()>& cleanup = nullptr);
// The "<what>" of a stall: "did not complete within parallel.timeout_s = T s".
std::string timeout_text(double timeout_s);
// The watchdogs' deadline for a call starting now: now + timeout_s, capped at now + kCommTimeoutCapS
// so that it cannot overflow the clock's int64 nanoseconds. A larger timeout_s (1e10, 1e300)
// therefore means "practically never" (about 30 years).
constexpr double kCommTimeoutCapS = 1e9;
std::chrono::steady_clock::time_point comm_deadline(double timeout_s);
