// The model's split over the process grid: for every layout, the ranks' primary pieces cover
// each element of the whole model (llm.c order) exactly once (what checkpoint assembly relies
// on), replicas sit where the split puts them, and the activation slots follow the schedule.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/train/layout.h"
#include "llmc/model/model.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/pipeline_schedule.h"

namespace {
ModelShape small_shape() { return ModelShape{4, 4, 32, 500, 512, 16}; }
}  // namespace

TEST_CASE("layout: primary pieces tile the whole model once, for every tp x pp x chunks", "[layout]") {
    const ModelShape s = small_shape();
    const size_t total = num_params(s);
    struct L {
        int tp, pp, v;
        bool sp;
    };
    for (L l : {L{1, 1, 1, false}, L{2, 1, 1, false}, L{4, 1, 1, true}, L{1, 2, 1, false}, L{1, 4, 1, false},
                L{2, 2, 2, false}, L{4, 2, 1, true}}) {
        INFO("tp " << l.tp << " pp " << l.pp << " v " << l.v);
        ParallelConfig pc;
        pc.tp = l.tp;
        pc.pp = l.pp;
        pc.pp_virtual = l.v;
        pc.sequence_parallel = l.sp;
        std::vector<int> owners(total, 0), holders(total, 0);
        for (int p = 0; p < l.pp; p++)
            for (int t = 0; t < l.tp; t++) {
                const ModelLayout lay = model_layout(s, pc, t, p);
                size_t n = 0;
                const std::vector<ParamSpec> table = param_table(s, lay, &n);
                size_t next = 0;
                for (const ParamSpec& sp : table) {
                    CHECK(sp.offset == next);  // contiguous, in table order
                    next += sp.numel;
                    size_t covered = 0;
                    for_each_run(sp, [&](size_t local, size_t llmc, size_t cnt) {
                        CHECK(local == covered);  // runs walk the local elements in order
                        covered += cnt;
                        for (size_t i = llmc; i < llmc + cnt; i++) {
                            holders[i]++;
                            if (sp.primary) owners[i]++;
                        }
                    });
                    CHECK(covered == sp.numel);
                }
                CHECK(next == n);
            }
        size_t bad_owner = 0, unheld = 0;
        for (size_t i = 0; i < total; i++) {
            bad_owner += owners[i] != 1;
            unheld += holders[i] < 1;
        }
        CHECK(bad_owner == 0);
        CHECK(unheld == 0);
        // replicas: LayerNorms etc. on every TP rank, wte on the first and the last stage
        const size_t C = size_t(s.d_model);
        CHECK(holders[0] == (l.pp > 1 ? 2 : 1));  // wte[0][0]: TP rank 0's rows, first and last stage
        const size_t lnfw = total - 2 * C;        // lnfw is the second-to-last tensor in llm.c order
        CHECK(holders[lnfw] == l.tp);
    }
}

TEST_CASE("layout: expert parallelism holds E/ep experts per rank, the primaries tile the model once", "[layout]") {
    ModelShape s = small_shape();
    s.moe.num_experts = 4;
    s.moe.top_k = 2;
    s.moe.expert_ffn_dim = 16;
    s.moe.every = 2;
    const size_t total = num_params(s);
    for (int ep : {1, 2, 4})
        for (int tp : {1, 2}) {
            INFO("ep " << ep << " tp " << tp);
            ParallelConfig pc;
            pc.tp = tp;
            pc.ep = ep;
            std::vector<int> owners(total, 0);
            for (int e = 0; e < ep; e++)
                for (int t = 0; t < tp; t++) {
                    const ModelLayout lay = model_layout(s, pc, t, 0, e);
                    size_t n = 0;
                    for (const ParamSpec& sp : param_table(s, lay, &n)) {
                        if (sp.expert >= 0) {
                            CHECK(sp.expert >= e * 4 / ep);
                            CHECK(sp.expert < (e + 1) * 4 / ep);
                        }
                        if (sp.primary)
                            for_each_run(sp, [&](size_t, size_t at, size_t cnt) {
                                for (size_t i = at; i < at + cnt; i++) owners[i]++;
                            });
                    }
                }
            size_t bad = 0;
            for (int o : owners) bad += o != 1;
            CHECK(bad == 0);
        }
}

TEST_CASE("layout: activation slots per chunk follow the schedule", "[layout]") {
    // 1F1B on 4 stages x 8 micro-batches: stage r keeps pp - r micro-batches in flight
    const PpSchedule s = make_pipeline_schedule(PpScheduleKind::OneFOneB, 4, 8, 1);
    for (int r = 0; r < 4; r++) CHECK(pipeline_slots(s[size_t(r)], 1) == std::vector<int>{4 - r});
    const PpSchedule g = make_pipeline_schedule(PpScheduleKind::GPipe, 2, 5, 1);
    CHECK(pipeline_slots(g[0], 1) == std::vector<int>{5});
    const PpSchedule one = make_pipeline_schedule(PpScheduleKind::OneFOneB, 1, 6, 1);
    CHECK(pipeline_slots(one[0], 1) == std::vector<int>{1});
}

