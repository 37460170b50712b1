// Pipeline schedules: layer split, the action lists of GPipe / 1F1B / interleaved 1F1B, and the
// rendezvous checker and timing simulator that prove them. Expected bubbles and memory come from
// the textbook formulas written out here, not from the code under test; the negative cases break
// valid lists in the ways an engine author could, and show the checker notices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/config.h"
#include "llmc/parallel/pipeline_schedule.h"

using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const UserError& e) {
        return e.what();
    }
    return "";
}

// "F0.1 B0.1 ..." : the compute actions of one rank, micro.chunk, communication left out.
std::string computes(const std::vector<PpAction>& list) {
    std::string s;
    for (const PpAction& a : list) {
        if (a.op != PpOp::Forward && a.op != PpOp::Backward) continue;
        s += (s.empty() ? "" : " ") + std::string(a.op == PpOp::Forward ? "F" : "B") + std::to_string(a.micro) +
             "." + std::to_string(a.chunk);
    }
    return s;
}

// Position of the first action on `list` satisfying `pred`.
size_t find_action(const std::vector<PpAction>& list, const std::function<bool(const PpAction&)>& pred) {
    for (size_t i = 0; i < list.size(); i++)
        if (pred(list[i])) return i;
    FAIL("no such action");
    return 0;
}

bool has_transfer(const PpAction& a, bool is_send, PpPayload payload, int micro) {
    for (const PpTransfer& t : a.transfers)
        if (t.is_send == is_send && t.payload == payload && t.micro == micro) return true;
    return false;
}

bool is_compute(const PpAction& a, PpOp op, int micro, int chunk) {
    return a.op == op && a.micro == micro && a.chunk == chunk;
}

struct Case {
    PpScheduleKind kind;
    int pp, m, v;
};

// Every valid (kind, pp, m, v) with pp in 1..8, m in 1..16, v in 1..4 (v > 1 only interleaved,
// interleaved needs m % pp == 0). pp == 1 with v > 1 is included: the schedule is defined with
// local hand-offs even though validate_pipeline refuses it for training.
std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 16; m++) {
            cases.push_back({PpScheduleKind::GPipe, pp, m, 1});
            cases.push_back({PpScheduleKind::OneFOneB, pp, m, 1});
            if (m % pp == 0)
                for (int v = 1; v <= 4; v++) cases.push_back({PpScheduleKind::Interleaved, pp, m, v});
        }
    return cases;
}

// Peak (micro, chunk) pairs in flight on rank r, derived from the schedule definitions:
//  - gpipe: every forward precedes every backward, so all m at once (one stage: plain F, B).
//  - 1f1b: pp-r-1 warm-up forwards (at most m), then one more forward before the first backward,
//    after which each forward is followed by a backward: min(pp - r, m).
//  - interleaved (Megatron): W_r = (v-1)*pp + 2*(pp-1-r) warm-up forwards, plus the steady state's
//    forward before its first backward: W_r + 1 (m >= 2 pp guarantees a steady state, since
//    W_0 = v*pp + pp - 2 < v*m). With m == pp all v*m forwards run first. One stage, one chunk: 1.
int expected_peak(const Case& c, int r) {
    if (c.pp == 1 && c.v == 1) return 1;
    switch (c.kind) {
        case PpScheduleKind::GPipe: return c.m;
        case PpScheduleKind::OneFOneB: return std::min(c.pp - r, c.m);
        case PpScheduleKind::Interleaved:
            if (c.m == c.pp) return c.v * c.m;
            return (c.v - 1) * c.pp + 2 * (c.pp - 1 - r) + 1;
    }
    return -1;
}

}  // namespace

