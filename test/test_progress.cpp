// llmc/progress: the median, the ETA from the recent step times, tokens after a resume, the
// formatting and the summary, on step times chosen here.
#include <catch2/catch.hpp>

#include <string>

#include "llmc/run/progress.h"

TEST_CASE("progress: median of odd and even lists, unordered", "[progress]") {
    CHECK(median({5}) == 5);
    CHECK(median({3, 1, 2}) == 2);
    CHECK(median({10, 1, 4, 2}) == 3);  // (2 + 4) / 2
    CHECK(median({7, 7, 1, 100, 7}) == 7);
}

TEST_CASE("progress: ETA is the median of the window's step times times the steps left", "[progress]") {
    Progress p(100, 512, 4);  // 100 steps, 512 tokens each, a window of 4 step times
    p.start(0, 0);
    CHECK(p.eta_s() < 0);  // nothing measured yet
    CHECK(p.step_suffix() == " | 0 tok | ETA ?");
    p.step_done(5000);  // a slow first step
    CHECK(p.eta_s() == Approx(5.0 * 99));
    p.step_done(100);
    p.step_done(120);
    // window {5000, 100, 120}: median 120 ms, 97 steps left
    CHECK(p.eta_s() == Approx(0.120 * 97));
    p.step_done(110);
    // {5000, 100, 120, 110}: (110 + 120) / 2
    CHECK(p.eta_s() == Approx(0.115 * 96));
    p.step_done(90);
    // the first step has left the window: {100, 120, 110, 90} -> (100 + 110) / 2
    CHECK(p.eta_s() == Approx(0.105 * 95));
    CHECK(p.step() == 5);
    CHECK(p.tokens() == 5 * 512);
    CHECK(p.step_suffix() == " | 2.56K tok | ETA 9s");  // 0.105 * 95 = 9.975 s, truncated
}

TEST_CASE("progress: a resumed run counts the earlier steps' tokens; the summary", "[progress]") {
    Progress p(10, 1000, 20);
    p.start(6, 1000.0);
    p.step_done(200);
    p.val_loss(7, 3.5);
    p.step_done(300);
    p.val_loss(8, 3.25);
    p.step_done(250);
    p.step_done(250);
    p.val_loss(10, 3.3);
    CHECK(p.tokens() == 10000);
    CHECK(p.eta_s() == Approx(0.0));
    p.wrote_weights("out/model_00000010.bin");
    p.wrote_checkpoint("out/checkpoints/step_00000010");
    // 4 steps of 1000 tokens in 1 s of step time: 4000 tok/s; wall time 61.5 s - 1 s
    CHECK(p.summary(61500.0, "out/checkpoints") ==
          "done: 10 steps (4 in this run, resumed at 6), 10.0K tokens, wall time 1m00s, mean 4000 tok/s, "
          "best val loss 3.250000 (step 8)\n"
          "weights: out/model_00000010.bin\n"
          "checkpoints: out/checkpoints (latest out/checkpoints/step_00000010)\n");
    Progress q(3, 10, 20);
    q.start(0, 0);
    q.step_done(10);
    CHECK(q.summary(20, "ck") == "done: 1 step, 10 tokens, wall time 0s, mean 1000 tok/s\n"
                                 "checkpoints: none written by this run (in ck)\n");
}

TEST_CASE("progress: human counts and durations", "[progress]") {
    CHECK(human_count(0) == "0");
    CHECK(human_count(950) == "950");
    CHECK(human_count(61440) == "61.4K");
    CHECK(human_count(1234567) == "1.23M");
    CHECK(human_count(123456789) == "123M");
    CHECK(human_count(4.56e9) == "4.56B");
    CHECK(human_duration(0.7) == "0s");
    CHECK(human_duration(45) == "45s");
    CHECK(human_duration(185) == "3m05s");
    CHECK(human_duration(7620) == "2h07m");
    CHECK(human_duration(3 * 86400 + 4 * 3600 + 59) == "3d04h");
}
