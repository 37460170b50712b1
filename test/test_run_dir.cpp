// What protects a run's folder: nothing non-finite replaces a good checkpoint, one trainer per
// out_dir (the lock), a rollback sets the later branch aside.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/io/checkpoint.h"
#include "llmc/io/model_file.h"
#include "llmc/model/param_table.h"
#include "llmc/run/run_dir.h"
#include "test/temp_dir.h"

namespace {
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
// count distinct floats from base on (a pattern a bit flip or a swapped array shows)
std::vector<float> filled(float base, size_t count) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; i++) x[i] = base + 1e-3f * float(i % 977);
    return x;
}
// The version field of a checkpoint's state.bin (its header's second int32).
int32_t state_version(const std::string& checkpoint) {
    int32_t header[2] = {0, 0};
    FILE* f = std::fopen((checkpoint + "/state.bin").c_str(), "rb");
    REQUIRE(f);
    const bool read = std::fread(header, sizeof(header), 1, f) == 1;
    std::fclose(f);
    REQUIRE(read);
    return header[1];
}
}  // namespace

TEST_CASE("a non-finite state is never saved: the good checkpoints stay", "[checkpoint]") {
    const TempDir tmp("llmc_rundir");
    const std::string dir = tmp.path;
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
    const TempDir tmp("llmc_rundir");
    cfg.out_dir = tmp.path + "/out";
    prepare_run_dirs(cfg, cfg.out_dir + "/checkpoints");
    CHECK(exists(cfg.out_dir + "/checkpoints"));
    // flock locks belong to an open file: a second open in this process conflicts like another process
    CHECK_THROWS_WITH(prepare_run_dirs(cfg, cfg.out_dir + "/checkpoints"),
                      Catch::Contains("pid " + std::to_string(::getpid())) && Catch::Contains(cfg.out_dir));
}

