// The communicators themselves. The MPI communicator runs on 3 processes: the visible cases
// launch this binary under mpirun on a hidden case ([.comm_worker], [.comm_stall]), which makes
// every collective and point-to-point call and checks the results against values computed
// here, element by element; and the watchdog must end a job whose call is never answered.
// (The NCCL communicator needs GPUs: see the GPU tests.)
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/comm/comm.h"
#include "llmc/parallel/comm_stage.h"
#include "llmc/comm/device_sim.h"
#include "llmc/backend/ops.h"
#include "llmc/core/common.h"
#include "llmc/run/runtime.h"
#include "test/temp_dir.h"

namespace {

using Clock = std::chrono::steady_clock;

struct RankRun {
    int rc = -1;
    double seconds = 0;
    std::string output;  // stdout and stderr of every rank and of mpirun
};

// Runs this binary's hidden test cases tagged `tag` on n processes under mpirun (with the
// environment variable env=value for every rank, when given).
RankRun run_ranks(int n, const char* tag, const char* env = nullptr) {
    char exe[4096];
    const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    REQUIRE(len > 0);
    exe[len] = 0;
    std::string out_path = temp_base() + "/test_comm.XXXXXX";
    char* out = &out_path[0];
    const int fd = ::mkstemp(out);
    REQUIRE(fd >= 0);
    ::close(fd);
    const std::string cmd = strfmt("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
                                   "%s timeout 100 mpirun --oversubscribe -np %d %s%s '%s' '%s' > '%s' 2>&1",
                                   env ? env : "", n, env ? "-x " : "",
                                   env ? std::string(env).substr(0, std::string(env).find('=')).c_str() : "", exe,
                                   tag, out);
    RankRun run;
    const Clock::time_point t0 = Clock::now();
    const int status = std::system(cmd.c_str());
    run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    run.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    run.output = ss.str();
    ::unlink(out);
    return run;
}

std::vector<float> iota_from(float start, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = start + float(i);
    return v;
}

}  // namespace

TEST_CASE("MPI communicator on 3 ranks: collectives and point-to-point give the computed results", "[comm][mpi]") {
    RankRun run = run_ranks(3, "[comm_worker]");
    INFO(run.output);
    CHECK(run.rc == 0);
    CHECK(run.output.find("All tests passed") != std::string::npos);
}

TEST_CASE("MPI communicator on 3 ranks: a call never answered ends the job after timeout_s", "[comm][mpi]") {
    RankRun run = run_ranks(3, "[comm_stall]");
    INFO(run.output);
    CHECK(run.rc != 0);
    CHECK(run.rc != 124);  // timeout(1)'s: the job did not end by itself
    CHECK(run.seconds < 30);
    // ranks 0 and 2 wait for rank 1, which hangs outside any call: the waiting ones exchange
    // reports on a side channel, and rank 1, sending none, is named as the one that stalled. Both
    // waiting ranks end the job; the first to abort can take the other down before it prints, so
    // the message of either one will do.
    auto message = [](int me, int other) {
        return strfmt("[rank %d] error: recv #1 on the world group (4 floats from group rank 1, tag 7; waiting with "
                      "world ranks %s) did not complete within parallel.timeout_s = 1 s; stalled: world rank 1 (no "
                      "report within 1 s: in no call, hung or dead); waiting: rank %d in recv #1 on world; ending the job",
                      me, me == 0 ? "1, 2" : "0, 1", other);
    };
    CHECK((run.output.find(message(0, 2)) != std::string::npos || run.output.find(message(2, 0)) != std::string::npos));
    CHECK(run.output.find("the watchdog let") == std::string::npos);
}

TEST_CASE("MPI communicator on 3 ranks: posted calls give the blocking results and hide LLMC_COMM_DELAY_MS",
          "[comm][mpi]") {
    RankRun run = run_ranks(3, "[.comm_async]", "LLMC_COMM_DELAY_MS=100");
    INFO(run.output);
    CHECK(run.rc == 0);
    CHECK(run.output.find("All tests passed") != std::string::npos);
}

