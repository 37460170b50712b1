// llm.c model files: write/read round trips (fp32 version 3, bf16 version 5), shape checks,
// and the mapping between llm.c tensor order and the model's per-layer memory order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <memory>
#include <string>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/model/model.h"
#include "llmc/io/model_file.h"
#include "llmc/precision/bf16.h"
#include "llmc/core/rng.h"
#include "test/temp_dir.h"
#include "test/user_error.h"
#include "test/whole_model.h"

namespace {
ModelShape tiny_shape() { return ModelShape{2, 2, 8, 100, 128, 16}; }
std::vector<float> random_params(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = rng.normal();
    return v;
}
}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even") {
    CHECK(f32_to_bf16_bits(1.0f) == 0x3F80);
    // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even mantissa (1.0)
    CHECK(f32_to_bf16_bits(1.00390625f) == 0x3F80);
    // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even
    CHECK(f32_to_bf16_bits(1.01171875f) == 0x3F82);
    CHECK(f32_to_bf16_bits(-2.0f) == 0xC000);
    CHECK(bf16_bits_to_f32(0x3F82) == 1.015625f);
    CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(NAN))));
}

TEST_CASE("llm.c model file round trip, version 3 and 5") {
    const ModelShape s = tiny_shape();
    const size_t n = num_params(s);
    // 2 layers of 12*C^2 + 13*C, wte, wpe, lnf: the GPT-2 count
    CHECK(n == size_t(128 * 8 + 16 * 8 + 2 * (12 * 64 + 13 * 8) + 2 * 8));
    std::vector<float> w = random_params(n, 7);
    const TempDir tmp("llmc_modelfile");
    const std::string p3 = tmp.file("m3.bin");
    model_file_write(p3, s, w.data(), 3);
    int version = 0;
    CHECK(model_file_shape(p3, &version) == s);
    CHECK(version == 3);
    CHECK(model_file_read(p3, &s) == w);

    const std::string p5 = tmp.file("m5.bin");
    model_file_write(p5, s, w.data(), 5);
    std::vector<float> r = model_file_read(p5, &s);
    REQUIRE(r.size() == n);
    for (size_t i = 0; i < n; i++) {
        CHECK(r[i] == bf16_bits_to_f32(f32_to_bf16_bits(w[i])));
        REQUIRE(std::fabs(r[i] - w[i]) <= std::fabs(w[i]) * (1.0f / 256));
    }
}

TEST_CASE("llm.c model file: shape mismatch and damage are user errors naming the field or file") {
    const ModelShape s = tiny_shape();
    std::vector<float> w = random_params(num_params(s), 1);
    const TempDir tmp("llmc_modelfile");
    const std::string p = tmp.file("m.bin");
    model_file_write(p, s, w.data(), 3);
    ModelShape other = s;
    other.n_layer = 3;
    CHECK_THROWS_WITH(model_file_read(p, &other), Catch::Contains("model.n_layer") && Catch::Contains("m.bin"));
    other = s;
    other.d_model = 16;
    CHECK_THROWS_WITH(model_file_read(p, &other), Catch::Contains("model.d_model"));
    // truncated
    std::FILE* f = std::fopen(p.c_str(), "r+b");
    REQUIRE(f);
    REQUIRE(ftruncate(fileno(f), 2000) == 0);
    std::fclose(f);
    CHECK_THROWS_WITH(model_file_read(p, &s), Catch::Contains("truncated"));
    // wrong magic
    f = std::fopen(p.c_str(), "r+b");
    int32_t bad = 1234;
    std::fwrite(&bad, 4, 1, f);
    std::fclose(f);
    CHECK_THROWS_WITH(model_file_read(p, &s), Catch::Contains("magic"));
    CHECK_THROWS_AS(model_file_read(tmp.file("absent.bin"), &s), UserError);
}

TEST_CASE("model memory order <-> llm.c order is a permutation that round-trips") {
    const ModelShape s = tiny_shape();
    auto ops = make_cpu_ops();
    WholeModel wm(s, *ops, 1, 4);
    Model& model = wm.model;
    std::vector<float> w = random_params(model.params.num_params, 3), back(model.params.num_params);
    model.set_params_whole(w.data());
    model.get_params_whole(back.data());
    CHECK(back == w);
    // llm.c order: all wte, then all wpe, then every layer's ln1w, ...: check two tensors by hand
    std::vector<float> mem(model.params.num_params);
    ops->to_host_f32(mem.data(), wm.store.params);
    const size_t off = model.spec(QkvW, 1).offset;
    const size_t C = s.d_model, Vp = s.padded_vocab, T = s.max_seq_len, L = s.n_layer;
    const size_t llmc_qkvw = Vp * C + T * C + 2 * L * C;  // after wte, wpe, ln1w, ln1b
    for (size_t i = 0; i < 3 * C * C; i++) REQUIRE(mem[off + i] == w[llmc_qkvw + 3 * C * C + i]);
    const size_t off_lnfb = model.spec(NormFB).offset;
    for (size_t i = 0; i < C; i++) REQUIRE(mem[off_lnfb + i] == w[model.params.num_params - C + i]);
}

