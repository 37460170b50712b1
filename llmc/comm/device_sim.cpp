#include "llmc/comm/device_sim.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "llmc/core/common.h"

namespace {

std::mutex registry_mu;
std::map<const char*, size_t>& registry() {  // start -> bytes
    static std::map<const char*, size_t> r;
    return r;
}

// A host communicator that stands in for NCCL: device memory only, operations in posting order.
class DeviceCheckComm : public Comm {
public:
    explicit DeviceCheckComm(std::unique_ptr<Comm> inner)
        : Comm(inner->members(), inner->rank(), inner->group()), in_(std::move(inner)) {
        LLMC_ASSERT(!in_->on_device(), "the device check wraps a host communicator");
    }
    std::string name() const override { return "nccl (simulated over " + in_->name() + ")"; }
    bool on_device() const override { return true; }
    bool runs_in_order() const override { return true; }
    void set_overlap(bool on) override {
        Comm::set_overlap(on);
        in_->set_overlap(on);
    }

    void all_reduce(float* buf, size_t n, ReduceOp op) override {
        check(buf, n, "all_reduce");
        in_->all_reduce(buf, n, op);
    }
    void all_reduce(double* buf, size_t n, ReduceOp op) override { in_->all_reduce(buf, n, op); }
    void all_reduce_dev(double* buf, size_t n, ReduceOp op) override {
        check(buf, n * 2, "all_reduce");  // (check counts floats)
        in_->all_reduce(buf, n, op);
    }
    void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_rs(send, recv, counts, "reduce_scatter");
        in_->reduce_scatter(send, recv, counts);
    }
    void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_ag(send, recv, counts, "all_gather");
        in_->all_gather(send, recv, counts);
    }
    void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) override {
        check_counts(counts);
        check(send, counts[size_t(rank())], "gather");
        if (rank() == root) check(recv, total(counts), "gather");
        in_->gather(send, recv, counts, root);
    }
    void broadcast(float* buf, size_t n, int root) override {
        check(buf, n, "broadcast");
        in_->broadcast(buf, n, root);
    }
    void send(const float* buf, size_t n, int peer, int tag) override {
        check(buf, n, "send");
        in_->send(buf, n, peer, tag);
    }
    void recv(float* buf, size_t n, int peer, int tag) override {
        check(buf, n, "recv");
        in_->recv(buf, n, peer, tag);
    }
    void sendrecv(const float* sendbuf, size_t send_n, int send_peer, float* recvbuf, size_t recv_n, int recv_peer,
                  int tag) override {
        check(sendbuf, send_n, "sendrecv");
        check(recvbuf, recv_n, "sendrecv");
        in_->sendrecv(sendbuf, send_n, send_peer, recvbuf, recv_n, recv_peer, tag);
    }
    void exchange(const std::vector<CommP2P>& msgs) override {
        check_msgs(msgs);
        in_->exchange(msgs);
    }
    void barrier() override { in_->barrier(); }

    CommHandle all_reduce_async(float* buf, size_t n, ReduceOp op) override {
        check(buf, n, "all_reduce");
        return in_->all_reduce_async(buf, n, op);
    }
    CommHandle reduce_scatter_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_rs(send, recv, counts, "reduce_scatter");
        return in_->reduce_scatter_async(send, recv, counts);
    }
    CommHandle all_gather_async(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_ag(send, recv, counts, "all_gather");
        return in_->all_gather_async(send, recv, counts);
    }
    CommHandle exchange_async(const std::vector<CommP2P>& msgs) override {
        check_msgs(msgs);
        return in_->exchange_async(msgs);
    }
    void wait(CommHandle& h) override { in_->wait(h); }

private:
    std::unique_ptr<Comm> in_;

    static size_t total(const std::vector<size_t>& counts) { return count_offsets(counts).back(); }
    void check(const void* p, size_t n, const char* op) const {
        if (n == 0) return;
        LLMC_ASSERT(sim_device_owns(p, n * sizeof(float)),
                    strfmt("%s on the %s group: a buffer of %zu floats outside the backend's memory (the simulated "
                           "NCCL communicator takes device buffers; LLMC_SIM_DEVICE)",
                           op, group().c_str(), n));
    }
    void check_rs(const float* send, float* recv, const std::vector<size_t>& counts, const char* op) const {
        check_counts(counts);
        check(send, total(counts), op);
        check(recv, counts[size_t(rank())], op);
    }
    void check_ag(const float* send, float* recv, const std::vector<size_t>& counts, const char* op) const {
        check_counts(counts);
        check(send, counts[size_t(rank())], op);
        check(recv, total(counts), op);
    }
    void check_msgs(const std::vector<CommP2P>& msgs) const {
        for (const CommP2P& m : msgs) check(m.buf, m.n, "exchange");
    }
};

}  // namespace

bool sim_device() {
    static const bool on = [] {
        const char* e = std::getenv("LLMC_SIM_DEVICE");
        if (!e || !*e || std::strcmp(e, "0") == 0) return false;
        if (std::strcmp(e, "1") == 0) return true;
        throw UserError(strfmt("LLMC_SIM_DEVICE: \"%s\" is not 0 or 1", e));
    }();
    return on;
}

void sim_device_register(const void* p, size_t bytes) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(registry_mu);
    registry()[static_cast<const char*>(p)] = bytes;
}

void sim_device_unregister(const void* p) {
    std::lock_guard<std::mutex> lock(registry_mu);
    registry().erase(static_cast<const char*>(p));
}

bool sim_device_owns(const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry().upper_bound(c);  // the first allocation starting after c
    if (!c || it == registry().begin()) return false;
    --it;
    return c + bytes <= it->first + it->second;
}

std::unique_ptr<Comm> make_device_check_comm(std::unique_ptr<Comm> inner) {
    return std::unique_ptr<Comm>(new DeviceCheckComm(std::move(inner)));
}
