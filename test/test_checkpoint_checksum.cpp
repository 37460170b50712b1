// The checksums of a checkpoint's two files: XXH3-64 in what checkpoint_save writes (checked here
// with xxhash itself over the files' bytes); FNV-1a 64 in the checkpoints written before, which
// still load (test/data/checkpoint_fnv1a: written by train_gpt on 2026-11-25, the fuzz seed
// step2_fix0 of test/fuzz/make_seeds.sh), their corruption still found; another kind refused.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "llmc/io/checkpoint.h"
#include "llmc/model/param_table.h"
#include "test/temp_dir.h"
#include "test/test_data_files.h"
#include "test/user_error.h"

namespace {

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    REQUIRE(f.write(bytes.data(), std::streamsize(bytes.size())));
}
int32_t header_int(const std::string& state, int i) {
    REQUIRE(state.size() >= 32);
    int32_t x;
    std::memcpy(&x, state.data() + 4 * i, sizeof(x));
    return x;
}
uint64_t stored_checksum(const std::string& state) {
    uint64_t h;
    std::memcpy(&h, state.data() + 16, sizeof(h));
    return h;
}
nlohmann::json metadata(const std::string& state) {
    return nlohmann::json::parse(state.substr(32, size_t(header_int(state, 2))));
}
// FNV-1a 64, written here rather than taken from the code under test, with the offset basis that
// llmc/core/common.h has always used and the old files carry: 1469598103934665603, a digit short of
// the published 14695981039346656037 (as good a start for this purpose)
uint64_t fnv1a_64(const std::string& bytes, size_t from) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = from; i < bytes.size(); i++) h = (h ^ uint8_t(bytes[i])) * 1099511628211ull;
    return h;
}
// a copy of checkpoint folder src in dst, with byte `at` of `file` (if given) XORed with 0x01
void copy_flipped(const std::string& src, const std::string& dst, const std::string& file = "", size_t at = 0) {
    std::filesystem::copy(src, dst);
    if (file.empty()) return;
    std::string b = read_all(dst + "/" + file);
    REQUIRE(at < b.size());
    b[at] = char(b[at] ^ 1);
    write_all(dst + "/" + file, b);
}

}  // namespace

TEST_CASE("checkpoint: state.bin and model.bin carry XXH3-64 checksums; a flipped byte is found", "[checkpoint]") {
    const TempDir tmp("llmc_checksum");
    const ModelShape s{2, 2, 8, 100, 128, 16};
    WholeState w;
    for (std::vector<float>* x : {&w.params, &w.m, &w.v}) {
        x->resize(num_params(s));
        for (size_t i = 0; i < x->size(); i++) (*x)[i] = 1e-3f * float(i % 977) + float(x == &w.v);
    }
    TrainState st;
    st.step = 1;
    checkpoint_save(tmp.file("ck"), st, s, 3, w, nlohmann::json::object(), 1);
    const std::string ck = tmp.file("ck/step_00000001");
    const std::string state = read_all(ck + "/state.bin"), model = read_all(ck + "/model.bin");
    CHECK(header_int(state, 3) == CHECKSUM_XXH3);
    CHECK(stored_checksum(state) == XXH3_64bits(state.data() + 32, state.size() - 32));
    CHECK(metadata(state)["model_checksum"].get<uint64_t>() == XXH3_64bits(model.data(), model.size()));
    CHECK(checkpoint_checksum(CHECKSUM_XXH3, model.data(), model.size()) == XXH3_64bits(model.data(), model.size()));
    CHECK(checkpoint_checksum(CHECKSUM_FNV1A, model.data(), model.size()) == fnv1a_64(model, 0));
    WholeState back;
    CHECK(checkpoint_load(ck, s, &back).step == 1);
    CHECK(back.params == w.params);
    CHECK(back.v == w.v);

    copy_flipped(ck, tmp.file("bad_state"), "state.bin", state.size() - 3);  // in v
    std::string e = error_of([&] { checkpoint_load(tmp.file("bad_state"), s, &back); });
    CHECK_THAT(e, Catch::Contains(tmp.file("bad_state/state.bin")) && Catch::Contains("checksum mismatch"));
    copy_flipped(ck, tmp.file("bad_model"), "model.bin", model.size() - 3);
    e = error_of([&] { checkpoint_load(tmp.file("bad_model"), s, &back); });
    CHECK_THAT(e, Catch::Contains(tmp.file("bad_model/model.bin")) && Catch::Contains("checksum mismatch"));
}