TEST_CASE("llm.c model file: header dimensions whose arithmetic would overflow are refused (found by fuzzing)") {
    const ModelShape s = tiny_shape();
    std::vector<float> w = random_params(num_params(s), 1);
    const TempDir tmp("llmc_modelfile");
    const std::string p = tmp.file("huge.bin");
    model_file_write(p, s, w.data(), 3);
    // d_model (header slot 6) = 2^30 + 8: 4 d_model overflows int; n_head 2 divides it
    std::FILE* f = std::fopen(p.c_str(), "r+b");
    REQUIRE(f);
    const int32_t d = 1073741832;
    std::fseek(f, 6 * 4, SEEK_SET);
    std::fwrite(&d, 4, 1, f);
    std::fclose(f);
    CHECK_THROWS_WITH(model_file_read(p, nullptr), Catch::Contains("huge.bin") && Catch::Contains("invalid shape"));
    // within the limits, a header describing far more parameters than the file holds
    const int32_t layers = 1 << 26;
    f = std::fopen(p.c_str(), "r+b");
    std::fseek(f, 6 * 4, SEEK_SET);
    std::fwrite(&s.d_model, 4, 1, f);
    std::fseek(f, 4 * 4, SEEK_SET);
    std::fwrite(&layers, 4, 1, f);
    std::fclose(f);
    CHECK_THROWS_WITH(model_file_read(p, nullptr), Catch::Contains("truncated or corrupt"));
}

TEST_CASE("llm.c model file: non-finite weights are refused naming the file") {
    const ModelShape s = tiny_shape();
    std::vector<float> w = random_params(num_params(s), 1);
    w[5] = NAN;
    w[9] = INFINITY;
    const TempDir tmp("llmc_modelfile");
    const std::string p = tmp.file("nan.bin");
    model_file_write(p, s, w.data(), 3);
    CHECK_THROWS_WITH(model_file_read(p, &s), Catch::Contains("nan.bin") && Catch::Contains("2 of") &&
                                                  Catch::Contains("tensor wte element 5"));
}

TEST_CASE("mixture of experts: model file header, mismatch names the key, expert tensors' file and memory order",
          "[moe]") {
    ModelShape s = tiny_shape();  // C 8, 2 layers
    s.moe.num_experts = 3;
    s.moe.top_k = 2;
    s.moe.expert_ffn_dim = 4;
    s.moe.every = 2;  // layer 1 is MoE, layer 0 dense
    const size_t C = 8, Fe = 4, E = 3, L = 2, Vp = 128, T = 16;
    // layer 1's dense MLP (8C^2 + 5C) is replaced by the router (E C) and E experts (2 Fe C + Fe + C)
    CHECK(num_params(s) == num_params(tiny_shape()) - (8 * C * C + 5 * C) + E * C + E * (2 * Fe * C + Fe + C));
    std::vector<float> w = random_params(num_params(s), 5);
    const TempDir tmp("llmc_modelfile");
    const std::string p = tmp.file("moe.bin");
    model_file_write(p, s, w.data(), 3);
    CHECK(model_file_shape(p) == s);
    CHECK(model_file_read(p, &s) == w);
    ModelShape other = s;
    other.moe.num_experts = 4;
    CHECK_THROWS_WITH(model_file_read(p, &other), Catch::Contains("model.moe.num_experts"));
    const ModelShape dense = tiny_shape();
    CHECK_THROWS_WITH(model_file_read(p, &dense), Catch::Contains("model.moe"));
    // a header at the limits (2^26 layers of 4096 experts): refused by size, without listing the tensors
    std::FILE* f = std::fopen(p.c_str(), "r+b");
    REQUIRE(f);
    const int32_t layers = 1 << 26, experts = 4096, width = 1 << 26;
    std::fseek(f, 4 * 4, SEEK_SET);
    std::fwrite(&layers, 4, 1, f);
    std::fseek(f, 14 * 4, SEEK_SET);
    std::fwrite(&experts, 4, 1, f);
    std::fseek(f, 16 * 4, SEEK_SET);
    std::fwrite(&width, 4, 1, f);
    std::fclose(f);
    CHECK_THROWS_WITH(model_file_read(p, nullptr), Catch::Contains("truncated or corrupt"));

    auto ops = make_cpu_ops();
    WholeModel wm(s, *ops, 1, 4);
    Model& model = wm.model;
    CHECK_FALSE(model.holds(FcW, 1));
    CHECK(model.holds(FcW, 0));
    CHECK(model.holds(FcW, 1, 2));
    CHECK_FALSE(model.holds(FcW, 0, 0));
    CHECK(model.holds(RouterW, 1));
    CHECK_FALSE(model.holds(RouterW, 0));
    // file order: the declarations in order, each over its layers (and experts, layer-major)
    const ParamSpec& e1 = model.spec(FcW, 1, 1);
    CHECK(e1.name == "h.1.moe.e1.fcw");
    const size_t attn_and_norms = L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C);
    const size_t dense_mlp = 4 * C * C + 4 * C + 4 * C * C + C;  // layer 0's fcw, fcb, fcprojw, fcprojb
    CHECK(e1.file_offset == Vp * C + T * C + attn_and_norms + dense_mlp + E * C + 1 * Fe * C);
    // memory order: one expert's tensors adjacent, expert after expert
    for (size_t e = 0; e < E; e++) {
        const ParamSpec &fcw = model.spec(FcW, 1, int(e)), &out_b = model.spec(FcOutB, 1, int(e));
        CHECK(model.spec(FcB, 1, int(e)).offset == fcw.offset + fcw.numel);
        if (e + 1 < E) CHECK(model.spec(FcW, 1, int(e) + 1).offset == out_b.offset + out_b.numel);
    }
    std::vector<float> back(model.params.num_params);
    model.set_params_whole(w.data());
    model.get_params_whole(back.data());
    CHECK(back == w);
}