TEST_CASE("a group of one: sendrecv and all_to_all_v with oneself are copies; NCCL needs the CUDA objects", "[comm]") {
    std::unique_ptr<Comm> c = make_self_comm(0);
    const std::vector<float> a = {1, 2, 3};
    std::vector<float> b(3, 0);
    c->sendrecv(a.data(), 3, 0, b.data(), 3, 0, 5);
    CHECK(b == a);
    std::vector<float> d(3, 0);
    c->all_to_all_v(a.data(), {3}, d.data(), {3});
    CHECK(d == a);
    CHECK(c->group() == "self");
    // this binary links no CUDA: the fallback definition of make_nccl_comm says so
    CHECK_THROWS_WITH(make_nccl_comm(*c, 0, 1.0), Catch::Contains("parallel.comm"));
}

TEST_CASE("LLMC_SIM_DEVICE's registry: a buffer is the backend's only inside one allocation", "[comm][device]") {
    std::vector<char> block(256), other(64);
    sim_device_register(block.data(), 128);  // the first 128 bytes only
    sim_device_register(other.data(), 64);
    CHECK(sim_device_owns(block.data(), 128));
    CHECK(sim_device_owns(block.data() + 100, 28));
    CHECK_FALSE(sim_device_owns(block.data() + 100, 29));  // runs past the allocation
    CHECK_FALSE(sim_device_owns(block.data() + 128, 4));   // after it
    CHECK_FALSE(sim_device_owns(nullptr, 4));
    CHECK(sim_device_owns(other.data() + 60, 4));
    sim_device_unregister(block.data());
    CHECK_FALSE(sim_device_owns(block.data(), 4));
    CHECK(sim_device_owns(other.data(), 64));
    sim_device_unregister(other.data());
}

TEST_CASE("CommStage: the routes give the same result; messages are the tensor's words or fp32 host copies",
          "[comm][device]") {
    auto ops = make_cpu_ops();
    std::unique_ptr<Comm> c = make_self_comm(0);
    CommStage direct(*ops, c.get()), staged(*ops, c.get(), true);
    CHECK(direct.direct());
    CHECK_FALSE(staged.direct());
    // bf16 (2 bytes an element): 5 elements are 3 words as bytes, 5 fp32 values through the host
    CHECK(direct.words(Tensor(nullptr, 5, DType::BF16)) == 3);
    CHECK(staged.words(Tensor(nullptr, 5, DType::BF16)) == 5);
    CHECK(direct.words(Tensor(nullptr, 5, DType::F32)) == 5);
    std::vector<float> x = {1, -2, 3, 0.5f}, y(4, 0);
    for (CommStage* st : {&direct, &staged}) {
        // an all-gather of one member into another tensor: out = in; f sees where the route puts them
        Tensor in(x.data(), 4, DType::F32), out(y.data(), 4, DType::F32);
        const float* seen = nullptr;
        st->run(in, out, [&](const float* a, float* b) {
            seen = a;
            c->all_gather(a, b, {4});
        });
        CHECK(y == x);
        CHECK((seen == x.data()) == st->direct());  // in place on the direct route, a host copy otherwise
        std::fill(y.begin(), y.end(), 0.0f);
        CommStage::Message m = st->take_message(in);
        st->pack(m, in);
        st->unpack(out, m);
        CHECK(y == x);
        st->release_message(std::move(m));
        std::fill(y.begin(), y.end(), 0.0f);
    }
    // the message pool: a released buffer serves any message it holds; a larger one replaces it
    CommStage::Message a = direct.take_message(Tensor(nullptr, 8, DType::F32));
    void* first = a.dev.ptr;
    direct.release_message(std::move(a));
    CommStage::Message b = direct.take_message(Tensor(nullptr, 3, DType::F32));
    CHECK(b.dev.ptr == first);
    CommStage::Message c2 = direct.take_message(Tensor(nullptr, 8, DType::F32));  // b is in use: a new buffer
    CHECK(c2.dev.ptr != first);
    direct.release_message(std::move(b));
    direct.release_message(std::move(c2));
    CommStage::Message d = direct.take_message(Tensor(nullptr, 16, DType::F32));  // none holds 16 words
    CHECK(d.dev.n == 16);
    direct.release_message(std::move(d));
    float h[2] = {4, 5};
    direct.run_host(h, 2, [&](float* p) {
        CHECK(p == h);  // a host communicator reads host values where they are
        p[0] += 1;
    });
    CHECK(h[0] == 5);
}

