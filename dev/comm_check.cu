// comm_check: every call of one communicator kind on N ranks, checked against values computed
// here, plus its watchdog. The MPI communicator has the same checks in the CPU unit tests
// (test/test_comm.cpp); this program is for NCCL, which needs a GPU per rank:
//
//   mpirun -np 2 dev/comm_check nccl          # every call, results checked; a timing line
//   mpirun -np 2 dev/comm_check nccl stall    # rank 1 hangs: the job must end after 2 s with
//                                             # "all_reduce on the world group ... did not complete"
//   mpirun --oversubscribe -np 3 dev/comm_check mpi
//
// Prints "comm_check <kind>: all N checks passed" on each rank, or the failures (exit code 1).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/core/common.h"
#include "llmc/cuda/common.cuh"
#include "llmc/run/runtime.h"

namespace {

int checks = 0, failures = 0;

void check(bool ok, const std::string& what) {
    checks++;
    if (!ok) {
        failures++;
        std::fprintf(stderr, "%sFAILED: %s\n", rank_prefix().c_str(), what.c_str());
    }
}

std::vector<float> iota_from(float start, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = start + float(i);
    return v;
}

// A buffer in the communicator's memory space, filled from and read back into host vectors.
class Buf {
public:
    Buf(bool device, const std::vector<float>& init) : device_(device), host_(init) {
        if (device_ && !host_.empty()) {
            CUDA_CHECK(cudaMalloc(&dev_, host_.size() * sizeof(float)));
            CUDA_CHECK(cudaMemcpy(dev_, host_.data(), host_.size() * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
    Buf(bool device, size_t n, float fill) : Buf(device, std::vector<float>(n, fill)) {}
    ~Buf() {
        if (dev_) cudaFree(dev_);
    }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    float* ptr() { return device_ ? dev_ : (host_.empty() ? nullptr : host_.data()); }
    const std::vector<float>& read() {
        if (device_ && !host_.empty())
            CUDA_CHECK(cudaMemcpy(host_.data(), dev_, host_.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return host_;
    }

private:
    bool device_;
    std::vector<float> host_;
    float* dev_ = nullptr;
};

// Writes v into p[0..n) after spinning about `cycles` clock cycles: work still running on the
// compute stream when the communicator is called.
__global__ void slow_fill(float* p, size_t n, float v, long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

void run_checks(Comm& c, bool dev) {
    const int me = c.rank(), P = c.size();
    // all_reduce: small integers and quarters, exact in any order
    {
        std::vector<float> a(1000);
        for (size_t i = 0; i < a.size(); i++) a[i] = float((me + 1) * int(i)) + 0.25f;
        Buf b(dev, a);
        c.all_reduce(b.ptr(), a.size(), ReduceOp::Sum);
        const std::vector<float>& got = b.read();
        bool ok = true;
        for (size_t i = 0; i < a.size(); i++) {
            float want = 0;
            for (int r = 0; r < P; r++) want += float((r + 1) * int(i)) + 0.25f;
            ok = ok && got[i] == want;
        }
        check(ok, "all_reduce sum (float)");
        for (size_t i = 0; i < a.size(); i++) a[i] = float((int(i) + 5 * me) % 11) - 3.0f;
        Buf m(dev, a);
        c.all_reduce(m.ptr(), a.size(), ReduceOp::Max);
        const std::vector<float>& gm = m.read();
        ok = true;
        for (size_t i = 0; i < a.size(); i++) {
            float want = -1e30f;
            for (int r = 0; r < P; r++) want = std::max(want, float((int(i) + 5 * r) % 11) - 3.0f);
            ok = ok && gm[i] == want;
        }
        check(ok, "all_reduce max (float)");
    }
    // doubles are host memory on every communicator
    {
        double d[2] = {me + 0.5, -double(me)};
        c.all_reduce(d, 2, ReduceOp::Sum);
        check(d[0] == P * P / 2.0 && d[1] == -P * (P - 1) / 2.0, "all_reduce sum (double, host)");
        d[0] = me * 1.5, d[1] = -double(me);
        c.all_reduce(d, 2, ReduceOp::Max);
        check(d[0] == (P - 1) * 1.5 && d[1] == 0.0, "all_reduce max (double, host)");
    }
    // reduce_scatter and all_gather: equal pieces (one NCCL call) and unequal ones (grouped)
    for (int equal = 0; equal < 2; equal++) {
        std::vector<size_t> counts(static_cast<size_t>(P), 0);
        for (int r = 0; r < P; r++) counts[size_t(r)] = equal ? 4 : size_t((r * 3) % 5);  // 0, 3, 1, 4, ...
        const std::vector<size_t> off = count_offsets(counts);
        Buf send(dev, iota_from(100.0f * me, off.back()));
        Buf recv(dev, counts[size_t(me)] + 1, -7.0f);
        c.reduce_scatter(send.ptr(), recv.ptr(), counts);
        const std::vector<float>& got = recv.read();
        bool ok = got.back() == -7.0f;
        for (size_t k = 0; k < counts[size_t(me)]; k++) {
            float want = 0;
            for (int r = 0; r < P; r++) want += 100.0f * r + float(off[size_t(me)] + k);
            ok = ok && got[k] == want;
        }
        check(ok, equal ? "reduce_scatter (equal pieces)" : "reduce_scatter (unequal pieces)");
        Buf gsend(dev, iota_from(10.0f * me, counts[size_t(me)]));
        Buf grecv(dev, off.back(), -1.0f);
        c.all_gather(gsend.ptr(), grecv.ptr(), counts);
        const std::vector<float>& g = grecv.read();
        ok = true;
        for (int r = 0; r < P; r++)
            for (size_t k = 0; k < counts[size_t(r)]; k++) ok = ok && g[off[size_t(r)] + k] == 10.0f * r + float(k);
        check(ok, equal ? "all_gather (equal pieces)" : "all_gather (unequal pieces)");
        const int root = P - 1;
        Buf to(dev, me == root ? off.back() : 0, -1.0f);
        c.gather(gsend.ptr(), to.ptr(), counts, root);
        if (me == root) {
            const std::vector<float>& t = to.read();
            ok = true;
            for (int r = 0; r < P; r++)
                for (size_t k = 0; k < counts[size_t(r)]; k++) ok = ok && t[off[size_t(r)] + k] == 10.0f * r + float(k);
            check(ok, "gather");
        }
    }
    // broadcast
    {
        const int root = P - 1;
        Buf b(dev, me == root ? iota_from(0.5f, 7) : std::vector<float>(7, -1.0f));
        c.broadcast(b.ptr(), 7, root);
        check(b.read() == iota_from(0.5f, 7), "broadcast");
    }
    // point-to-point: tagged send/recv, the ring through sendrecv, exchange with both neighbours
    if (P > 1) {
        if (me == 0) {
            Buf x(dev, std::vector<float>{1, 2, 3}), y(dev, std::vector<float>{4, 5});
            c.send(x.ptr(), 3, 1, 3);
            c.send(y.ptr(), 2, 1, 4);
        } else if (me == 1) {
            Buf x(dev, 3, 0.0f), y(dev, 2, 0.0f);
            c.recv(x.ptr(), 3, 0, 3);
            c.recv(y.ptr(), 2, 0, 4);
            check(x.read() == std::vector<float>{1, 2, 3} && y.read() == std::vector<float>{4, 5}, "send/recv");
        }
        const int next = (me + 1) % P, prev = (me + P - 1) % P;
        Buf out(dev, iota_from(1000.0f * me, size_t(4 + me)));
        Buf in(dev, size_t(4 + prev), -1.0f);
        c.sendrecv(out.ptr(), size_t(4 + me), next, in.ptr(), size_t(4 + prev), prev, 9);
        check(in.read() == iota_from(1000.0f * prev, size_t(4 + prev)), "sendrecv around the ring");
        Buf a_out(dev, iota_from(10.0f * me, 3)), c_out(dev, iota_from(7.0f * me, 5));
        Buf self_out(dev, iota_from(0.5f * me, 4)), self_in(dev, 4, -1.0f);
        Buf a_in(dev, 3, -1.0f), c_in(dev, 5, -1.0f);
        c.exchange({{false, c_in.ptr(), 5, next, 12},
                    {true, a_out.ptr(), 3, next, 10},
                    {false, a_in.ptr(), 3, prev, 10},
                    {true, c_out.ptr(), 5, prev, 12},
                    {true, self_out.ptr(), 4, me, 13},
                    {false, self_in.ptr(), 4, me, 13}});
        check(a_in.read() == iota_from(10.0f * prev, 3) && c_in.read() == iota_from(7.0f * next, 5) &&
                  self_in.read() == iota_from(0.5f * me, 4),
              "exchange");
    }
    // all_to_all_v (expert parallelism): rank r sends (r + 2 p) % 4 elements to rank p, zeros
    // included, element i of the piece for p being 100 r + 10 p + i
    {
        std::vector<size_t> sc(static_cast<size_t>(P), 0), rc(static_cast<size_t>(P), 0);
        std::vector<float> send, want;
        for (int p = 0; p < P; p++) {
            sc[size_t(p)] = size_t((me + 2 * p) % 4);
            rc[size_t(p)] = size_t((p + 2 * me) % 4);
            for (size_t i = 0; i < sc[size_t(p)]; i++) send.push_back(float(100 * me + 10 * p + int(i)));
            for (size_t i = 0; i < rc[size_t(p)]; i++) want.push_back(float(100 * p + 10 * me + int(i)));
        }
        Buf s_buf(dev, send), r_buf(dev, want.size(), -1.0f);
        c.all_to_all_v(s_buf.ptr(), sc, r_buf.ptr(), rc);
        check(r_buf.read() == want, "all_to_all_v (uneven and zero counts)");
    }
    // posted calls (the overlap path: on NCCL enqueued on the communicator's stream, waited for by
    // their events): the blocking calls' results, waited for in another order than posted
    {
        std::vector<size_t> counts(static_cast<size_t>(P), 0);
        for (int r = 0; r < P; r++) counts[size_t(r)] = size_t((r * 3) % 5) + 1;
        const std::vector<size_t> off = count_offsets(counts);
        std::vector<float> a(off.back()), want_rs(counts[size_t(me)]), want_ag(off.back()), mine(counts[size_t(me)]);
        for (size_t i = 0; i < a.size(); i++) a[i] = float((me + 1) * int(i));
        for (size_t i = 0; i < want_rs.size(); i++)
            for (int r = 0; r < P; r++) want_rs[i] += float((r + 1) * int(off[size_t(me)] + i));
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < counts[size_t(r)]; i++) want_ag[off[size_t(r)] + i] = float(1000 * r + int(i));
        for (size_t i = 0; i < mine.size(); i++) mine[i] = float(1000 * me + int(i));
        Buf ar(dev, a), rs_in(dev, a), rs_out(dev, counts[size_t(me)], -1.0f), ag_in(dev, mine),
            ag_out(dev, off.back(), -1.0f), x_out(dev, iota_from(3.0f * me, 6)), x_in(dev, 6, -1.0f);
        const int next = (me + 1) % P, prev = (me + P - 1) % P;
        CommHandle h1 = c.all_reduce_async(ar.ptr(), a.size(), ReduceOp::Sum);
        CommHandle h2 = c.reduce_scatter_async(rs_in.ptr(), rs_out.ptr(), counts);
        CommHandle h3 = c.all_gather_async(ag_in.ptr(), ag_out.ptr(), counts);
        CommHandle h4 = c.exchange_async({{false, x_in.ptr(), 6, prev, 3}, {true, x_out.ptr(), 6, next, 3}});
        c.wait(h3);
        c.wait(h1);
        c.wait(h4);
        c.wait(h2);
        check(!h1.pending() && !h2.pending() && !h3.pending() && !h4.pending(), "posted calls: handles empty after wait");
        bool ok = true;
        const std::vector<float>& got = ar.read();
        for (size_t i = 0; i < a.size(); i++) ok = ok && got[i] == float(P * (P + 1) / 2 * int(i));
        check(ok, "all_reduce_async");
        check(rs_out.read() == want_rs, "reduce_scatter_async (unequal counts)");
        check(ag_out.read() == want_ag, "all_gather_async (unequal counts)");
        check(x_in.read() == iota_from(3.0f * prev, 6), "exchange_async");
    }
    c.barrier();
    // device buffers: the call starts after work still running on a blocking stream (CudaOps's
    // kind), with no synchronisation by the caller
    if (dev) {
        cudaStream_t compute;
        CUDA_CHECK(cudaStreamCreate(&compute));
        Buf b(dev, 1 << 20, 0.0f);
        slow_fill<<<64, 256, 0, compute>>>(b.ptr(), size_t(1) << 20, float(me + 1), 200000000LL);  // ~0.1 s
        CUDA_CHECK(cudaGetLastError());
        c.all_reduce(b.ptr(), size_t(1) << 20, ReduceOp::Sum);
        const std::vector<float>& got = b.read();
        check(got[0] == P * (P + 1) / 2.0f && got.back() == P * (P + 1) / 2.0f,
              "all_reduce waits for the compute stream's writes");
        CUDA_CHECK(cudaStreamDestroy(compute));
    }
    // timing: all-reduce of one 25 MiB bucket (the default parallel.bucket_mb)
    {
        const size_t n = size_t(25) << 18;
        Buf b(dev, n, 1.0f);
        c.all_reduce(b.ptr(), n, ReduceOp::Sum);  // warm-up (connections)
        const int iters = 10;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; i++) c.all_reduce(b.ptr(), n, ReduceOp::Sum);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
        if (me == 0)
            std::printf("comm_check %s: all_reduce of 25 MiB on %d ranks: %.2f ms (%.1f GB/s algorithm bandwidth)\n",
                        c.name().c_str(), P, ms, n * 4.0 / ms / 1e6);
    }
}

}  // namespace

int main(int argc, char** argv) {
    Runtime rt(&argc, &argv);
    const std::string kind = argc > 1 ? argv[1] : "nccl";
    const bool stall = argc > 2 && std::strcmp(argv[2], "stall") == 0;
    if (!rt.mpi || rt.world < 2 || (kind != "nccl" && kind != "mpi")) {
        std::fprintf(stderr, "usage: mpirun -np N dev/comm_check nccl|mpi [stall]   (N >= 2)\n");
        return 2;
    }
    std::vector<int> all;
    for (int r = 0; r < rt.world; r++) all.push_back(r);
    const double timeout_s = stall ? 2.0 : 60.0;
    std::unique_ptr<Comm> mpi = make_mpi_comm({all}, rt.rank, "world", timeout_s);
    std::unique_ptr<Comm> comm;
    try {
        comm = kind == "nccl" ? make_nccl_comm(*mpi, rt.local_rank, timeout_s) : std::move(mpi);
    } catch (const UserError& e) {
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
        rt.abort_job(2);
    }
    const bool dev = comm->on_device();
    if (stall) {
        Buf b(dev, 1000, 1.0f);
        if (rt.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(600));  // as a hung rank would
        comm->all_reduce(b.ptr(), 1000, ReduceOp::Sum);
        std::fprintf(stderr, "%sFAILED: the watchdog let the job go on\n", rank_prefix().c_str());
        return 1;
    }
    run_checks(*comm, dev);
    if (failures == 0) std::printf("%scomm_check %s: all %d checks passed\n", rank_prefix().c_str(), kind.c_str(), checks);
    comm.reset();
    return failures == 0 ? 0 : 1;
}