TEST_CASE("every schedule passes the rendezvous checker", "[pipeline]") {
    int n = 0;
    for (const Case& c : all_cases()) {
        INFO(pp_schedule_name(c.kind) << " pp " << c.pp << " m " << c.m << " v " << c.v);
        PpSchedule s = make_pipeline_schedule(c.kind, c.pp, c.m, c.v);
        REQUIRE((int)s.size() == c.pp);
        CHECK(check_pipeline_schedule(s, c.pp, c.m, c.v) == "");
        for (const auto& list : s)
            for (const PpAction& a : list) {
                if (a.op == PpOp::Send || a.op == PpOp::Recv) CHECK(a.transfers.size() == 1);
                // Megatron's exchange: at most one activation and one gradient each way.
                if (a.op == PpOp::SendRecv) CHECK((a.transfers.size() >= 2 && a.transfers.size() <= 4));
            }
        n++;
    }
    CHECK(n == 2 * 128 + 4 * (16 + 8 + 5 + 4 + 3 + 2 + 2 + 2));  // 424 schedules
}

TEST_CASE("bubble: idle fraction (p-1)/(m+p-1), (p-1)/(v*m+p-1) interleaved", "[pipeline]") {
    // Whole-stage times (t_forward, t_backward): backward twice the forward (a GPT-2 layer's
    // matmuls), equal, and the reverse, to show no schedule depends on one ratio.
    const double times[][2] = {{1.0, 2.0}, {1.0, 1.0}, {2.0, 1.0}};
    for (const Case& c : all_cases()) {
        PpSchedule s = make_pipeline_schedule(c.kind, c.pp, c.m, c.v);
        REQUIRE(check_pipeline_schedule(s, c.pp, c.m, c.v) == "");  // the simulator asserts it
        const int vv = c.kind == PpScheduleKind::Interleaved ? c.v : 1;
        for (const auto& t : times) {
            INFO(pp_schedule_name(c.kind) << " pp " << c.pp << " m " << c.m << " v " << c.v << " tf " << t[0]
                                          << " tb " << t[1]);
            PipelineStats st = simulate_pipeline(s, c.pp, c.m, c.v, t[0], t[1]);
            // Every rank computes m micro-batches through its whole stage; the bubble is p-1 chunk
            // forward-backward times: the first rank's last backward waits for p-1 later ranks, and
            // the last rank's first forward for p-1 earlier ones.
            const double makespan = (c.m + (c.pp - 1.0) / vv) * (t[0] + t[1]);
            CHECK(st.makespan == Approx(makespan).epsilon(1e-12));
            CHECK(st.idle_fraction_total == Approx((c.pp - 1.0) / (vv * c.m + c.pp - 1.0)).margin(1e-12));
            for (int r = 0; r < c.pp; r++) CHECK(st.busy[r] == Approx(c.m * (t[0] + t[1])).epsilon(1e-12));
        }
    }
    // The numbers of the usual example: 4 stages, 8 micro-batches.
    PipelineStats st = simulate_pipeline(make_pipeline_schedule(PpScheduleKind::OneFOneB, 4, 8, 1), 4, 8, 1, 1, 2);
    CHECK(st.makespan == Approx(33.0));
    CHECK(st.idle_fraction_total == Approx(3.0 / 11.0));
    CHECK(st.idle_fraction[0] == Approx(1.0 - 24.0 / 33.0));
    st = simulate_pipeline(make_pipeline_schedule(PpScheduleKind::Interleaved, 4, 8, 2), 4, 8, 2, 1, 2);
    CHECK(st.makespan == Approx(24.0 + 4.5));
    CHECK(st.idle_fraction_total == Approx(3.0 / 19.0));
}

