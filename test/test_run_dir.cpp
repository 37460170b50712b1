// What protects a run's folder: nothing non-finite replaces a good checkpoint, one trainer per
// out_dir (the lock), a rollback sets the later branch aside.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/param_table.h"
#include "llmc/run_dir.h"

namespace {
std::string temp_dir() {
    char tmpl[] = "/tmp/llmc_rundir_XXXXXX";
    return mkdtemp(tmpl);
}
bool exists(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}
WholeState whole_of(const ModelShape& s, float value) {
    WholeState w;
    w.params.assign(num_params(s), value);
    w.m.assign(num_params(s), 0.0f);
    w.v.assign(num_params(s), 0.0f);
    return w;
}
}  // namespace

TEST_CASE("a non-finite state is never saved: the good checkpoints stay", "[checkpoint]") {
    const std::string dir = temp_dir();
    const ModelShape s{2, 2, 8, 100, 128, 16};
    TrainState st;
    st.step = 1;
    checkpoint_save(dir, st, s, 3, whole_of(s, 0.5f), nlohmann::json::object(), 1);
    REQUIRE(checkpoint_latest(dir) == dir + "/step_00000001");
    for (float bad : {float(NAN), float(INFINITY), -float(INFINITY)}) {
        WholeState w = whole_of(s, 0.5f);
        w.params[7] = bad;
        st.step = 2;
        CHECK_THROWS_AS(checkpoint_save(dir, st, s, 3, w, nlohmann::json::object(), 1), NonFiniteState);
        CHECK_THROWS_WITH(check_finite_state(w, 2), Catch::Contains("step 2") && Catch::Contains("1 of") &&
                                                        Catch::Contains("weights") && Catch::Contains("index 7"));
        w.params[7] = 0.5f;
        w.v.back() = bad;  // the moments too
        CHECK_THROWS_WITH(check_finite_state(w, 2), Catch::Contains("Adam v"));
    }
    // keep=1 would have deleted step 1 in favour of step 2: it is still the latest, whole
    CHECK(checkpoint_latest(dir) == dir + "/step_00000001");
    WholeState back;
    CHECK(checkpoint_load(dir + "/step_00000001", s, &back).step == 1);
    CHECK(!exists(dir + "/step_00000002"));
    CHECK(!exists(dir + "/step_00000002.tmp"));
}

TEST_CASE("one trainer per out_dir: the second is refused naming the holder's pid", "[checkpoint]") {
    Config cfg;
    cfg.out_dir = temp_dir() + "/out";
    prepare_run_dirs(cfg, cfg.out_dir + "/checkpoints");
    CHECK(exists(cfg.out_dir + "/checkpoints"));
    // flock locks belong to an open file: a second open in this process conflicts like another process
    CHECK_THROWS_WITH(prepare_run_dirs(cfg, cfg.out_dir + "/checkpoints"),
                      Catch::Contains("pid " + std::to_string(::getpid())) && Catch::Contains(cfg.out_dir));
}

TEST_CASE("a fresh run in a folder holding another run is refused; a rollback sets later steps aside",
          "[checkpoint]") {
    const std::string out = temp_dir();
    const std::string ck = out + "/checkpoints";
    const ModelShape s{2, 2, 8, 100, 128, 16};
    TrainState st;
    for (int step : {2, 4, 6}) {
        st.step = step;
        checkpoint_save(ck, st, s, 3, whole_of(s, 0.5f), nlohmann::json::object(), 5);
    }
    Config cfg;
    cfg.out_dir = out;
    cfg.checkpoint.resume = "never";
    CHECK_THROWS_WITH(prepare_run_dirs(cfg, ck), Catch::Contains("3 checkpoints in " + ck) &&
                                                     Catch::Contains("checkpoint.resume=auto"));
    const std::vector<std::string> moved = set_aside_later_checkpoints(ck, 2);
    CHECK(moved == std::vector<std::string>{ck + "/abandoned_step_00000004", ck + "/abandoned_step_00000006"});
    CHECK(checkpoint_latest(ck) == ck + "/step_00000002");
    // a second rollback past a step set aside before keeps both
    st.step = 4;
    checkpoint_save(ck, st, s, 3, whole_of(s, 0.5f), nlohmann::json::object(), 5);
    CHECK(set_aside_later_checkpoints(ck, 2) == std::vector<std::string>{ck + "/abandoned2_step_00000004"});
    CHECK(exists(ck + "/abandoned_step_00000004/DONE"));
}