TEST_CASE("a fresh run in a folder holding another run is refused; a rollback sets later steps aside",
          "[checkpoint]") {
    const TempDir tmp("llmc_rundir");
    const std::string out = tmp.path;
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

TEST_CASE("a checkpoint.dir shared by two out_dirs is locked too", "[checkpoint]") {
    const TempDir tmp("llmc_rundir");
    const std::string root = tmp.path;
    Config a, b;
    a.out_dir = root + "/a";
    b.out_dir = root + "/b";
    a.checkpoint.dir = b.checkpoint.dir = root + "/shared_ck";
    prepare_run_dirs(a, a.checkpoint.dir);
    CHECK(exists(root + "/shared_ck/train_gpt.lock"));
    CHECK_THROWS_WITH(prepare_run_dirs(b, b.checkpoint.dir),
                      Catch::Contains("checkpoint.dir: " + root + "/shared_ck is in use") &&
                          Catch::Contains("pid " + std::to_string(::getpid())));
    // a checkpoint.dir that is out_dir itself is locked once, not refused by its own lock
    Config c;
    c.out_dir = c.checkpoint.dir = root + "/same";
    CHECK_NOTHROW(prepare_run_dirs(c, c.checkpoint.dir));
}

TEST_CASE("state.bin keeps the skipped-step count and the training shards", "[checkpoint]") {
    const TempDir tmp("llmc_rundir");
    const std::string dir = tmp.path;
    const ModelShape s{2, 2, 8, 100, 128, 16};
    TrainState st;
    st.step = 3;
    st.skipped = 2;
    st.train_shards = shard_list({"/nowhere/train_000000.bin"});  // [[name, bytes]]: 0 bytes, no such file
    REQUIRE(st.train_shards == nlohmann::json::parse(R"([["train_000000.bin", 0]])"));
    const nlohmann::json config = {{"train", {{"micro_batch", 2}}}};
    checkpoint_save(dir, st, s, 3, whole_of(s, 0.5f), config, 1);
    WholeState back;
    const TrainState got = checkpoint_load(dir + "/step_00000003", s, &back);
    CHECK(got.skipped == 2);
    CHECK(got.train_shards == st.train_shards);
    CHECK(got.config == config);
}

// Local SGD's state (version 2 of state.bin): the outer anchor and momentum and the other DP ranks'
// replicas come back bit for bit; a non-finite replica is named; a state.bin whose version and
// "local_sgd" disagree is refused. Without local SGD the file stays version 1.
TEST_CASE("state.bin keeps local SGD's outer state and every DP replica", "[checkpoint][local_sgd]") {
    const TempDir tmp("llmc_rundir");
    const std::string dir = tmp.path;
    const ModelShape s{2, 2, 8, 100, 128, 16};
    const size_t n = num_params(s);
    TrainState st;
    st.step = 6;
    WholeState w = whole_of(s, 0.5f);
    w.master = filled(0.25f, n);
    w.local_sgd.anchor = filled(1.0f, n);
    w.local_sgd.momentum = filled(-2.0f, n);
    for (int k = 1; k < 3; k++)
        w.local_sgd.replicas.push_back(
            {filled(3.0f * k, n), filled(4.0f * k, n), filled(5.0f * k, n), filled(6.0f * k, n)});
    REQUIRE(w.local_sgd.dp() == 3);
    const std::string path = checkpoint_save(dir, st, s, 3, w, nlohmann::json::object(), 2);
    CHECK(state_version(path) == 2);
    WholeState back;
    CHECK(checkpoint_load(path, s, &back).step == 6);
    CHECK(back.params == w.params);
    CHECK(back.master == w.master);
    CHECK(back.local_sgd.anchor == w.local_sgd.anchor);
    CHECK(back.local_sgd.momentum == w.local_sgd.momentum);
    REQUIRE(back.local_sgd.replicas.size() == 2);
    for (size_t k = 0; k < 2; k++) {
        const ReplicaState &a = back.local_sgd.replicas[k], &b = w.local_sgd.replicas[k];
        CHECK((a.params == b.params && a.m == b.m && a.v == b.v && a.master == b.master));
    }
    // nothing non-finite of any replica is saved
    w.local_sgd.replicas[1].v[9] = NAN;
    CHECK_THROWS_WITH(check_finite_state(w, 7), Catch::Contains("Adam v of DP rank 2"));
    w.local_sgd.replicas[1].v[9] = 0.0f;
    w.local_sgd.momentum[3] = INFINITY;
    CHECK_THROWS_WITH(check_finite_state(w, 7), Catch::Contains("local SGD outer momentum"));
    // a plain run's checkpoint: version 1, no local state
    st.step = 7;
    const std::string plain = checkpoint_save(dir, st, s, 3, whole_of(s, 0.5f), nlohmann::json::object(), 2);
    CHECK(state_version(plain) == 1);
    CHECK(checkpoint_load(plain, s, &back).step == 7);
    CHECK(back.local_sgd.empty());
}

// PowerSGD's state (version 3 of state.bin): every DP rank's error feedback and Q come back bit for
// bit; a non-finite one is named; a version that disagrees with "powersgd" is refused.
TEST_CASE("state.bin keeps PowerSGD's error feedback of every DP rank and Q", "[checkpoint][powersgd]") {
    const TempDir tmp("llmc_rundir");
    const std::string dir = tmp.path;
    const ModelShape s{2, 2, 8, 100, 128, 16};
    const size_t n = num_params(s);
    TrainState st;
    st.step = 6;
    WholeState w = whole_of(s, 0.5f);
    w.powersgd.rank = 4;
    w.powersgd.errors = {filled(-1.0f, n), filled(2.0f, n)};
    w.powersgd.q = filled(3.0f, 1234);
    const std::string path = checkpoint_save(dir, st, s, 3, w, nlohmann::json::object(), 2);
    CHECK(state_version(path) == 3);
    WholeState back;
    CHECK(checkpoint_load(path, s, &back).step == 6);
    CHECK(back.params == w.params);
    CHECK(back.powersgd.rank == 4);
    CHECK(back.powersgd.errors == w.powersgd.errors);
    CHECK(back.powersgd.q == w.powersgd.q);
    CHECK(back.local_sgd.empty());
    w.powersgd.errors[1][5] = NAN;
    CHECK_THROWS_WITH(check_finite_state(w, 7), Catch::Contains("PowerSGD error feedback of DP rank 1"));
    w.powersgd.errors[1][5] = 0.0f;
    w.powersgd.q[7] = INFINITY;
    CHECK_THROWS_WITH(check_finite_state(w, 7), Catch::Contains("PowerSGD factors Q"));
    // the version says a PowerSGD section follows: a file that says otherwise is refused
    std::FILE* g = std::fopen((path + "/state.bin").c_str(), "r+b");
    REQUIRE(g);
    const int32_t v1 = 1;
    std::fseek(g, 4, SEEK_SET);
    REQUIRE(std::fwrite(&v1, 4, 1, g) == 1);
    std::fclose(g);
    CHECK_THROWS_WITH(checkpoint_load(path, s, &back), Catch::Contains("corrupt metadata (a version 1 file with \"powersgd\")"));
}

TEST_CASE("non-finite weights in a model file are named by file and tensor", "[checkpoint]") {
    const ModelShape s{2, 2, 8, 100, 128, 16};
    std::vector<float> w(num_params(s), 0.5f);
    CHECK_NOTHROW(check_finite_weights(w, s, "init.bin"));
    // file order: wte 128x8, wpe 16x8, ln1w 2x8, ln1b 2x8, then qkvw 2 x (24x8): layer 1's at 1376
    w[1376 + 5] = NAN;
    w[1376 + 6] = INFINITY;
    CHECK_THROWS_WITH(check_finite_weights(w, s, "init.bin"),
                      Catch::Contains("model file init.bin: 2 of " + std::to_string(w.size()) + " parameters are not finite") &&
                          Catch::Contains("tensor h.1.qkvw element 5"));
    w.assign(w.size(), 0.5f);
    w[3] = -INFINITY;
    CHECK_THROWS_WITH(check_finite_weights(w, s, "init.bin"), Catch::Contains("tensor wte element 3"));
}

namespace {
// A resolved config: the test's base with `patch` merged in (no files needed).
Config config_of(const nlohmann::json& patch) {
    nlohmann::json j = {{"data", {{"train", "/data/a/train_*.bin"}}},
                        {"train", {{"micro_batch", 2}, {"seq_len", 16}, {"grad_accum", 2}, {"steps", 10},
                                   {"lr_schedule", "cosine"}, {"warmup_steps", 2}}}};
    j.merge_patch(patch);
    return config_from_json(j, false);
}
std::vector<std::string> keys(const std::vector<ResumeChange>& changes, bool breaking) {
    std::vector<std::string> out;
    for (const ResumeChange& c : changes)
        if (c.breaks == breaking) out.push_back(c.key);
    std::sort(out.begin(), out.end());
    return out;
}
using Keys = std::vector<std::string>;
}  // namespace

TEST_CASE("resume: every change is named; those that break an exact resume are refused unless allowed",
          "[checkpoint]") {
    using nlohmann::json;
    const json shards = json::parse(R"([["train_000000.bin", 41024], ["train_000001.bin", 41024]])");
    const Config base = config_of(json::object());
    TrainState st;
    st.step = 4;
    st.loader_dp = 2;
    st.config = base.resolved;
    st.train_shards = shards;
    CHECK(resume_changes(st, base, 2, shards).empty());
    CHECK(check_resume_changes({}, base, "ck").empty());

    // harmless: evaluation, saving, the layout at the same tokens per step (grad_accum 2 x dp 2 =
    // 4 x 1), the same shards found through another glob; how to resume is not listed at all
    Config c = config_of({{"eval", {{"batches", 3}}},
                          {"checkpoint", {{"every", 7}, {"resume", "never"}, {"allow_changes", true}}},
                          {"train", {{"grad_accum", 4}}}, {"data", {{"train", "/data/b/train_*.bin"}}}});
    std::vector<ResumeChange> ch = resume_changes(st, c, 1, shards);
    CHECK(keys(ch, false) == Keys{"checkpoint.every", "data.train", "eval.batches", "train.grad_accum"});
    CHECK(keys(ch, true).empty());
    CHECK_THAT(check_resume_changes(ch, c, "ck"), Catch::Contains("eval.batches: 10 -> 3") &&
                                                       !Catch::Contains("warning"));

    // the micro-batch: the data position and the tokens per step change
    c = config_of({{"train", {{"micro_batch", 4}}}});
    ch = resume_changes(st, c, 2, shards);
    CHECK(keys(ch, true) == Keys{"tokens per step (micro_batch x seq_len x grad_accum x dp)", "train.micro_batch"});
    CHECK_THROWS_WITH(check_resume_changes(ch, c, "ck"),
                      Catch::Contains("checkpoint.resume: ck cannot continue exactly") &&
                          Catch::Contains("train.micro_batch: 2 -> 4") && Catch::Contains("128 (2 x 16 x 2 x 2)") &&
                          Catch::Contains("checkpoint.allow_changes=true"));
    c.checkpoint.allow_changes = true;
    CHECK_THAT(check_resume_changes(ch, c, "ck"), Catch::Contains("train.micro_batch: 2 -> 4 (no exact resume)") &&
                                                       Catch::Contains("warning: checkpoint.allow_changes=true"));
    // seq_len; dp alone (the tokens per step); the seed
    CHECK(keys(resume_changes(st, config_of({{"train", {{"seq_len", 8}}}}), 2, shards), true) ==
          Keys{"tokens per step (micro_batch x seq_len x grad_accum x dp)", "train.seq_len"});
    CHECK(keys(resume_changes(st, base, 4, shards), true) ==
          Keys{"tokens per step (micro_batch x seq_len x grad_accum x dp)"});
    CHECK(keys(resume_changes(st, config_of({{"train", {{"seed", 7}}}}), 2, shards), true) == Keys{"train.seed"});

    // the shards: one more, or one of another size, is another data stream
    json more = shards;
    more.push_back(json::array({"train_000002.bin", 41024}));
    ch = resume_changes(st, base, 2, more);
    REQUIRE(keys(ch, true) == Keys{"training shards"});
    CHECK(ch[0].after == "3 shards: train_000000.bin (41024 B), train_000001.bin (41024 B), train_000002.bin (41024 B)");
    json resized = shards;
    resized[1][1] = 42024;
    CHECK(keys(resume_changes(st, base, 2, resized), true) == Keys{"training shards"});

    // the learning rate: train.steps moves a cosine schedule (step 5's lr changes), not a constant one
    ch = resume_changes(st, config_of({{"train", {{"steps", 20}}}}), 2, shards);
    CHECK(keys(ch, true) == Keys{"learning rate of step 5", "train.steps"});
    TrainState constant = st;
    constant.config = config_of({{"train", {{"lr_schedule", "constant"}}}}).resolved;
    CHECK(keys(resume_changes(constant, config_of({{"train", {{"lr_schedule", "constant"}, {"steps", 20}}}}), 2,
                              shards),
               true)
              .empty());
    // warmup that ended before the checkpoint's step changes nothing left
    CHECK(keys(resume_changes(constant, config_of({{"train", {{"lr_schedule", "constant"}, {"warmup_steps", 3}}}}),
                              2, shards),
               true)
              .empty());
    CHECK(keys(resume_changes(st, config_of({{"train", {{"lr", 1e-3}}}}), 2, shards), true) ==
          Keys{"learning rate of step 5", "train.lr"});

    // local SGD is part of the recipe, unlike the rest of parallel.*
    CHECK(keys(resume_changes(st, config_of({{"parallel", {{"local_sgd", {{"every", 4}}}}}}), 2, shards), true) ==
          Keys{"parallel.local_sgd.every"});
    CHECK(keys(resume_changes(st, config_of({{"parallel", {{"local_sgd", {{"every", 4}, {"outer_momentum", 0.5}}}}}}), 2,
                              shards),
               true) == Keys{"parallel.local_sgd.every", "parallel.local_sgd.outer_momentum"});
    CHECK(keys(resume_changes(st, config_of({{"parallel", {{"zero", 1}}}}), 2, shards), true).empty());
    // so is PowerSGD
    CHECK(keys(resume_changes(st, config_of({{"parallel", {{"grad_compression", "powersgd"}, {"powersgd_rank", 8}}}}), 2,
                              shards),
               true) == Keys{"parallel.grad_compression", "parallel.powersgd_rank"});
}