TEST_CASE("activation memory: peak micro-batches in flight per rank", "[pipeline]") {
    for (const Case& c : all_cases()) {
        INFO(pp_schedule_name(c.kind) << " pp " << c.pp << " m " << c.m << " v " << c.v);
        PpSchedule s = make_pipeline_schedule(c.kind, c.pp, c.m, c.v);
        REQUIRE(check_pipeline_schedule(s, c.pp, c.m, c.v) == "");
        PipelineStats st = simulate_pipeline(s, c.pp, c.m, c.v, 1, 2);
        for (int r = 0; r < c.pp; r++) {
            INFO("rank " << r);
            CHECK(st.peak_in_flight[r] == expected_peak(c, r));
            // Just-in-time receives hold one tensor until the next compute. Megatron's exchange can
            // receive an activation and a gradient at once, each consumed in the next tick.
            if (c.pp == 1) CHECK(st.peak_buffered[r] == 0);
            else if (c.kind == PpScheduleKind::Interleaved && c.m != c.pp) CHECK(st.peak_buffered[r] <= 2);
            else CHECK(st.peak_buffered[r] == 1);
        }
    }
    // 1F1B: the first stage holds pp micro-batches, GPipe all m.
    CHECK(simulate_pipeline(make_pipeline_schedule(PpScheduleKind::OneFOneB, 4, 8, 1), 4, 8, 1, 1, 2).peak_in_flight ==
          std::vector<int>{4, 3, 2, 1});
    CHECK(simulate_pipeline(make_pipeline_schedule(PpScheduleKind::GPipe, 4, 8, 1), 4, 8, 1, 1, 2).peak_in_flight ==
          std::vector<int>{8, 8, 8, 8});
    CHECK(simulate_pipeline(make_pipeline_schedule(PpScheduleKind::Interleaved, 4, 8, 2), 4, 8, 2, 1, 2)
              .peak_in_flight == std::vector<int>{11, 9, 7, 5});
}