TEST_CASE("checkpoint: one written before XXH3 (FNV-1a 64) still loads, and its corruption is still found",
          "[checkpoint]") {
    const std::string state_path = find_data_file("checkpoint_fnv1a/state.bin");
    const std::string src = state_path.substr(0, state_path.size() - std::string("/state.bin").size());
    const ModelShape s{1, 2, 8, 60, 128, 8};  // the fuzz seeds' model (test/fuzz/make_seeds.sh)
    const std::string state = read_all(src + "/state.bin"), model = read_all(src + "/model.bin");
    REQUIRE(header_int(state, 3) == CHECKSUM_FNV1A);
    REQUIRE(stored_checksum(state) == fnv1a_64(state, 32));
    REQUIRE(metadata(state)["model_checksum"].get<uint64_t>() == fnv1a_64(model, 0));
    WholeState back;
    const TrainState st = checkpoint_load(src, s, &back);
    CHECK(st.step == 2);
    CHECK(back.params.size() == num_params(s));
    CHECK(back.m.size() == num_params(s));

    const TempDir tmp("llmc_checksum");
    copy_flipped(src, tmp.file("bad_state"), "state.bin", state.size() - 3);
    std::string e = error_of([&] { checkpoint_load(tmp.file("bad_state"), s, &back); });
    CHECK_THAT(e, Catch::Contains("state.bin") && Catch::Contains("checksum mismatch"));
    copy_flipped(src, tmp.file("bad_model"), "model.bin", model.size() - 3);
    e = error_of([&] { checkpoint_load(tmp.file("bad_model"), s, &back); });
    CHECK_THAT(e, Catch::Contains("model.bin") && Catch::Contains("checksum mismatch"));

    // a kind this build does not know (a newer train_gpt's, or a damaged header) is named
    copy_flipped(src, tmp.file("kind"));
    std::string bumped = state;
    const int32_t kind = 7;
    std::memcpy(&bumped[12], &kind, sizeof(kind));
    write_all(tmp.file("kind/state.bin"), bumped);
    e = error_of([&] { checkpoint_load(tmp.file("kind"), s, &back); });
    CHECK_THAT(e, Catch::Contains(tmp.file("kind/state.bin")) && Catch::Contains("checksum kind 7"));
}

