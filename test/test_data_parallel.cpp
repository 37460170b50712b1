// Process grid, ZeRO memory formulas, shard-aware loader positions and the one-process Comm.
// (The multi-process proofs are test/e2e/test_dp_*.sh under mpirun.)
#include <catch2/catch.hpp>

#include "llmc/comm.h"
#include "llmc/config.h"
#include "llmc/data_parallel.h"
#include "llmc/process_grid.h"

TEST_CASE("process grid: Megatron order, tp fastest, then dp, then pp", "[grid]") {
    // the layout is computed for tp/pp > 1 even though make_process_grid refuses them for now
    ProcessGrid g;
    g.world = 8, g.dp = 2, g.tp = 2, g.pp = 2;
    CHECK(g.world_rank_of(0, 1, 0) == 1);
    CHECK(g.world_rank_of(1, 0, 0) == 2);
    CHECK(g.world_rank_of(0, 0, 1) == 4);
    CHECK(g.tp_groups() == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    CHECK(g.dp_groups() == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(g.pp_groups() == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(g.mp_groups() == std::vector<std::vector<int>>{{0, 1, 4, 5}, {2, 3, 6, 7}});
    CHECK(g.embed_groups() == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    g.pp = 3;  // middle stages sit alone in their embedding group
    g.dp = 1;
    CHECK(g.embed_groups() == std::vector<std::vector<int>>{{0, 4}, {2}, {1, 5}, {3}});
}

TEST_CASE("process grid: dp auto and mismatches are user errors", "[grid]") {
    ParallelConfig pc;  // dp auto
    ProcessGrid g = make_process_grid(pc, 4, 3);
    CHECK(g.dp == 4);
    CHECK(g.dp_rank == 3);
    CHECK(g.dp_groups() == std::vector<std::vector<int>>{{0, 1, 2, 3}});
    pc.dp = 2;
    CHECK_THROWS_WITH(make_process_grid(pc, 3, 0), Catch::Contains("3 processes"));
    pc.dp = 0;
    pc.tp = 2;
    pc.pp = 2;
    CHECK_THROWS_WITH(make_process_grid(pc, 6, 0), Catch::Contains("parallel.tp * parallel.pp = 4"));
    g = make_process_grid(pc, 8, 5);
    CHECK((g.dp == 2 && g.tp_rank == 1 && g.dp_rank == 0 && g.pp_rank == 1));
}

TEST_CASE("config: parallel.dp takes an integer or \"auto\"", "[grid]") {
    ParallelConfig pc;
    CHECK(pc.dp == 0);  // auto
    CHECK(pc.zero == 0);
    CHECK(config_usage().find("parallel.dp") != std::string::npos);
    CHECK(config_usage().find("integer|auto") != std::string::npos);
}

TEST_CASE("ZeRO memory formulas per rank", "[zero]") {
    const size_t psi = 1024 * 8, bucket = 1000, act = 77;
    for (int dp : {1, 2, 4, 8})
        for (int zero : {0, 1, 2})
            for (bool master : {false, true}) {
                const size_t k = master ? 2 : 4, o = master ? 12 : 8;
                MemoryPlan m = zero_memory_plan(psi, dp, zero, k, master, bucket, act);
                CHECK(m.params == psi * k);
                CHECK(m.grads == (zero >= 2 ? psi / dp : psi) * k);
                CHECK(m.optimizer == (zero >= 1 ? psi / dp : psi) * o);
                CHECK(m.comm_buffers == (zero == 0 ? 1 : 2) * bucket * 4);
                CHECK(m.total() == m.params + m.grads + m.optimizer + m.comm_buffers + act);
            }
    CHECK(DataParallel::pad_multiple(4) % 4 == 0);
}

TEST_CASE("loader positions convert between dp layouts by data position", "[zero]") {
    LoaderPosition p;
    p.shard = 1, p.window = 10;
    LoaderPosition q = convert_loader_position(p, 4, 2, false);
    CHECK(q.window == 20);
    CHECK(q.shard == 1);
    CHECK(convert_loader_position(p, 4, 1, false).window == 40);
    CHECK(convert_loader_position(p, 4, 4, true) == p);
    CHECK_THROWS_WITH(convert_loader_position(p, 4, 3, false), Catch::Contains("parallel.dp=3"));
    CHECK_THROWS_WITH(convert_loader_position(p, 4, 2, true), Catch::Contains("data.shuffle"));
}

TEST_CASE("a group of one: collectives are copies", "[comm]") {
    std::unique_ptr<Comm> c = make_self_comm(0);
    CHECK(c->size() == 1);
    CHECK(c->rank() == 0);
    float a[3] = {1, 2, 3}, b[3] = {0, 0, 0};
    c->all_reduce(a, 3, ReduceOp::Sum);
    CHECK(a[2] == 3);
    c->reduce_scatter(a, b, {3});
    CHECK(b[1] == 2);
    c->all_gather(a, b, {3});
    CHECK(b[0] == 1);
    CHECK(count_offsets({2, 0, 3}) == std::vector<size_t>{0, 2, 2, 5});
}