TEST_CASE("one stage runs Forward, Backward alternately for every schedule", "[pipeline]") {
    for (PpScheduleKind kind : {PpScheduleKind::GPipe, PpScheduleKind::OneFOneB, PpScheduleKind::Interleaved}) {
        INFO(pp_schedule_name(kind));
        PpSchedule s = make_pipeline_schedule(kind, 1, 3, 1);
        REQUIRE(s.size() == 1);
        REQUIRE(s[0].size() == 6);  // no communication at all
        CHECK(computes(s[0]) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
    }
}

TEST_CASE("schedule shapes: 1F1B warm-up, interleaved order, GPipe phases", "[pipeline]") {
    PpSchedule s = make_pipeline_schedule(PpScheduleKind::OneFOneB, 4, 6, 1);
    CHECK(computes(s[0]) == "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");  // 3 warm-up
    CHECK(computes(s[2]) == "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 F4.0 B3.0 F5.0 B4.0 B5.0");  // 1 warm-up
    CHECK(computes(s[3]) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
    s = make_pipeline_schedule(PpScheduleKind::GPipe, 2, 3, 1);
    CHECK(computes(s[1]) == "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
    // Interleaved, pp 2, v 2, m 4: micro-batches in groups of 2 through chunk 0 then chunk 1;
    // rank 0 warms up with (v-1)*pp + 2*(pp-1) = 4 forwards, rank 1 with 2.
    s = make_pipeline_schedule(PpScheduleKind::Interleaved, 2, 4, 2);
    CHECK(computes(s[0]) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
    CHECK(computes(s[1]) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

TEST_CASE("transfers name peer, micro-batch, chunk, kind and a shared tag", "[pipeline]") {
    // pp 2, v 2: rank 1's chunk 0 (virtual stage 1) sends its activation to rank 0's chunk 1
    // (virtual stage 2), boundary 1; tag = (micro * (V-1) + boundary) * 2 + payload, V = 4.
    PpSchedule s = make_pipeline_schedule(PpScheduleKind::Interleaved, 2, 4, 2);
    bool found = false;
    for (const PpAction& a : s[1])
        for (const PpTransfer& t : a.transfers)
            if (t.is_send && t.payload == PpPayload::Activation && t.micro == 3 && t.chunk == 0) {
                CHECK(t.peer == 0);
                CHECK(t.tag == (3 * 3 + 1) * 2 + 0);
                found = true;
            }
    CHECK(found);
    found = false;
    for (const PpAction& a : s[0])
        for (const PpTransfer& t : a.transfers)
            if (!t.is_send && t.payload == PpPayload::Activation && t.micro == 3 && t.peer == 1) {
                CHECK(t.chunk == 1);
                CHECK(t.tag == (3 * 3 + 1) * 2 + 0);
                found = true;
            }
    CHECK(found);
    // 1F1B's steady state pairs the activation going up with the gradient coming down.
    s = make_pipeline_schedule(PpScheduleKind::OneFOneB, 2, 4, 1);
    size_t i = find_action(s[0], [](const PpAction& a) { return has_transfer(a, true, PpPayload::Activation, 1); });
    CHECK(s[0][i].op == PpOp::SendRecv);
    CHECK(has_transfer(s[0][i], false, PpPayload::Gradient, 0));
    CHECK(to_string(s[0][i]) ==
          "SendRecv[send activation micro 1 chunk 0 -> rank 1 (tag 2), "
          "recv gradient micro 0 chunk 0 <- rank 1 (tag 1)]");
}

TEST_CASE("checker and simulator on a hand-written two-stage schedule", "[pipeline]") {
    // One micro-batch through two stages: rank 1 idles during rank 0's forward and backward.
    const int tag_act = pp_message_tag(PpPayload::Activation, 0, 0, 2);
    const int tag_grad = pp_message_tag(PpPayload::Gradient, 0, 0, 2);
    CHECK(tag_act == 0);
    CHECK(tag_grad == 1);
    PpSchedule s(2);
    s[0] = {pp_forward(0, 0), pp_comm({{true, PpPayload::Activation, 1, 0, 0, tag_act}}),
            pp_comm({{false, PpPayload::Gradient, 1, 0, 0, tag_grad}}), pp_backward(0, 0)};
    s[1] = {pp_comm({{false, PpPayload::Activation, 0, 0, 0, tag_act}}), pp_forward(0, 0), pp_backward(0, 0),
            pp_comm({{true, PpPayload::Gradient, 0, 0, 0, tag_grad}})};
    REQUIRE(check_pipeline_schedule(s, 2, 1, 1) == "");
    PipelineStats st = simulate_pipeline(s, 2, 1, 1, 1.0, 2.0);
    CHECK(st.makespan == Approx(6.0));  // F0 [0,1], F1 [1,2], B1 [2,4], B0 [4,6]
    CHECK(st.busy == std::vector<double>{3.0, 3.0});
    CHECK(st.idle_fraction[1] == Approx(0.5));
    CHECK(st.peak_in_flight == std::vector<int>{1, 1});
    CHECK(st.peak_buffered == std::vector<int>{1, 1});

    // The same with a wrong tag and a wrong peer.
    PpSchedule bad = s;
    bad[1][0].transfers[0].tag = 7;
    CHECK_THAT(check_pipeline_schedule(bad, 2, 1, 1), Contains("tag 7, expected 0"));
    bad = s;
    bad[0][1].transfers[0].peer = 0;
    CHECK_THAT(check_pipeline_schedule(bad, 2, 1, 1),
               Contains("wrong peer 0: that activation comes from or goes to rank 1 (virtual stage 1)"));
}

TEST_CASE("checker: swapped receives deadlock", "[pipeline]") {
    // GPipe, 2 stages, 2 micro-batches: rank 1 receives activation 0, then activation 1.
    PpSchedule s = make_pipeline_schedule(PpScheduleKind::GPipe, 2, 2, 1);
    REQUIRE(s[1][0].op == PpOp::Recv);
    REQUIRE(s[1][2].op == PpOp::Recv);
    std::swap(s[1][0], s[1][2]);
    // Rank 0 sends activation 0 and waits for rank 1 to take it; rank 1 waits for activation 1.
    const std::string why = check_pipeline_schedule(s, 2, 2, 1);
    CHECK_THAT(why, Contains("deadlock"));
    CHECK_THAT(why, Contains("rank 0 waits at action 1 Send[send activation micro 0"));
    CHECK_THAT(why, Contains("rank 1 waits at action 0 Recv[recv activation micro 1"));
}

TEST_CASE("checker: a combined send+recv split into send then recv on both sides deadlocks", "[pipeline]") {
    const PpSchedule good = make_pipeline_schedule(PpScheduleKind::OneFOneB, 2, 4, 1);
    // Rank 0 sends activation 1 up while rank 1 sends gradient 0 down.
    const size_t i0 = find_action(good[0], [](const PpAction& a) {
        return a.op == PpOp::SendRecv && has_transfer(a, true, PpPayload::Activation, 1);
    });
    const size_t i1 = find_action(good[1], [](const PpAction& a) {
        return a.op == PpOp::SendRecv && has_transfer(a, false, PpPayload::Activation, 1);
    });
    REQUIRE(has_transfer(good[1][i1], true, PpPayload::Gradient, 0));
    const auto split = [](std::vector<PpAction>& list, size_t i) {
        PpAction both = list[i];
        REQUIRE(both.transfers.size() == 2);
        REQUIRE(both.transfers[0].is_send);
        list[i] = pp_comm({both.transfers[0]});
        list.insert(list.begin() + i + 1, pp_comm({both.transfers[1]}));
    };
    PpSchedule one_side = good;
    split(one_side[0], i0);
    // One side still posting both halves is enough: it takes the other's send first.
    CHECK(check_pipeline_schedule(one_side, 2, 4, 1) == "");
    PpSchedule both_sides = one_side;
    split(both_sides[1], i1);
    const std::string why = check_pipeline_schedule(both_sides, 2, 4, 1);
    CHECK_THAT(why, Contains("deadlock"));
    CHECK_THAT(why, Contains("rank 0 waits at action " + std::to_string(i0) + " Send[send activation micro 1"));
    CHECK_THAT(why, Contains("rank 1 waits at action " + std::to_string(i1) + " Send[send gradient micro 0"));
}

TEST_CASE("checker: missing, early and duplicate computes, sends of data not produced", "[pipeline]") {
    const PpSchedule good = make_pipeline_schedule(PpScheduleKind::OneFOneB, 2, 4, 1);
    REQUIRE(check_pipeline_schedule(good, 2, 4, 1) == "");

    SECTION("a dropped Backward") {
        PpSchedule s = good;
        s[0].erase(s[0].begin() +
                   find_action(s[0], [](const PpAction& a) { return is_compute(a, PpOp::Backward, 2, 0); }));
        CHECK(check_pipeline_schedule(s, 2, 4, 1) == "rank 0: Backward(micro 2, chunk 0) is missing");
    }
    SECTION("a Backward moved before its gradient arrives") {
        PpSchedule s = good;
        size_t b = find_action(s[0], [](const PpAction& a) { return is_compute(a, PpOp::Backward, 0, 0); });
        size_t r = find_action(s[0], [](const PpAction& a) { return has_transfer(a, false, PpPayload::Gradient, 0); });
        REQUIRE(r < b);
        PpAction back = s[0][b];
        s[0].erase(s[0].begin() + b);
        s[0].insert(s[0].begin() + r, back);
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1),
                   Contains("Backward(micro 0, chunk 0): runs before its gradient: the gradient from rank 1"));
    }
    SECTION("a Forward moved before its activation arrives") {
        PpSchedule s = good;
        REQUIRE(s[1][0].op == PpOp::Recv);
        std::swap(s[1][0], s[1][1]);
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1),
                   Contains("rank 1 action 0 Forward(micro 0, chunk 0): runs before its input"));
    }
    SECTION("a Backward before its Forward") {
        PpSchedule s = good;
        s[1].insert(s[1].begin(), pp_backward(3, 0));
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1),
                   Contains("Backward(micro 3, chunk 0): runs before its Forward"));
    }
    SECTION("a duplicate Forward") {
        PpSchedule s = good;
        s[0].insert(s[0].begin() + 1, pp_forward(0, 0));
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1),
                   Contains("rank 0 action 1 Forward(micro 0, chunk 0): duplicate"));
    }
    SECTION("an activation sent before its Forward ran") {
        PpSchedule s = good;
        REQUIRE(s[0][1].op == PpOp::Send);
        std::swap(s[0][0], s[0][1]);
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1), Contains("sends a activation not yet produced"));
    }
    SECTION("micro-batch out of range") {
        PpSchedule s = good;
        s[0].push_back(pp_forward(4, 0));
        CHECK_THAT(check_pipeline_schedule(s, 2, 4, 1), Contains("micro-batch 4 / chunk 0 out of range"));
    }
}

