// Process grid, ZeRO memory formulas, shard-aware loader positions and the one-process Comm.
// (The multi-process proofs are test/e2e/test_dp_*.sh under mpirun.)
#include <catch2/catch.hpp>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/core/rng.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/layout.h"
#include "llmc/model/model.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/param_table.h"
#include "llmc/parallel/process_grid.h"

TEST_CASE("process grid: Megatron order, tp fastest, then cp, dp, pp", "[grid]") {
    ProcessGrid g({{2, 2, 1, 2}}, 5);  // pp 2 x dp 2 x cp 1 x tp 2, rank 5 = pp 1, dp 0, tp 1
    CHECK(g.world == 8);
    CHECK((g.pp_rank == 1 && g.dp_rank == 0 && g.cp_rank == 0 && g.tp_rank == 1));
    CHECK(g.world_rank_of({{0, 0, 0, 1}}) == 1);
    CHECK(g.world_rank_of({{0, 1, 0, 0}}) == 2);
    CHECK(g.world_rank_of({{1, 0, 0, 0}}) == 4);
    CHECK(g.groups({Axis::tp}) == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    CHECK(g.groups({Axis::dp}) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(g.groups({Axis::pp}) == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(g.groups({Axis::pp, Axis::tp}) == std::vector<std::vector<int>>{{0, 1, 4, 5}, {2, 3, 6, 7}});
    CHECK(g.groups({Axis::pp, Axis::dp, Axis::cp, Axis::tp}) == std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7}});
    CHECK(g.groups({}) == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
    CHECK(g.embed_groups() == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    ProcessGrid g3({{3, 1, 1, 2}}, 0);  // middle stages sit alone in their embedding group
    CHECK(g3.embed_groups() == std::vector<std::vector<int>>{{0, 4}, {2}, {1, 5}, {3}});
}

TEST_CASE("process grid: expert parallelism splits dp into ep groups of consecutive ranks", "[grid]") {
    // pp 2 x dp 4 x cp 1 x tp 2 = 16 ranks, ep 2; rank 13 = pp 1, dp 2, tp 1: ep_rank 0, edp_rank 1
    ProcessGrid g({{2, 4, 1, 2}}, 13, 2);
    CHECK((g.dp_rank == 2 && g.ep_rank() == 0 && g.edp() == 2 && g.edp_rank() == 1));
    CHECK((g.shard_size() == 2 && g.shard_rank() == 1));
    // ep groups: dp ranks {0, 1} and {2, 3} of each (pp, tp); expert-dp: dp ranks {0, 2} and {1, 3}
    CHECK(g.ep_groups() == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14},
                                                         {13, 15}});
    CHECK(g.expert_dp_groups() == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13},
                                                                {10, 14}, {11, 15}});
    // one copy of the model: pp x ep x tp ranks of one edp_rank, member i = (pp i / 4, ep i / 2 % 2, tp i % 2)
    CHECK(g.model_groups() == std::vector<std::vector<int>>{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}});
    // ep 1: the model groups are the pp x tp groups, the shard group dp x cp
    ProcessGrid one({{2, 4, 1, 2}}, 13);
    CHECK(one.model_groups() == one.groups({Axis::pp, Axis::tp}));
    CHECK((one.shard_size() == 4 && one.shard_rank() == 2));
}