TEST_CASE("layout: assemble_whole puts every element at its llm.c index, also into a buffer it reuses", "[layout]") {
    // one member (tp = pp = 1) over a group of one: local holds each element's own llm.c index,
    // so the whole model must come out as 0, 1, 2, ...; into a buffer that holds NaNs of the
    // right size (a save's buffer kept from the one before) and one of another size alike
    const ModelShape s = small_shape();
    ParallelConfig pc;
    const size_t pad = 8;
    size_t n = 0;
    const std::vector<ParamSpec> table = param_table(s, model_layout(s, pc, 0, 0), &n);
    std::vector<float> local((n + pad - 1) / pad * pad, -1.0f);
    for (const ParamSpec& p : table)
        for_each_run(p, [&](size_t loc, size_t dst, size_t cnt) {
            for (size_t k = 0; k < cnt; k++) local[p.offset + loc + k] = float(dst + k);
        });
    std::unique_ptr<Comm> self = make_self_comm(0);
    const size_t total = num_params(s);
    REQUIRE(total < (size_t(1) << 24));  // every index exact in a float
    std::vector<float> fresh = assemble_whole(s, pc, pad, local, *self);
    std::vector<float> reused(total, NAN), other(total / 3, NAN);
    assemble_whole(s, pc, pad, local, *self, reused);
    assemble_whole(s, pc, pad, local, *self, other);
    REQUIRE(fresh.size() == total);
    size_t wrong = 0;
    for (size_t i = 0; i < total; i++) wrong += fresh[i] != float(i);
    CHECK(wrong == 0);
    CHECK(reused == fresh);
    CHECK(other == fresh);
}

TEST_CASE("layout: file_order_map reads any window of the whole model from the mp group's pieces",
          "[layout]") {
    // every member's buffer holds each element's own llm.c index (replicas and the tied head copy
    // too; padding -1): a read of [first, first + n) must come out as first, first + 1, ...
    ModelShape moe = small_shape();
    moe.moe.num_experts = 4;
    moe.moe.top_k = 2;
    moe.moe.expert_ffn_dim = 16;
    moe.moe.every = 2;
    struct Case {
        ModelShape s;
        int tp, pp, ep;
    };
    for (const Case& c : {Case{small_shape(), 1, 1, 1}, Case{small_shape(), 2, 2, 1}, Case{small_shape(), 4, 1, 1},
                          Case{moe, 2, 1, 2}, Case{moe, 1, 2, 4}}) {
        INFO("tp " << c.tp << " pp " << c.pp << " ep " << c.ep);
        ParallelConfig pc;
        pc.tp = c.tp;
        pc.pp = c.pp;
        pc.ep = c.ep;
        const size_t pad = 8, total = num_params(c.s);
        REQUIRE(total < (size_t(1) << 24));  // every index exact in a float
        const FileOrderMap map = file_order_map(c.s, pc, pad);
        REQUIRE(int(map.counts.size()) == c.tp * c.pp * c.ep);
        std::vector<std::vector<float>> locals;
        for (int i = 0; i < c.tp * c.pp * c.ep; i++) {  // member i: tp_rank i % tp, ep_rank i / tp % ep, pp_rank i / (tp ep)
            size_t n = 0;
            const std::vector<ParamSpec> table =
                param_table(c.s, model_layout(c.s, pc, i % c.tp, i / (c.tp * c.ep), i / c.tp % c.ep), &n);
            std::vector<float> local((n + pad - 1) / pad * pad, -1.0f);
            CHECK(local.size() == map.counts[size_t(i)]);
            for (const ParamSpec& p : table)
                for_each_run(p, [&](size_t loc, size_t dst, size_t cnt) {
                    for (size_t k = 0; k < cnt; k++) local[p.offset + loc + k] = float(dst + k);
                });
            locals.push_back(std::move(local));
        }
        std::vector<const float*> members;
        for (const std::vector<float>& l : locals) members.push_back(l.data());
        const std::pair<size_t, size_t> windows[] = {{0, total}, {0, 1}, {total - 1, 1}, {total / 3, 1000},
                                                     {77, total / 2}, {total, 0}};
        for (const auto& w : windows) {
            std::vector<float> got(w.second, NAN);
            map.read(members, w.first, w.second, got.data());
            size_t wrong = 0;
            for (size_t k = 0; k < w.second; k++) wrong += got[k] != float(w.first + k);
            INFO("window [" << w.first << ", +" << w.second << ")");
            CHECK(wrong == 0);
        }
        // the runs: ascending, contiguous, joined where a member's buffer is contiguous too
        size_t at = 0;
        for (size_t k = 0; k < map.runs.size(); k++) {
            CHECK(map.runs[k].file == at);
            at += map.runs[k].n;
            const FileOrderMap::Run& r = map.runs[k];
            CHECK(r.at + r.n <= map.counts[size_t(r.member)]);
            if (k > 0) CHECK((map.runs[k - 1].member != r.member || map.runs[k - 1].at + map.runs[k - 1].n != r.at));
        }
        CHECK(at == total);
    }
}