TEST_CASE("checker: interleaved exchange split apart deadlocks", "[pipeline]") {
    // Megatron's tick exchange posts what both neighbours produced in one call; posting its sends
    // and receives one by one, in the list's order, on every rank leaves all ranks in a send.
    PpSchedule s = make_pipeline_schedule(PpScheduleKind::Interleaved, 4, 8, 2);
    REQUIRE(check_pipeline_schedule(s, 4, 8, 2) == "");
    for (auto& list : s) {
        std::vector<PpAction> split;
        for (const PpAction& a : list) {
            if (a.op != PpOp::SendRecv) split.push_back(a);
            else
                for (const PpTransfer& t : a.transfers) split.push_back(pp_comm({t}));
        }
        list = split;
    }
    CHECK_THAT(check_pipeline_schedule(s, 4, 8, 2), Contains("deadlock"));
}

TEST_CASE("describe gives the start-up line", "[pipeline]") {
    CHECK(describe_pipeline(PpScheduleKind::OneFOneB, 4, 8, 1) ==
          "1f1b: 4 stages x 8 micro-batches, idle fraction 0.273 ((p-1)/(m+p-1) = 0.273), peak 4 micro-batches in "
          "flight on stage 0");
    CHECK(describe_pipeline(PpScheduleKind::Interleaved, 4, 8, 2) ==
          "interleaved: 4 stages x 2 chunks x 8 micro-batches, idle fraction 0.158 ((p-1)/(v*m+p-1) = 0.158), peak "
          "11 (micro-batch, chunk) pairs in flight on stage 0");
    CHECK(describe_pipeline(PpScheduleKind::GPipe, 1, 4, 1) ==
          "gpipe: 1 stage x 4 micro-batches, idle fraction 0.000 ((p-1)/(m+p-1) = 0.000), peak 1 micro-batches in "
          "flight on stage 0");
}