TEST_CASE("process grid: with context parallelism, ep splits the dp x cp slice", "[grid]") {
    // dp 2 x cp 2 = 4 ranks, ep 2: the slice's members 0-3 are world ranks 0-3 (dp-major), so an
    // ep group is the cp pair of one dp rank and the expert-dp groups the dp ranks of one cp rank
    ProcessGrid g({{1, 2, 2, 1}}, 2, 2);  // dp 1, cp 0: slice member 2
    CHECK((g.ep_rank() == 0 && g.edp() == 2 && g.edp_rank() == 1 && g.shard_size() == 2 && g.shard_rank() == 1));
    CHECK(g.ep_groups() == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    CHECK(g.expert_dp_groups() == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
    CHECK(g.model_groups() == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    // dp 2 x cp 2 x tp 2, ep 4: the ep group spans both dp and cp ranks of one tp rank; one expert-dp
    // rank, so every rank owns its experts alone; one copy of the model on all 8 ranks
    ProcessGrid h({{1, 2, 2, 2}}, 5, 4);  // dp 1, cp 0, tp 1: slice member 2
    CHECK((h.ep_rank() == 2 && h.edp() == 1 && h.edp_rank() == 0));
    CHECK(h.ep_groups() == std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}});
    CHECK(h.expert_dp_groups() == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
    CHECK(h.model_groups() == std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7}});
}

TEST_CASE("process grid: a context-parallel axis sits between dp and tp", "[grid]") {
    // pp 2 x dp 2 x cp 2 x tp 2 = 16 ranks; rank 13 = 0b1101 = pp 1, dp 1, cp 0, tp 1
    ProcessGrid g({{2, 2, 2, 2}}, 13);
    CHECK((g.pp_rank == 1 && g.dp_rank == 1 && g.cp_rank == 0 && g.tp_rank == 1));
    CHECK(g.groups({Axis::cp})[0] == std::vector<int>{0, 2});
    CHECK(g.groups({Axis::dp})[0] == std::vector<int>{0, 4});
    CHECK(g.groups({Axis::dp, Axis::cp})[1] == std::vector<int>{1, 3, 5, 7});  // gradients reduce over dp x cp
    CHECK(g.groups({Axis::tp}).size() == 8);
    for (const auto& group : g.groups({Axis::pp, Axis::tp})) CHECK(group.size() == 4);
    CHECK(g.describe() == "dp 2 x cp 2 x tp 2 x pp 2");
    // every partition covers each rank once
    for (auto axes : {std::vector<Axis>{Axis::dp}, {Axis::cp, Axis::tp}, {Axis::pp, Axis::cp}}) {
        std::vector<int> seen(16, 0);
        for (const auto& group : g.groups(axes))
            for (int r : group) seen[size_t(r)]++;
        CHECK(seen == std::vector<int>(16, 1));
    }
}

