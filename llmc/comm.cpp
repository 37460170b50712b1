// The group of one (no MPI) and helpers shared by every Comm implementation.
#include <cstring>

#include "llmc/comm.h"
#include "llmc/common.h"

std::vector<size_t> count_offsets(const std::vector<size_t>& counts) {
    std::vector<size_t> off(counts.size() + 1, 0);
    for (size_t i = 0; i < counts.size(); i++) off[i + 1] = off[i] + counts[i];
    return off;
}

namespace {

class SelfComm : public Comm {
public:
    explicit SelfComm(int world_rank) : Comm({world_rank}, 0) {}
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
    void send(const float*, size_t, int) override { LLMC_ASSERT(false, "send to self"); }
    void recv(float*, size_t, int) override { LLMC_ASSERT(false, "recv from self"); }
    void barrier() override {}

private:
    static void copy(const float* src, float* dst, const std::vector<size_t>& counts) {
        LLMC_ASSERT(counts.size() == 1, "counts must have one entry per member");
        if (src != dst && counts[0]) std::memmove(dst, src, counts[0] * sizeof(float));
    }
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(int world_rank) { return std::unique_ptr<Comm>(new SelfComm(world_rank)); }