// What a rank reads of a model file when it takes its part (model.init; a checkpoint's model.bin)
// and world rank 0's check of the whole file in constant memory: model_file_pieces hands out any
// window of model_file_read's weights (fp32 and bf16), reading exactly that window's bytes;
// model_file_scan finds what model_file_read finds, with its message.
TEST_CASE("llm.c model file in pieces: any window reads what the whole read holds; the scan checks the whole") {
    const ModelShape s{2, 2, 128, 100, 128, 16};  // (so that the scan reads several of its pieces)
    const size_t n = num_params(s);
    REQUIRE(n > (size_t(1) << 18));
    std::vector<float> w = random_params(n, 11);
    const TempDir tmp("llmc_modelfile");
    for (int version : {3, 5}) {
        INFO("version " << version);
        const std::string p = tmp.file("m" + std::to_string(version) + ".bin");
        model_file_write(p, s, w.data(), version);
        const std::vector<float> whole = model_file_read(p, &s);
        auto bytes = std::make_shared<size_t>(0);
        const ReadFileOrder read = model_file_pieces(p, &s, bytes);
        const size_t elem = version == 3 ? 4 : 2;
        size_t want_bytes = 0;
        for (const std::pair<size_t, size_t>& win : {std::pair<size_t, size_t>{0, 1}, {5, 1000}, {n - 3, 3},
                                                     {(size_t(1) << 18) - 7, 20}, {0, n}}) {
            std::vector<float> got(win.second, -1.0f);
            read(win.first, win.second, got.data());
            CHECK(std::equal(got.begin(), got.end(), whole.begin() + long(win.first)));
            want_bytes += win.second * elem;
            CHECK(*bytes == want_bytes);
        }
        CHECK_NOTHROW(model_file_scan(p, &s));
        // the scan sees every byte, as the read does (a checkpoint's checksum)
        size_t seen_scan = 0, seen_read = 0;
        model_file_scan(p, &s, [&](const void*, size_t k) { seen_scan += k; });
        model_file_read(p, &s, [&](const void*, size_t k) { seen_read += k; });
        CHECK(seen_scan == 1024 + n * elem);
        CHECK(seen_read == seen_scan);
    }
    // a NaN past the scan's first piece and an Inf at the end: the whole read's message
    std::vector<float> bad = w;
    bad[300000] = NAN;
    bad[n - 1] = -INFINITY;
    const std::string p = tmp.file("bad.bin");
    model_file_write(p, s, bad.data(), 3);
    const std::string whole_error = error_of([&] { model_file_read(p, &s); });
    const std::string scan_error = error_of([&] { model_file_scan(p, &s); });
    CHECK_THAT(whole_error, Catch::Contains("bad.bin: 2 of " + std::to_string(n) + " parameters are not finite"));
    CHECK(scan_error == whole_error);
    // the pieces check the header and the size first, naming the field; a file cut after it was
    // opened names the file at the read that comes short
    ModelShape other = s;
    other.n_layer = 3;
    CHECK_THROWS_WITH(model_file_pieces(p, &other), Catch::Contains("bad.bin") && Catch::Contains("model.n_layer"));
    const std::string cut = tmp.file("cut.bin");
    model_file_write(cut, s, w.data(), 3);
    const ReadFileOrder read = model_file_pieces(cut, &s);
    REQUIRE(truncate(cut.c_str(), 4096) == 0);
    std::vector<float> out(10);
    CHECK_THROWS_WITH(read(n - 10, 10, out.data()), Catch::Contains("model file " + cut + ": truncated"));
}