TEST_CASE("process grid: dp auto and mismatches are user errors", "[grid]") {
    ParallelConfig pc;  // dp auto
    ProcessGrid g = make_process_grid(pc, 4, 3);
    CHECK(g.dp == 4);
    CHECK(g.dp_rank == 3);
    CHECK(g.groups({Axis::dp}) == std::vector<std::vector<int>>{{0, 1, 2, 3}});
    pc.dp = 2;
    CHECK_THROWS_WITH(make_process_grid(pc, 3, 0), Catch::Contains("3 processes"));
    pc.dp = 0;
    pc.tp = 2;
    pc.pp = 2;
    CHECK_THROWS_WITH(make_process_grid(pc, 6, 0), Catch::Contains("parallel.tp * parallel.pp = 4"));
    g = make_process_grid(pc, 8, 5);
    CHECK((g.dp == 2 && g.tp_rank == 1 && g.dp_rank == 0 && g.pp_rank == 1));
    // context parallelism: dp auto leaves world / (tp * pp * cp); gradients reduce over dp x cp
    pc.pp = 1;
    pc.cp = 2;
    g = make_process_grid(pc, 8, 6);  // rank 6 = dp 1, cp 1, tp 0
    CHECK((g.dp == 2 && g.cp == 2 && g.dp_rank == 1 && g.cp_rank == 1 && g.tp_rank == 0));
    CHECK((g.dp_cp() == 4 && g.dp_cp_rank() == 3));
    CHECK_THROWS_WITH(make_process_grid(pc, 6, 0), Catch::Contains("parallel.tp * parallel.pp * parallel.cp = 4"));
    pc.dp = 1;
    CHECK_THROWS_WITH(make_process_grid(pc, 8, 0),
                      Catch::Contains("parallel.dp * parallel.cp * parallel.tp * parallel.pp = 1 x 2 x 2 x 1 = 4"));
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
    const UnitSizes u{300, 20, 100};
    for (int dp : {1, 2, 4, 8})
        for (int zero : {0, 1, 2, 3})
            for (bool master : {false, true}) {
                const size_t k = master ? 2 : 4, o = master ? 12 : 8;
                MemoryPlan m = zero_memory_plan(psi, dp, zero, k, master, bucket, act, u);
                CHECK(m.params == (zero >= 3 ? psi / dp : psi) * k);
                CHECK(m.grads == (zero >= 2 ? psi / dp : psi) * k);
                CHECK(m.optimizer == (zero >= 1 ? psi / dp : psi) * o);
                CHECK(m.comm_buffers == (zero == 0 ? 1 : 2) * bucket * 4);
                // ZeRO-3 gathers the embedding, the head and two layers (current and prefetched);
                // ZeRO-2/3 keep the embedding's and head's gradients for the step and one layer's
                CHECK(m.unit_params == (zero >= 3 ? (300 + 20 + 2 * 100) * k : 0));
                CHECK(m.unit_grads == (zero >= 2 ? (300 + 20 + 100) * k : 0));
                CHECK(m.total() ==
                      m.params + m.grads + m.optimizer + m.comm_buffers + act + m.unit_params + m.unit_grads);
                CHECK(m.host == 0);
                // offloaded: no optimizer on the device; on the host the state and three staging
                // slots of a piece (a bucket, at most the range) of gradients and parameters in the
                // model's dtype, plus a piece of fp32 gradients for bf16
                const size_t range = zero >= 1 ? psi / dp : psi, piece = std::min(range, bucket);
                MemoryPlan off = zero_memory_plan(psi, dp, zero, k, master, bucket, act, u, true);
                CHECK(off.optimizer == 0);
                CHECK(off.host == range * o + 3 * 2 * piece * k + (master ? piece * 4 : 0));
                CHECK(off.total() == m.total() - m.optimizer);
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

TEST_CASE("model units: the embedding, each layer and the head tile the flat buffer", "[zero]") {
    const ModelShape s{4, 4, 32, 500, 512, 16};
    for (int pp_rank = 0; pp_rank < 3; pp_rank++) {
        // stage 0 holds layers 0 and 3 (the first and the last chunk), stage 1 layer 1, stage 2 layer 2
        // and the head (with the tied copy of wte)
        ModelLayout lay;
        if (pp_rank == 0) lay.chunks = {{0, 1}, {3, 4}};
        if (pp_rank == 1) lay.chunks = {{1, 2}}, lay.first = false, lay.last = false;
        if (pp_rank == 2) lay.chunks = {{2, 3}}, lay.first = false;
        INFO("stage " << pp_rank);
        const ParamLayout m = param_layout(s, lay, 256);
        size_t next = 0;
        int embeddings = 0, heads = 0, layers = 0;
        for (const ParamUnit& u : m.units) {
            CHECK(u.begin == next);
            next = u.end;
            embeddings += u.kind == ParamUnit::Embedding;
            heads += u.kind == ParamUnit::Head;
            layers += u.kind == ParamUnit::Layer;
        }
        CHECK(next == m.padded_params);
        CHECK(embeddings == (lay.first ? 1 : 0));
        CHECK(heads == (lay.last ? 1 : 0));
        int held = 0;
        for (const auto& c : lay.chunks) held += c.second - c.first;
        CHECK(layers == held);
        for (const ParamSpec& p : m.specs) {
            const ParamUnit& u = m.units[size_t(m.unit_of(p))];
            CHECK((p.offset >= u.begin && p.offset + p.numel <= u.end));
            CHECK(u.layer == p.layer);
        }
    }
}

// dp = 1 over a group of one: every ZeRO stage trains bitwise like the plain model (one
// micro-step: the unit reduce-scatters are copies into a zeroed shard, the gathers copies of it),
// which runs the ParamStore paths (acquire/release per unit, prefetch, the step-long units),
// with the staging buffers in backend memory and through host arrays alike, and with the
// optimizer offloaded (streamed in pieces of 97 elements: pieces cut through tensors, the last
// one short), its moments bitwise those of the optimizer on the backend.
TEST_CASE("ZeRO stages over one rank train bitwise like the plain model", "[zero]") {
    auto ops = make_cpu_ops();
    const ModelShape s{2, 2, 32, 200, 256, 16};
    const int B = 2, T = 8;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; i++) x[size_t(i)] = (i * 37) % 200, y[size_t(i)] = (i * 53 + 7) % 200;
    std::vector<std::vector<float>> finals, moments;
    std::vector<float> losses;
    const int runs = 12;
    for (int run = 0; run < runs; run++) {
        const int zero = run % 4;
        const bool host_staging = run / 4 == 1, offload = run / 4 == 2;
        INFO("zero " << zero << (host_staging ? ", host staging" : "") << (offload ? ", optimizer offload" : ""));
        std::unique_ptr<Comm> self = make_self_comm(0);
        const ParamLayout params = param_layout(s, ModelLayout(), DataParallel::pad_multiple(1));
        // 262-element pieces: units cross several
        DataParallel dp(params, *ops, DType::F32, *self, zero, 0.001, host_staging);
        Model m(s, *ops, DType::F32, B, T, dp.param_store());
        m.init_random(7);
        AdamW opt(params, *ops, dp.opt_begin(), dp.opt_end(), dp.opt_params(), dp.opt_grads(), OptimizerOffload{offload, 97});
        CHECK(opt.offloaded() == offload);
        CHECK(opt.device_bytes() == (offload ? 0 : params.padded_params * 8));
        CHECK(opt.host_bytes() == (offload ? params.padded_params * 8 + 3 * 2 * 97 * 4 : 0));
        for (int step = 1; step <= 3; step++) {
            m.zero_grads();
            losses.push_back(m.forward(x.data(), y.data(), B, T, 1.0f / (B * T)));
            m.backward(dp.grads_ready());
            dp.finish_grad_sync();
            const double norm = dp.grad_norm();
            opt.step(AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, step, clip_scale(norm, 1.0), 0u);
            dp.after_update();
        }
        finals.push_back(dp.gather_params());
        CHECK(finals.back().size() == params.padded_params);
        OptimizerState st = dp.gather_optimizer_state(opt);
        CHECK(st.m.size() == params.padded_params);
        CHECK(st.master.empty());  // (fp32: no master weights)
        OptimizerState weights;  // a save of the final weights alone: no moments gathered
        dp.gather_optimizer_state(opt, weights, true);
        CHECK((weights.m.empty() && weights.v.empty() && weights.master.empty()));
        st.m.insert(st.m.end(), st.v.begin(), st.v.end());
        moments.push_back(st.m);
    }
    for (int run = 1; run < runs; run++) {
        INFO("run " << run);
        CHECK(finals[size_t(run)] == finals[0]);
        CHECK(moments[size_t(run)] == moments[0]);
        for (int i = 0; i < 3; i++) CHECK(losses[size_t(run * 3 + i)] == losses[size_t(i)]);
    }
}

namespace {
// Views of whole buffers, like WholeStore, that check the model's calls: a unit is acquired
// before use and released after, once at a time (the model counts its own nested uses).
struct CheckingStore : ParamStore {
    CheckingStore(Ops& ops, const ParamLayout& layout)
        : whole(ops, layout, DType::F32), held(2, std::vector<int>(layout.units.size(), 0)) {}
    WholeStore whole;
    std::vector<std::vector<int>> held;  // [params, grads][unit]: 1 while acquired
    int acquires = 0, releases = 0;
    const ParamLayout& layout() const override { return whole.layout(); }
    Tensor acquire_params(int u) override { return take(0, u), whole.acquire_params(u); }
    void release_params(int u) override { give(0, u); }
    void prefetch_params(int) override {}
    void load_params(const float* mem) override { whole.load_params(mem); }
    Tensor acquire_grads(int u) override { return take(1, u), whole.acquire_grads(u); }
    void release_grads(int u) override { give(1, u); }
    void zero_grads() override { whole.zero_grads(); }
    void take(int k, int u) {
        CHECK(held[size_t(k)][size_t(u)]++ == 0);
        acquires++;
    }
    void give(int k, int u) {
        CHECK(held[size_t(k)][size_t(u)]-- == 1);
        releases++;
    }
    bool idle() const {
        for (const auto& h : held)
            for (int n : h)
                if (n != 0) return false;
        return true;
    }
};
}  // namespace

// The model never asks where its parameters live: built on any store it reaches every tensor
// through acquire/release of its unit, holds nothing between passes, and trains bitwise alike.
TEST_CASE("the model reaches parameters and gradients only through its store", "[zero]") {
    auto ops = make_cpu_ops();
    const ModelShape s{2, 2, 32, 200, 256, 16};
    const int B = 2, T = 8;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; i++) x[size_t(i)] = (i * 37) % 200, y[size_t(i)] = (i * 53 + 7) % 200;
    const ParamLayout layout = param_layout(s, ModelLayout(), 1);
    WholeStore plain(*ops, layout, DType::F32);
    CheckingStore checking(*ops, layout);
    Model a(s, *ops, DType::F32, B, T, plain), b(s, *ops, DType::F32, B, T, checking);
    a.init_random(7);
    b.init_random(7);
    for (int step = 0; step < 2; step++) {
        a.zero_grads();
        b.zero_grads();
        const float la = a.forward(x.data(), y.data(), B, T, 1.0f / (B * T));
        CHECK(b.forward(x.data(), y.data(), B, T, 1.0f / (B * T)) == la);
        CHECK(checking.idle());
        a.backward();
        b.backward();
        CHECK(checking.idle());
    }
    // per step, forward: the embedding, 2 layers, the head and its tied weight (5); backward: the
    // head's and the tied weight's parameters and gradients, each layer's, the embedding's gradient (9)
    CHECK(checking.acquires == 2 * (5 + 9));
    CHECK(checking.releases == checking.acquires);
    std::vector<float> ga(layout.total_params), gb(layout.total_params);
    a.get_grads_whole(ga.data());
    b.get_grads_whole(gb.data());
    CHECK(ga == gb);
}