TEST_CASE("checkpoint: damage in the metadata is called corrupt; a well-formed bad field is named", "[checkpoint]") {
    // the load reads state.bin once, checking the metadata as it goes: a field that damage made
    // wrong (or JSON it made unreadable) must still be reported as the checksum mismatch it is,
    // while a file whose checksum holds names the field
    const TempDir tmp("llmc_checksum");
    const ModelShape s{2, 2, 8, 100, 128, 16};
    WholeState w;
    for (std::vector<float>* x : {&w.params, &w.m, &w.v}) x->assign(num_params(s), 0.5f);
    TrainState st;
    st.step = 3;
    checkpoint_save(tmp.file("ck"), st, s, 3, w, nlohmann::json::object(), 1);
    const std::string ck = tmp.file("ck/step_00000003");
    const std::string state = read_all(ck + "/state.bin");
    const size_t meta_end = 32 + size_t(header_int(state, 2));
    WholeState back;
    struct Flip {
        const char* what;
        size_t at;
    };
    for (const Flip& f : {Flip{"the opening brace (no JSON)", 32},
                          Flip{"the step's digit (step 2)", state.find("\"step\":3") + 7},
                          Flip{"num_params' first digit", state.find("\"num_params\":") + 13},
                          Flip{"loader_dp's digit (0: out of range)", state.find("\"loader_dp\":1") + 12}}) {
        INFO(f.what);
        REQUIRE(f.at < meta_end);
        const std::string dir = tmp.file("flip_" + std::to_string(f.at));
        copy_flipped(ck, dir, "state.bin", f.at);
        const std::string e = error_of([&] { checkpoint_load(dir, s, &back); });
        CHECK_THAT(e, Catch::Contains(dir + "/state.bin") && Catch::Contains("checksum mismatch"));
    }
    // the same loader_dp damage with the checksum made to match: the field is named
    std::string forged = state;
    const size_t at = forged.find("\"loader_dp\":1") + 12;
    forged[at] = '0';
    const uint64_t h = XXH3_64bits(forged.data() + 32, forged.size() - 32);
    std::memcpy(&forged[16], &h, sizeof(h));
    copy_flipped(ck, tmp.file("forged"));
    write_all(tmp.file("forged/state.bin"), forged);
    const std::string e = error_of([&] { checkpoint_load(tmp.file("forged"), s, &back); });
    CHECK_THAT(e, Catch::Contains("\"loader_dp\" is 0") && !Catch::Contains("checksum mismatch"));
    // and a file cut short in its arrays
    copy_flipped(ck, tmp.file("short"));
    write_all(tmp.file("short/state.bin"), state.substr(0, state.size() - 4));
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("short"), s, &back); }),
               Catch::Contains("short/state.bin") && Catch::Contains("checksum mismatch"));
}

namespace {
// A checkpoint folder's files made consistent again after an edit: model.bin's checksum into the
// metadata (re-serialised), state.bin's over everything after its header (XXH3, as written here)
void reseal(const std::string& dir) {
    const std::string model = read_all(dir + "/model.bin"), state = read_all(dir + "/state.bin");
    nlohmann::json meta = metadata(state);
    meta["model_checksum"] = XXH3_64bits(model.data(), model.size());
    const std::string meta_s = meta.dump();
    std::string out = state.substr(0, 32) + meta_s + state.substr(32 + size_t(header_int(state, 2)));
    const int32_t meta_len = int32_t(meta_s.size());
    std::memcpy(&out[8], &meta_len, sizeof(meta_len));
    const uint64_t h = XXH3_64bits(out.data() + 32, out.size() - 32);
    std::memcpy(&out[16], &h, sizeof(h));
    write_all(dir + "/state.bin", out);
}
std::vector<float> ramp(size_t n, float scale, float base) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = base + scale * float(i % 1013);
    return x;
}
}  // namespace