TEST_CASE("layer split: balanced and explicit", "[pipeline]") {
    using Split = std::vector<std::pair<int, int>>;
    CHECK(pp_layer_split(12, 4, 1, {}) == Split{{0, 3}, {3, 6}, {6, 9}, {9, 12}});
    // 10 = 4 * 2 + 2: the two extra layers on the first two stages, the last (LM head) stays light.
    CHECK(pp_layer_split(10, 4, 1, {}) == Split{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
    // 13 = 6 * 2 + 1 over pp 2 x v 3 virtual stages.
    CHECK(pp_layer_split(13, 2, 3, {}) == Split{{0, 3}, {3, 5}, {5, 7}, {7, 9}, {9, 11}, {11, 13}});
    // Interleaved: rank 1 holds virtual stages 1 and 3 = layers 3..5 and 9..11.
    Split s = pp_layer_split(12, 2, 2, {});
    CHECK(s[pp_virtual_stage(1, 0, 2)] == std::make_pair(3, 6));
    CHECK(s[pp_virtual_stage(1, 1, 2)] == std::make_pair(9, 12));
    CHECK(pp_layer_split(12, 4, 1, {2, 4, 4, 2}) == Split{{0, 2}, {2, 6}, {6, 10}, {10, 12}});
    CHECK(pp_layer_split(5, 1, 1, {}) == Split{{0, 5}});
    CHECK(pp_layer_split(4, 4, 1, {}) == Split{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
}

TEST_CASE("layer split and pipeline validation errors name the key and the values", "[pipeline]") {
    std::string e = error_of([] { pp_layer_split(12, 2, 2, {4, 4, 4}); });
    CHECK_THAT(e, Contains("parallel.pp_layers = [4, 4, 4] has 3 entries"));
    CHECK_THAT(e, Contains("parallel.pp x parallel.pp_virtual = 2 x 2 = 4"));
    e = error_of([] { pp_layer_split(12, 3, 1, {4, 4, 5}); });
    CHECK_THAT(e, Contains("parallel.pp_layers = [4, 4, 5] sums to 13, needs model.n_layer = 12"));
    e = error_of([] { pp_layer_split(12, 2, 1, {12, 0}); });
    CHECK_THAT(e, Contains("parallel.pp_layers = [12, 0]: entry 1 is 0"));
    e = error_of([] { pp_layer_split(3, 2, 2, {}); });
    CHECK_THAT(e, Contains("model.n_layer = 3 is fewer than the 4 pipeline stages "
                           "(parallel.pp = 2 x parallel.pp_virtual = 2)"));

    const auto validate = [](PpScheduleKind k, int n_layer, int pp, int v, std::vector<int> layers, int m) {
        return error_of([&] { validate_pipeline(k, n_layer, pp, v, layers, m); });
    };
    CHECK(validate(PpScheduleKind::Interleaved, 12, 4, 2, {}, 8) == "");
    CHECK_THAT(validate(PpScheduleKind::Interleaved, 12, 4, 2, {}, 6),
               Contains("parallel.pp_schedule = \"interleaved\" needs train.grad_accum (micro-batches, 6) to be a "
                        "multiple of parallel.pp (4)"));
    CHECK_THAT(validate(PpScheduleKind::OneFOneB, 12, 4, 2, {}, 8),
               Contains("parallel.pp_virtual = 2 needs parallel.pp_schedule = \"interleaved\" (got \"1f1b\")"));
    CHECK_THAT(validate(PpScheduleKind::Interleaved, 12, 1, 2, {}, 8),
               Contains("parallel.pp_virtual = 2 needs parallel.pp >= 2"));
    CHECK_THAT(validate(PpScheduleKind::OneFOneB, 12, 4, 1, {3, 3, 3}, 8), Contains("parallel.pp_layers = [3, 3, 3]"));
    CHECK_THAT(validate(PpScheduleKind::GPipe, 3, 4, 1, {}, 8), Contains("model.n_layer = 3"));
    // make_pipeline_schedule refuses what the schedule cannot express.
    CHECK_THAT(error_of([] { make_pipeline_schedule(PpScheduleKind::Interleaved, 4, 6, 2); }),
               Contains("train.grad_accum"));
    CHECK_THAT(error_of([] { make_pipeline_schedule(PpScheduleKind::GPipe, 2, 4, 2); }),
               Contains("parallel.pp_virtual"));

    CHECK_THAT(error_of([] { parse_pp_schedule("zero_bubble"); }), Contains("parallel.pp_schedule = \"zero_bubble\""));
    CHECK(parse_pp_schedule("interleaved") == PpScheduleKind::Interleaved);

    Config cfg;
    CHECK(error_of([&] { validate_pipeline(cfg); }) == "");  // defaults: one stage, 1f1b
    cfg.parallel.pp = 4;
    cfg.model.n_layer = 2;
    CHECK_THAT(error_of([&] { validate_pipeline(cfg); }), Contains("model.n_layer = 2 is fewer than the 4"));
}