namespace {
ModelShape moe_shape() {
    ModelShape s{4, 4, 32, 500, 512, 16};
    s.moe.num_experts = 4;
    s.moe.top_k = 2;
    s.moe.expert_ffn_dim = 16;
    s.moe.every = 2;
    return s;
}
}  // namespace

// Expert parallelism with ZeRO >= 1: of the padded buffer, every dense element's optimizer state
// is owned by exactly one of the dp = edp x ep ranks, and every expert element of ep rank e's
// layout by exactly one expert-dp rank (of those with ep_rank e); each rank owns within its
// shard: the shard's expert elements and its part of the dense ones (the parts differ by at most
// one element). Counted element by element from the parameter table, not from the runs' code.
TEST_CASE("ZeRO under expert parallelism: each dense element owned once over dp, each expert once over edp",
          "[ep][zero]") {
    const ModelShape s = moe_shape();
    for (int ep : {2, 4})
        for (int edp : {1, 2, 3}) {
            INFO("ep " << ep << " edp " << edp);
            ParallelConfig pc;
            pc.ep = ep;
            std::vector<ParamLayout> layouts;
            for (int e = 0; e < ep; e++)
                layouts.push_back(param_layout(s, model_layout(s, pc, 0, 0, e), DataParallel::pad_multiple(edp)));
            const size_t padded = layouts[0].padded_params, shard = padded / size_t(edp);
            std::vector<char> expert(padded, 0);  // 1: an expert element (at the same offsets on every ep rank)
            for (const ParamSpec& p : layouts[0].specs)
                if (p.expert >= 0) std::fill(expert.begin() + long(p.offset), expert.begin() + long(p.offset + p.numel), 1);
            size_t experts = 0;
            for (char c : expert) experts += size_t(c);
            CHECK(experts > 0);
            CHECK(experts < padded);
            size_t most = 0;  // the largest rank's count
            std::vector<int> dense_owners(padded, 0);
            std::vector<std::vector<int>> expert_owners(size_t(ep), std::vector<int>(padded, 0));
            for (int j = 0; j < edp; j++) {
                size_t shard_dense = 0, shard_experts = 0;
                for (size_t i = size_t(j) * shard; i < size_t(j + 1) * shard; i++) (expert[i] ? shard_experts : shard_dense)++;
                for (int e = 0; e < ep; e++) {
                    const auto runs = zero_optimizer_runs(layouts[size_t(e)], edp, j, ep, e);
                    CHECK(runs == zero_optimizer_runs(layouts[0], edp, j, ep, e));  // alike on every ep layout
                    size_t owned = 0, at = 0;
                    for (const auto& r : runs) {
                        CHECK(r.first >= std::max(at, size_t(j) * shard));  // ascending, disjoint, in the shard
                        CHECK(r.first < r.second);
                        CHECK(r.second <= size_t(j + 1) * shard);
                        at = r.second + 1;  // merged where adjacent
                        owned += r.second - r.first;
                        for (size_t i = r.first; i < r.second; i++) {
                            if (expert[i]) expert_owners[size_t(e)][i]++;
                            else dense_owners[i]++;
                        }
                    }
                    CHECK(runs_numel(runs) == owned);
                    most = std::max(most, owned);
                    const size_t part = owned - shard_experts;  // its dense part: nd / ep, rounded either way
                    CHECK(part >= shard_dense / size_t(ep));
                    CHECK(part <= (shard_dense + size_t(ep) - 1) / size_t(ep));
                }
            }
            size_t bad = 0;
            for (size_t i = 0; i < padded; i++) {
                if (expert[i])
                    for (int e = 0; e < ep; e++) bad += expert_owners[size_t(e)][i] != 1;
                else bad += dense_owners[i] != 1;
            }
            CHECK(bad == 0);
            CHECK(zero_optimizer_most(layouts[0], edp, ep) == most);
        }
}