// World rank 0's check before a resume reads its pieces: checkpoint_load with no WholeState reads
// both files through a buffer, and must find what the whole load finds, with its very message:
// damage in each array (among them those it reads and drops: v, master, a local SGD replica, a
// PowerSGD error feedback), in the metadata, in model.bin, a file cut short or one too long,
// non-finite weights in a file whose checksums hold.
TEST_CASE("checkpoint_load without a WholeState checks what the whole load checks, with its messages",
          "[checkpoint]") {
    const TempDir tmp("llmc_verify");
    const ModelShape s{2, 2, 128, 100, 128, 16};
    const size_t n = num_params(s);
    REQUIRE(n * sizeof(float) > (size_t(1) << 20));  // each array more than one of the load's 1 MB reads
    WholeState w;
    w.params = ramp(n, 1e-3f, 0.0f);
    w.m = ramp(n, 1e-4f, -0.1f);
    w.v = ramp(n, 1e-5f, 1.0f);
    w.master = ramp(n, 1e-3f, 0.5f);
    w.local_sgd.anchor = ramp(n, 2e-3f, 0.0f);
    w.local_sgd.momentum = ramp(n, 3e-3f, 0.0f);
    w.local_sgd.replicas.push_back({ramp(n, 1e-3f, 2.0f), ramp(n, 1e-3f, 3.0f), ramp(n, 1e-3f, 4.0f),
                                    ramp(n, 1e-3f, 5.0f)});
    TrainState st;
    st.step = 5;
    const std::string local = checkpoint_save(tmp.file("local"), st, s, 5, w, nlohmann::json::object(), 1);
    WholeState p = w;
    p.local_sgd = {};
    p.powersgd.rank = 2;
    p.powersgd.errors = {ramp(n, 1e-3f, -1.0f), ramp(n, 1e-3f, -2.0f)};
    p.powersgd.q = ramp(300, 1.0f, 0.0f);
    st.step = 6;
    const std::string psgd = checkpoint_save(tmp.file("psgd"), st, s, 3, p, nlohmann::json::object(), 1);

    // intact: the step, and nothing else to hand out
    CHECK(checkpoint_load(local, s, nullptr).step == 5);
    CHECK(checkpoint_load(psgd, s, nullptr).step == 6);

    const std::string local_state = read_all(local + "/state.bin"), psgd_state = read_all(psgd + "/state.bin");
    const size_t arrays = 32 + size_t(header_int(local_state, 2)), bytes = n * sizeof(float);
    struct Case {
        std::string name;  // a folder under tmp
        std::string src, file;
        size_t at;
    };
    const size_t psgd_arrays = 32 + size_t(header_int(psgd_state, 2));
    const std::vector<Case> flips = {
        {"m", local, "state.bin", arrays + 5},
        {"v_end", local, "state.bin", arrays + 2 * bytes - 1},
        {"master", local, "state.bin", arrays + 2 * bytes + bytes / 2},
        {"momentum", local, "state.bin", arrays + 4 * bytes + 7},
        {"replica_master", local, "state.bin", local_state.size() - 9},
        {"meta", local, "state.bin", local_state.find("\"step\":5") + 7},
        {"model_bf16", local, "model.bin", 1024 + n},
        {"error_2", psgd, "state.bin", psgd_arrays + 4 * bytes + 11},
        {"q", psgd, "state.bin", psgd_state.size() - 1},
    };
    std::vector<std::string> dirs;
    for (const Case& c : flips) {
        copy_flipped(c.src, tmp.file(c.name), c.file, c.at);
        dirs.push_back(tmp.file(c.name));
    }
    // cut short by one float, and one float too long (both resealed: only the size is wrong)
    copy_flipped(psgd, tmp.file("short"));
    write_all(tmp.file("short/state.bin"), psgd_state.substr(0, psgd_state.size() - 4));
    reseal(tmp.file("short"));
    copy_flipped(local, tmp.file("long"));
    write_all(tmp.file("long/state.bin"), local_state + std::string(4, '\0'));
    reseal(tmp.file("long"));
    // a NaN and an Inf in the middle of a fp32 model.bin, the checksums made to hold
    copy_flipped(psgd, tmp.file("nan"));
    std::string model = read_all(psgd + "/model.bin");
    const float bad[2] = {NAN, INFINITY};
    std::memcpy(&model[1024 + 4 * (n / 2)], bad, sizeof(bad));
    write_all(tmp.file("nan/model.bin"), model);
    reseal(tmp.file("nan"));
    for (const char* d : {"short", "long", "nan"}) dirs.push_back(tmp.file(d));

    for (const std::string& dir : dirs) {
        INFO(dir);
        WholeState back;
        const std::string whole_error = error_of([&] { checkpoint_load(dir, s, &back); });
        REQUIRE_FALSE(whole_error.empty());
        CHECK(error_of([&] { checkpoint_load(dir, s, nullptr); }) == whole_error);
    }
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("replica_master"), s, nullptr); }),
               Catch::Contains("replica_master/state.bin: checksum mismatch"));
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("error_2"), s, nullptr); }),
               Catch::Contains("error_2/state.bin: checksum mismatch"));
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("model_bf16"), s, nullptr); }),
               Catch::Contains("model_bf16/model.bin: checksum mismatch"));
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("long"), s, nullptr); }),
               Catch::Contains("truncated or wrong size"));
    CHECK_THAT(error_of([&] { checkpoint_load(tmp.file("nan"), s, nullptr); }),
               Catch::Contains("nan/model.bin: 2 of " + std::to_string(n) + " parameters are not finite"));
}