// ---- the rank side (hidden: run under mpirun by the cases above) ----

TEST_CASE("comm worker: every call of the MPI communicator on 3 ranks", "[.comm_worker]") {
    Runtime rt(nullptr, nullptr);  // no SECTIONs here: MPI starts once per process
    REQUIRE(rt.mpi);
    REQUIRE(rt.world == 3);
    const int me = rt.rank, P = 3;
    std::unique_ptr<Comm> world = make_mpi_comm({{0, 1, 2}}, me, "world", 30.0);
    REQUIRE(world->name() == "mpi");
    CHECK(!world->on_device());
    CHECK(world->rank() == me);
    CHECK(world->size() == P);
    CHECK(world->group() == "world");

    // all_reduce, float: sums of small integers and quarters are exact in any order
    std::vector<float> a(1000);
    for (size_t i = 0; i < a.size(); i++) a[i] = float((me + 1) * int(i)) + 0.25f;
    world->all_reduce(a.data(), a.size(), ReduceOp::Sum);
    for (size_t i = 0; i < a.size(); i++) {
        float want = 0;
        for (int r = 0; r < P; r++) want += float((r + 1) * int(i)) + 0.25f;
        if (a[i] != want) FAIL_CHECK(strfmt("all_reduce sum [%zu] = %g, want %g", i, a[i], want));
    }
    for (size_t i = 0; i < a.size(); i++) a[i] = float((int(i) + 5 * me) % 11) - 3.0f;
    world->all_reduce(a.data(), a.size(), ReduceOp::Max);
    for (size_t i = 0; i < a.size(); i++) {
        float want = -1e30f;
        for (int r = 0; r < P; r++) want = std::max(want, float((int(i) + 5 * r) % 11) - 3.0f);
        if (a[i] != want) FAIL_CHECK(strfmt("all_reduce max [%zu] = %g, want %g", i, a[i], want));
    }
    // all_reduce, double (the scalars' path)
    double d[2] = {me + 0.5, -double(me)};
    world->all_reduce(d, 2, ReduceOp::Sum);
    CHECK(d[0] == 4.5);
    CHECK(d[1] == -3.0);
    d[0] = me * 1.5, d[1] = -double(me);
    world->all_reduce(d, 2, ReduceOp::Max);
    CHECK(d[0] == 3.0);
    CHECK(d[1] == 0.0);

    // reduce_scatter with unequal pieces (one empty): rank r gets its piece of the sum
    {
        const std::vector<size_t> counts = {2, 0, 3}, off = count_offsets(counts);
        const std::vector<float> send = iota_from(100.0f * me, 5);
        std::vector<float> recv(counts[size_t(me)] + 1, -7.0f);  // one guard element past the piece
        world->reduce_scatter(send.data(), recv.data(), counts);
        for (size_t k = 0; k < counts[size_t(me)]; k++) {
            float want = 0;
            for (int r = 0; r < P; r++) want += 100.0f * r + float(off[size_t(me)] + k);
            CHECK(recv[k] == want);
        }
        CHECK(recv.back() == -7.0f);
    }
    // all_gather and gather: every piece lands at its offset
    {
        const std::vector<size_t> counts = {1, 3, 2}, off = count_offsets(counts);
        const std::vector<float> send = iota_from(10.0f * me, counts[size_t(me)]);
        std::vector<float> recv(6, -1.0f);
        world->all_gather(send.data(), recv.data(), counts);
        for (int r = 0; r < P; r++)
            for (size_t k = 0; k < counts[size_t(r)]; k++) CHECK(recv[off[size_t(r)] + k] == 10.0f * r + float(k));
        const std::vector<size_t> gcounts = {2, 2, 1}, goff = count_offsets(gcounts);
        const std::vector<float> gsend = iota_from(-20.0f * me, gcounts[size_t(me)]);
        std::vector<float> grecv(me == 1 ? 5 : 0, -1.0f);
        world->gather(gsend.data(), me == 1 ? grecv.data() : nullptr, gcounts, 1);
        if (me == 1)
            for (int r = 0; r < P; r++)
                for (size_t k = 0; k < gcounts[size_t(r)]; k++)
                    CHECK(grecv[goff[size_t(r)] + k] == -20.0f * r + float(k));
    }
    // broadcast from the last rank
    {
        std::vector<float> b = me == 2 ? iota_from(0.5f, 7) : std::vector<float>(7, -1.0f);
        world->broadcast(b.data(), b.size(), 2);
        CHECK(b == iota_from(0.5f, 7));
    }
    // send/recv: two tagged messages from rank 0 to rank 1, received in order; rank 2 stays out
    if (me == 0) {
        const std::vector<float> x = {1, 2, 3}, y = {4, 5};
        world->send(x.data(), 3, 1, 3);
        world->send(y.data(), 2, 1, 4);
    } else if (me == 1) {
        std::vector<float> x(3), y(2);
        world->recv(x.data(), 3, 0, 3);
        world->recv(y.data(), 2, 0, 4);
        CHECK(x == std::vector<float>{1, 2, 3});
        CHECK(y == std::vector<float>{4, 5});
    }
    // the default tag (0) on both sides
    if (me == 2) {
        const float z = 42.0f;
        world->send(&z, 1, 0);
    } else if (me == 0) {
        float z = 0;
        world->recv(&z, 1, 2);
        CHECK(z == 42.0f);
    }
    // sendrecv around the ring, a different size per direction (a pipeline's shape: receive from
    // the previous stage, send to the next)
    {
        const int next = (me + 1) % P, prev = (me + P - 1) % P;
        const std::vector<float> out = iota_from(1000.0f * me, size_t(4 + me));
        std::vector<float> in(size_t(4 + prev), -1.0f);
        world->sendrecv(out.data(), out.size(), next, in.data(), in.size(), prev, 9);
        CHECK(in == iota_from(1000.0f * prev, size_t(4 + prev)));
        // with oneself: a copy
        std::vector<float> self(out.size(), 0.0f);
        world->sendrecv(out.data(), out.size(), me, self.data(), self.size(), me, 9);
        CHECK(self == out);
    }
    // exchange: both neighbours at once, two messages to the next rank (posted in the order the
    // next rank receives them), and a message to oneself
    {
        const int next = (me + 1) % P, prev = (me + P - 1) % P;
        std::vector<float> a_out = iota_from(10.0f * me, 3), b_out = iota_from(-10.0f * me, 2),
                           c_out = iota_from(7.0f * me, 5), self_out = iota_from(0.5f * me, 4);
        std::vector<float> a_in(3, -1.0f), b_in(2, -1.0f), c_in(5, -1.0f), self_in(4, -1.0f);
        world->exchange({{false, c_in.data(), 5, next, 12},
                         {true, a_out.data(), 3, next, 10},
                         {true, b_out.data(), 2, next, 11},
                         {false, a_in.data(), 3, prev, 10},
                         {false, b_in.data(), 2, prev, 11},
                         {true, c_out.data(), 5, prev, 12},
                         {true, self_out.data(), 4, me, 13},
                         {false, self_in.data(), 4, me, 13}});
        CHECK(a_in == iota_from(10.0f * prev, 3));
        CHECK(b_in == iota_from(-10.0f * prev, 2));
        CHECK(c_in == iota_from(7.0f * next, 5));
        CHECK(self_in == self_out);
    }
    world->barrier();

    // groups: {0, 2} and {1} (MPI_Comm_split of the world); rank 2 is group rank 1 of the first
    {
        std::unique_ptr<Comm> g = make_mpi_comm({{0, 2}, {1}}, me, "dp", 30.0);
        CHECK(g->group() == "dp");
        CHECK(g->size() == (me == 1 ? 1 : 2));
        CHECK(g->rank() == (me == 2 ? 1 : 0));
        CHECK(g->members() == (me == 1 ? std::vector<int>{1} : std::vector<int>{0, 2}));
        double w = me;
        g->all_reduce(&w, 1, ReduceOp::Sum);
        CHECK(w == (me == 1 ? 1.0 : 2.0));
        if (g->size() == 2) {
            std::vector<float> v = {float(me), 1.0f};
            std::vector<float> u(2, -1.0f);
            g->sendrecv(v.data(), 2, 1 - g->rank(), u.data(), 2, 1 - g->rank(), 1);
            CHECK(u == std::vector<float>{float(2 - me), 1.0f});
        }
    }

    // all_to_all_v: rank r sends (r + 2 p) % 4 elements to rank p (zeros included: 0 -> 2, 2 -> 2,
    // 2 -> 0 send none), element i of the piece for p being 100 r + 10 p + i
    {
        auto cnt = [](int from, int to) { return size_t((from + 2 * to) % 4); };
        std::vector<size_t> sc(P), rc(P);
        std::vector<float> send, recv, want;
        for (int p = 0; p < P; p++) {
            sc[size_t(p)] = cnt(me, p);
            rc[size_t(p)] = cnt(p, me);
            for (size_t i = 0; i < sc[size_t(p)]; i++) send.push_back(float(100 * me + 10 * p + int(i)));
            for (size_t i = 0; i < rc[size_t(p)]; i++) want.push_back(float(100 * p + 10 * me + int(i)));
        }
        recv.assign(want.size(), -1.0f);
        world->all_to_all_v(send.data(), sc, recv.data(), rc);
        CHECK(recv == want);
        // nothing at all to move is a valid call too
        world->all_to_all_v(nullptr, std::vector<size_t>(P, 0), nullptr, std::vector<size_t>(P, 0));
    }

    // the watchdog stays quiet for calls that end in time, however many and however late (within
    // timeout_s): rank 2 arrives 0.3 s after the others at the first of 300 calls under a 2 s limit
    {
        std::unique_ptr<Comm> quick = make_mpi_comm({{0, 1, 2}}, me, "world", 2.0);
        if (me == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        for (int i = 0; i < 300; i++) {
            double x = 1.0;
            quick->all_reduce(&x, 1, ReduceOp::Sum);
            if (x != 3.0) FAIL_CHECK("all_reduce under the short timeout");
        }
        quick->barrier();
    }

    // a huge timeout_s means "practically never", not a deadline that overflows the clock and has
    // passed before the call starts (1e10 s is 1e19 ns, beyond int64; infinity likewise)
    for (double huge : {1e10, 1e300, double(INFINITY)}) {
        std::unique_ptr<Comm> patient = make_mpi_comm({{0, 1, 2}}, me, "world", huge);
        if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        double x = 1.0;
        patient->all_reduce(&x, 1, ReduceOp::Sum);
        CHECK(x == 3.0);
        patient->barrier();
    }
}

TEST_CASE("comm worker: a receive nobody answers", "[.comm_stall]") {
    Runtime rt(nullptr, nullptr);
    REQUIRE(rt.world == 3);
    std::unique_ptr<Comm> world = make_mpi_comm({{0, 1, 2}}, rt.rank, "world", 1.0);
    std::vector<float> buf(4);
    if (rt.rank != 1) world->recv(buf.data(), 4, 1, 7);           // rank 1 never sends
    else std::this_thread::sleep_for(std::chrono::seconds(60));  // as a hung rank would
    FAIL("the watchdog let the job go on");
}

// The non-blocking calls under LLMC_COMM_DELAY_MS=100 (a posted call completes no sooner than
// 100 ms after its post): results, bits, and where the delay is spent.
TEST_CASE("comm worker: posted calls", "[.comm_async]") {
    Runtime rt(nullptr, nullptr);
    REQUIRE(rt.world == 3);
    const int me = rt.rank, P = 3;
    REQUIRE(comm_delay_s() == 0.1);
    std::unique_ptr<Comm> world = make_mpi_comm({{0, 1, 2}}, me, "world", 30.0);
    auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };

    // sums of values that round (three ranks: the order of the additions shows in the bits),
    // posted with overlap and without: bitwise the same, and the same on every rank
    std::vector<float> x(4096);
    for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(float(i * 7 + me * 131)) * 1e3f / float(i + 1);
    std::vector<float> on = x, off = x, blocking = x;
    CommHandle h = world->all_reduce_async(on.data(), on.size(), ReduceOp::Sum);
    CHECK(h.pending());
    world->wait(h);
    CHECK(!h.pending());
    world->set_overlap(false);
    h = world->all_reduce_async(off.data(), off.size(), ReduceOp::Sum);
    CHECK(!h.pending());  // waited for inside the post
    world->set_overlap(true);
    CHECK(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)) == 0);
    std::vector<float> every(on.size() * P);
    world->all_gather(on.data(), every.data(), std::vector<size_t>(P, on.size()));
    for (int r = 0; r < P; r++) CHECK(std::memcmp(every.data() + r * on.size(), on.data(), on.size() * sizeof(float)) == 0);
    // the blocking call may sum in another order (Open MPI's other algorithms): never mixed for
    // one reduction; printed for the record
    world->all_reduce(blocking.data(), blocking.size(), ReduceOp::Sum);
    if (me == 0)
        std::printf("blocking and posted all_reduce on 3 ranks: %s\n",
                    std::memcmp(on.data(), blocking.data(), on.size() * sizeof(float)) == 0 ? "bitwise equal" : "differ");

    // reduce_scatter_async and all_gather_async (also in place) against computed values
    const std::vector<size_t> counts = {3, 0, 5};
    std::vector<float> send(8), recv(8, -1.0f);
    for (size_t i = 0; i < 8; i++) send[i] = float(me * 10 + int(i));
    h = world->reduce_scatter_async(send.data(), recv.data(), counts);
    world->wait(h);
    const size_t off0 = me == 0 ? 0 : me == 1 ? 3 : 3;
    for (size_t i = 0; i < counts[size_t(me)]; i++) CHECK(recv[i] == float(30 + 3 * int(off0 + i)));
    std::vector<float> whole(8, -1.0f);
    for (size_t i = 0; i < counts[size_t(me)]; i++) whole[off0 + i] = float(100 * me + int(i));
    h = world->all_gather_async(whole.data() + off0, whole.data(), counts);  // in place
    world->wait(h);
    CHECK(whole == std::vector<float>{0, 1, 2, 200, 201, 202, 203, 204});

    // exchange_async around the ring
    std::vector<float> out = {float(me), float(me) + 0.5f}, in(2, -1.0f);
    h = world->exchange_async({{false, in.data(), 2, (me + P - 1) % P, 3}, {true, out.data(), 2, (me + 1) % P, 3}});
    world->wait(h);
    CHECK(in == std::vector<float>{float((me + P - 1) % P), float((me + P - 1) % P) + 0.5f});

    // the delay: a blocking call and a post waited at once take >= 100 ms, all of it counted as
    // communication (but the moments between the post, where the delay starts, and the wait's
    // timer: >= 90 ms); a post waited for after 150 ms of other work costs the wait nothing
    world->barrier();
    double c0 = comm_wait_ms();
    Clock::time_point t = Clock::now();
    double y = 1.0;
    world->all_reduce(&y, 1, ReduceOp::Sum);
    CHECK(ms_since(t) >= 100.0);
    CHECK(comm_wait_ms() - c0 >= 90.0);
    float z = 1.0f;
    c0 = comm_wait_ms();
    t = Clock::now();
    h = world->all_reduce_async(&z, 1, ReduceOp::Sum);
    world->wait(h);
    CHECK(ms_since(t) >= 100.0);
    CHECK(comm_wait_ms() - c0 >= 90.0);
    world->barrier();
    h = world->all_reduce_async(&z, 1, ReduceOp::Sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the computation
    c0 = comm_wait_ms();
    world->wait(h);
    CHECK(comm_wait_ms() - c0 < 50.0);
    CHECK(z == 9.0f);
}