// AdamW over owned runs: ranks that own disjoint runs covering the buffer, each with its state
// packed, update every element bitwise as one AdamW over all of it (the update is elementwise),
// offloaded too (pieces of 97 elements cut per run); the state is the owned elements only. And a
// bf16 model through the offloaded host update (the CUDA kernel's stochastic rounding): the runs
// cut tensors, and every element still gets the random bits it gets in one range.
TEST_CASE("AdamW over runs of its range updates bitwise as over the whole range", "[ep][zero]") {
    auto ops = make_cpu_ops();
    const ModelShape s = moe_shape();
    ParallelConfig pc;
    pc.ep = 2;
    const ParamLayout layout = param_layout(s, model_layout(s, pc, 0, 0, 1), DataParallel::pad_multiple(2));
    const size_t n = layout.padded_params;
    std::vector<float> p0(n), g(n);
    for (size_t i = 0; i < n; i++) p0[i] = 0.01f * float(int(i * 7919 % 201) - 100), g[i] = 1e-3f * float(int(i * 104729 % 97) - 48);
    auto buffer = [&](const std::vector<float>& x, DType dt) {
        Tensor t(ops->alloc(n * dtype_size(dt)), n, dt);
        ops->from_host_f32(t, x.data());
        return t;
    };
    auto run = [&](const std::vector<AdamW::Runs>& owners, bool offload, DType dt) {
        Tensor params = buffer(p0, dt), grads = buffer(g, dt);
        std::vector<std::unique_ptr<AdamW>> opts;
        size_t state = 0;
        for (const AdamW::Runs& r : owners) {
            opts.emplace_back(new AdamW(layout, *ops, 0, n, params, grads, OptimizerOffload{offload, 97}, r));
            state += opts.back()->owned();
            CHECK(opts.back()->device_bytes() == (offload ? 0 : opts.back()->owned() * 8));
        }
        CHECK(state == n);
        for (int t = 1; t <= 3; t++)
            for (auto& o : opts) o->step(AdamWHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, t, 0.5f, 77u + uint32_t(t));
        std::vector<float> out(n);
        ops->to_host_f32(out.data(), params);
        ops->release(params.ptr);
        ops->release(grads.ptr);
        return out;
    };
    const std::vector<float> whole = run({AdamW::Runs()}, false, DType::F32);
    CHECK(whole != p0);
    // two owners, cuts through tensors: [0, a) + [b, c), [a, b) + [c, n)
    const size_t a = n / 5 + 3, b = n / 2 + 11, c = 4 * n / 5 + 1;
    const std::vector<AdamW::Runs> split = {{{0, a}, {b, c}}, {{a, b}, {c, n}}};
    CHECK(run(split, false, DType::F32) == whole);
    CHECK(run(split, true, DType::F32) == whole);
    const std::vector<float> bf16 = run({AdamW::Runs()}, true, DType::BF16);
    CHECK(bf16 != whole);
    CHECK(run(split, true, DType::BF16) == bf16);
}

// Model::init_random draws each tensor whole from its own streams (Rng(seed, stream * 1000003 +
// chunk), a chunk 2^20 elements), the first tensor, wte, on stream 0; the vocabulary's padding rows
// stay zero. Its buffers' pages are first touched by every thread (zeroed_floats, parallel_copy):
// those two against memset and memcpy, past their one-thread threshold and with an odd length.
TEST_CASE("init_random draws wte from stream 0 and leaves the vocabulary padding zero", "[memory]") {
    auto ops = make_cpu_ops();
    const ModelShape s{2, 2, 32, 200, 256, 16};
    const ParamLayout layout = param_layout(s, ModelLayout(), 1);
    WholeStore store(*ops, layout, DType::F32);
    Model m(s, *ops, DType::F32, 2, 8, store);
    m.init_random(7);
    std::vector<float> w(layout.total_params);
    m.get_params_whole(w.data());
    const TensorDecl wte = model_tensors(s)[0];
    REQUIRE(wte.rows == 256);
    REQUIRE(wte.init_rows == 200);
    Rng rng(7, 0);
    size_t differ = 0, nonzero = 0;
    for (size_t i = 0; i < wte.init_rows * wte.cols; i++) differ += w[i] != wte.init_std * rng.normal();
    for (size_t i = wte.init_rows * wte.cols; i < wte.rows * wte.cols; i++) nonzero += w[i] != 0.0f;
    CHECK(differ == 0);
    CHECK(nonzero == 0);

    const size_t n = (size_t(20) << 20) / 4 + 3;  // past the 16 MiB threshold, not a multiple of 64 bytes
    std::unique_ptr<float[]> z = zeroed_floats(n);
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += z[i] == 0.0f;
    CHECK(zeros == n);
    std::vector<char> src(n * 4 + 7), dst(src.size(), 0);
    for (size_t i = 0; i < src.size(); i++) src[i] = char(i * 131 + 7);
    parallel_copy(dst.data(), src.data(), src.size());
    CHECK(dst == src);
}
