// GPT-2 in transformers' format (llmc/io/hf_format.h): the export's names, shapes and transposed
// Conv1D weights at hand-computed positions, the round trip, what the reader accepts and refuses,
// config.json; and parity of a GPT2LMHeadModel file with the independent PyTorch forward of
// dev/reference/gpt2_hf_reference.py, which writes
//   test/data/gpt2_hf_model.safetensors  a tiny GPT-2 as transformers stores it (Conv1D weights
//     [in, out], vocabulary 61 unpadded, lm_head.weight equal to wte, attn.bias/masked_bias buffers)
//   test/data/gpt2_hf_state.safetensors  tokens, targets [B, T], logits [B, T, V], loss [1] of that model.
// Regenerate with: /usr/bin/python3 dev/reference/gpt2_hf_reference.py
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/core/common.h"
#include "llmc/io/hf_format.h"
#include "llmc/model/model.h"
#include "llmc/backend/ops.h"
#include "llmc/io/safetensors.h"
#include "test/temp_dir.h"
#include "test/test_data_files.h"
#include "test/user_error.h"
#include "test/whole_model.h"

namespace {

// L=2, NH=2, C=4, vocabulary 5 (padded to 128), 3 positions. The whole vector in llm.c's order
// (offsets written out below by hand) holds distinct values; the padded wte rows are zero.
ModelShape tiny_shape() {
    ModelShape s;
    s.arch = Arch::GPT2;
    s.n_layer = 2, s.n_head = 2, s.d_model = 4, s.vocab_size = 5, s.padded_vocab = 128, s.max_seq_len = 3;
    return s;
}
// llm.c order: wte 128x4, wpe 3x4, ln1w 2x4, ln1b 2x4, qkvw 2x12x4, qkvb 2x12, attprojw 2x4x4,
// attprojb 2x4, ln2w 2x4, ln2b 2x4, fcw 2x16x4, fcb 2x16, fcprojw 2x4x16, fcprojb 2x4, lnfw 4, lnfb 4
constexpr size_t kWpe = 512, kLn1w = 524, kLn1b = 532, kQkvw = 540, kQkvb = 636, kAttw = 660, kAttb = 692,
                 kLn2w = 700, kLn2b = 708, kFcw = 716, kFcb = 844, kFcprojw = 876, kFcprojb = 1004, kLnfw = 1012,
                 kLnfb = 1016, kTotal = 1020;

std::vector<float> tiny_whole() {
    std::vector<float> w(kTotal, 0.0f);
    for (size_t i = 0; i < kTotal; i++)
        if (i < 5 * 4 || i >= kWpe) w[i] = 0.5f + float(i);
    return w;
}

// The file's tensor `name` (F32) as floats, and its shape.
std::vector<float> file_tensor(const SafetensorsReader& r, const std::string& name, std::vector<int64_t> shape) {
    INFO("tensor " << name);
    REQUIRE(r.has(name));
    CHECK(r.entry(name).shape == shape);
    CHECK(r.entry(name).dtype == "F32");
    return r.read(name);
}

// A copy of file `from` with tensors changed: `drop` left out, `add` added (F32).
struct Extra {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};
std::string rewrite(const std::string& from, const std::string& to, const std::set<std::string>& drop,
                    const std::vector<Extra>& add) {
    const SafetensorsReader r(from);
    SafetensorsWriter w;
    for (const auto& kv : r.entries()) {
        if (drop.count(kv.first)) continue;
        const std::vector<float> v = r.read(kv.first);
        w.add(kv.first, kv.second.shape, v.data());
    }
    for (const Extra& e : add) w.add(e.name, e.shape, e.data.data());
    w.write(to);
    return to;
}

}  // namespace

TEST_CASE("gpt2 hf: export names, shapes and transposed Conv1D weights at hand-computed positions", "[gpt2_hf]") {
    const ModelShape s = tiny_shape();
    REQUIRE(num_params(s) == kTotal);
    const std::vector<float> whole = tiny_whole();
    const TempDir tmp("llmc_gpt2_hf");
    const std::string dir = tmp.path, path = dir + "/m.safetensors";
    hf_write_weights(path, s, whole);
    const SafetensorsReader r(path);

    std::set<std::string> names;
    for (const auto& kv : r.entries()) names.insert(kv.first);
    std::set<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                  "transformer.ln_f.bias"};
    for (int l = 0; l < 2; l++)
        for (const char* k : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                              "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                              "mlp.c_proj.weight", "mlp.c_proj.bias"})
            want.insert("transformer.h." + std::to_string(l) + "." + k);
    CHECK(names == want);  // no lm_head.weight: tied

    // not transposed: wte (real rows only), wpe, vectors
    std::vector<float> t = file_tensor(r, "transformer.wte.weight", {5, 4});
    CHECK(std::equal(t.begin(), t.end(), whole.begin()));
    t = file_tensor(r, "transformer.wpe.weight", {3, 4});
    CHECK(std::equal(t.begin(), t.end(), whole.begin() + kWpe));
    const struct {
        const char* name;
        size_t at, n;
    } vecs[] = {{"transformer.h.0.ln_1.weight", kLn1w, 4},        {"transformer.h.1.ln_1.bias", kLn1b + 4, 4},
                {"transformer.h.1.attn.c_attn.bias", kQkvb + 12, 12}, {"transformer.h.0.attn.c_proj.bias", kAttb, 4},
                {"transformer.h.1.ln_2.weight", kLn2w + 4, 4},     {"transformer.h.0.ln_2.bias", kLn2b, 4},
                {"transformer.h.1.mlp.c_fc.bias", kFcb + 16, 16},  {"transformer.h.1.mlp.c_proj.bias", kFcprojb + 4, 4},
                {"transformer.ln_f.weight", kLnfw, 4},             {"transformer.ln_f.bias", kLnfb, 4}};
    for (const auto& v : vecs) {
        t = file_tensor(r, v.name, {int64_t(v.n)});
        CHECK(std::equal(t.begin(), t.end(), whole.begin() + long(v.at)));
    }
    // transposed: the file's [in, out] element (i, o) is our [out, in] element (o, i)
    struct Conv {
        const char* name;
        size_t at, out, in;
    };
    const Conv convs[] = {{"transformer.h.1.attn.c_attn.weight", kQkvw + 48, 12, 4},
                          {"transformer.h.0.attn.c_proj.weight", kAttw, 4, 4},
                          {"transformer.h.1.mlp.c_fc.weight", kFcw + 64, 16, 4},
                          {"transformer.h.0.mlp.c_proj.weight", kFcprojw, 4, 16}};
    for (const Conv& c : convs) {
        t = file_tensor(r, c.name, {int64_t(c.in), int64_t(c.out)});
        for (size_t i = 0; i < c.in; i++)
            for (size_t o = 0; o < c.out; o++) {
                INFO(c.name << " [" << i << ", " << o << "]");
                CHECK(t[i * c.out + o] == whole[c.at + o * c.in + i]);
            }
    }
    // single elements, by hand: c_attn.weight of layer 1 at [1, 2] is qkvw row 2, column 1 of
    // layer 1 (540 + 48 + 2*4 + 1 = 597); mlp.c_proj.weight of layer 0 at [9, 3] is fcprojw
    // row 3, column 9 (876 + 3*16 + 9 = 933)
    t = r.read("transformer.h.1.attn.c_attn.weight");
    CHECK(t[1 * 12 + 2] == 597.5f);
    t = r.read("transformer.h.0.mlp.c_proj.weight");
    CHECK(t[9 * 4 + 3] == 933.5f);

    // and back, bit for bit (padded rows zero)
    const std::vector<float> back = hf_read_weights(path, s);
    REQUIRE(back.size() == whole.size());
    CHECK(std::memcmp(back.data(), whole.data(), whole.size() * sizeof(float)) == 0);
}

TEST_CASE("gpt2 hf: the reader accepts a tied lm_head, buffers and base-model names, refuses wrong files naming the tensor",
          "[gpt2_hf]") {
    const ModelShape s = tiny_shape();
    const std::vector<float> whole = tiny_whole();
    const TempDir tmp("llmc_gpt2_hf");
    const std::string dir = tmp.path, base = dir + "/base.safetensors";
    hf_write_weights(base, s, whole);
    const std::vector<float> wte(whole.begin(), whole.begin() + 20);

    const std::string extras =
        rewrite(base, dir + "/extras.safetensors", {},
                {{"lm_head.weight", {5, 4}, wte},
                 {"transformer.h.0.attn.bias", {1, 1, 3, 3}, {1, 0, 0, 1, 1, 0, 1, 1, 1}},
                 {"transformer.h.1.attn.masked_bias", {}, {-1e4f}}});
    std::vector<float> back = hf_read_weights(extras, s);
    CHECK(std::memcmp(back.data(), whole.data(), whole.size() * sizeof(float)) == 0);

    // the base model's names (GPT2Model, as the Hub's gpt2 stores them): no "transformer." prefix
    {
        const SafetensorsReader r(base);
        SafetensorsWriter w;
        for (const auto& kv : r.entries()) {
            REQUIRE(kv.first.rfind("transformer.", 0) == 0);
            const std::vector<float> v = r.read(kv.first);
            w.add(kv.first.substr(12), kv.second.shape, v.data());
        }
        w.add("h.0.attn.bias", {1, 1, 3, 3}, std::vector<float>(9, 1.0f).data());
        w.write(dir + "/bare.safetensors");
    }
    back = hf_read_weights(dir + "/bare.safetensors", s);
    CHECK(std::memcmp(back.data(), whole.data(), whole.size() * sizeof(float)) == 0);

    std::vector<float> other = wte;
    other[7] += 1.0f;
    const std::string head = rewrite(base, dir + "/head.safetensors", {}, {{"lm_head.weight", {5, 4}, other}});
    std::string e = error_of([&] { hf_read_weights(head, s); });
    CHECK_THAT(e, Catch::Contains(head) && Catch::Contains("lm_head.weight") &&
                      Catch::Contains("transformer.wte.weight"));

    // c_attn stored the other way round ([out, in], as in our .bin)
    const std::string c = "transformer.h.0.attn.c_attn.weight";
    const std::string untransposed =
        rewrite(base, dir + "/untr.safetensors", {c}, {{c, {12, 4}, std::vector<float>(48, 0.0f)}});
    e = error_of([&] { hf_read_weights(untransposed, s); });
    CHECK_THAT(e, Catch::Contains(c) && Catch::Contains("[12, 4]") && Catch::Contains("[4, 12]"));

    const std::string missing = rewrite(base, dir + "/missing.safetensors", {"transformer.ln_f.bias"}, {});
    e = error_of([&] { hf_read_weights(missing, s); });
    CHECK_THAT(e, Catch::Contains(missing) && Catch::Contains("transformer.ln_f.bias"));

    const std::string more =
        rewrite(base, dir + "/more.safetensors", {}, {{"transformer.h.2.ln_1.weight", {4}, {1, 1, 1, 1}}});
    e = error_of([&] { hf_read_weights(more, s); });
    CHECK_THAT(e, Catch::Contains("transformer.h.2.ln_1.weight") && Catch::Contains("not part of"));

    // a non-finite weight is named as the file names it, not by our internal name (qkvb; issue 34)
    const std::string b = "transformer.h.0.attn.c_attn.bias";
    std::vector<float> nan_bias(12, 0.5f);
    nan_bias[5] = NAN;
    nan_bias[9] = INFINITY;
    const std::string nonfinite = rewrite(base, dir + "/nan.safetensors", {b}, {{b, {12}, nan_bias}});
    e = error_of([&] { hf_read_weights(nonfinite, s); });
    CHECK_THAT(e, Catch::Contains(nonfinite) && Catch::Contains("tensor " + b + ": 2 of its 12 elements are not finite") &&
                      Catch::Contains("element 5, nan"));

    ModelShape wider = s;  // a file of another shape
    wider.max_seq_len = 4;
    e = error_of([&] { hf_read_weights(base, wider); });
    CHECK_THAT(e, Catch::Contains("transformer.wpe.weight") && Catch::Contains("[3, 4]") && Catch::Contains("[4, 4]"));

    // model.init in pieces: world rank 0's check (hf_check_weights, a tensor at a time, nothing
    // kept) finds each of these with the whole read's message; every rank's reader
    // (hf_weights_pieces) those of the names and shapes, before any read
    for (const std::string& f : {head, untransposed, missing, more, nonfinite}) {
        INFO(f);
        CHECK(error_of([&] { hf_check_weights(f, s); }) == error_of([&] { hf_read_weights(f, s); }));
    }
    for (const std::string& f : {untransposed, missing}) {
        INFO(f);
        CHECK(error_of([&] { hf_weights_pieces(f, s); }) == error_of([&] { hf_read_weights(f, s); }));
    }
    CHECK(error_of([&] { hf_weights_pieces(base, wider); }) == e);
    CHECK_NOTHROW(hf_check_weights(extras, s));
    CHECK_NOTHROW(hf_check_weights(dir + "/bare.safetensors", s));
    // any window of the file order, across tensors, into the padded vocabulary rows (zero) and
    // through the transposed Conv1D weights, is the whole read's
    for (const std::string& f : {base, extras, dir + "/bare.safetensors"}) {
        INFO(f);
        const ReadFileOrder read = hf_weights_pieces(f, s);
        for (size_t first = 0; first < kTotal; first++)
            for (const size_t n : {size_t(1), size_t(3), size_t(17), size_t(130)}) {
                if (first + n > kTotal) continue;
                std::vector<float> got(n, -7.0f);
                read(first, n, got.data());
                REQUIRE(std::equal(got.begin(), got.end(), whole.begin() + long(first)));
            }
        std::vector<float> all(kTotal, -7.0f);
        read(0, kTotal, all.data());
        CHECK(all == whole);
    }

}

TEST_CASE("gpt2 hf: config.json is a GPT2LMHeadModel config of the shape", "[gpt2_hf]") {
    ModelShape s = tiny_shape();
    const TempDir tmp("llmc_gpt2_hf");
    const std::string dir = tmp.path, path = dir + "/config.json";
    hf_write_config(path, s);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    CHECK(j["architectures"] == nlohmann::json::array({"GPT2LMHeadModel"}));
    CHECK(j["model_type"] == "gpt2");
    CHECK(j["n_embd"] == 4);
    CHECK(j["n_layer"] == 2);
    CHECK(j["n_head"] == 2);
    CHECK(j["n_positions"] == 3);
    CHECK(j["vocab_size"] == 5);
    CHECK(j["layer_norm_epsilon"] == 1e-5);
    CHECK(j["activation_function"] == "gelu_new");
    CHECK(j["tie_word_embeddings"] == true);
    CHECK(!j.contains("eos_token_id"));  // 50256 is not in a 5-token vocabulary
    s.vocab_size = 50257, s.padded_vocab = 50304;
    hf_write_config(path, s);
    j = nlohmann::json::parse(std::ifstream(path));
    CHECK(j["vocab_size"] == 50257);
    CHECK(j["eos_token_id"] == 50256);
}

TEST_CASE("gpt2 hf: a GPT2LMHeadModel file loads and gives the PyTorch reference's logits; our export equals it",
          "[gpt2_hf]") {
    const std::string model_path = find_data_file("gpt2_hf_model.safetensors");
    const SafetensorsReader m(model_path), st(find_data_file("gpt2_hf_state.safetensors"));
    auto meta = [](const SafetensorsReader& r, const char* k) { return std::stoi(r.metadata().at(k)); };
    ModelShape s;
    s.arch = Arch::GPT2;
    s.n_layer = meta(m, "n_layer"), s.n_head = meta(m, "n_head"), s.d_model = meta(m, "d_model");
    s.vocab_size = meta(m, "vocab_size"), s.max_seq_len = meta(m, "max_seq_len");
    s.padded_vocab = (s.vocab_size + 127) / 128 * 128;
    REQUIRE(s.vocab_size % 128 != 0);  // the padding is exercised
    const int B = meta(st, "B"), T = meta(st, "T"), V = s.vocab_size;
    // what transformers may save beside the weights is there, and is ignored
    REQUIRE(m.has("lm_head.weight"));
    REQUIRE(m.has("transformer.h.0.attn.bias"));

    const std::vector<float> whole = hf_read_weights(model_path, s);  // model.init's path
    auto ops = make_cpu_ops();
    WholeModel wm(s, *ops, B, T);
    Model& model = wm.model;
    model.set_params_whole(whole.data());
    auto ids = [&](const char* name) {
        const std::vector<float> f = st.read(name);
        REQUIRE(f.size() == size_t(B) * T);
        return std::vector<int32_t>(f.begin(), f.end());
    };
    const std::vector<int32_t> x = ids("tokens"), y = ids("targets");
    const float loss = model.forward(x.data(), y.data(), B, T, 0.0f);
    const float ref_loss = st.read("loss").at(0);
    INFO("loss " << loss << ", reference " << ref_loss);
    CHECK(std::fabs(loss - ref_loss) <= 1e-5 * std::fabs(ref_loss));
    std::vector<float> logits(size_t(B) * T * V);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) model.get_logits(b, t, &logits[(size_t(b) * T + t) * V]);
    const std::vector<float> ref = st.read("logits");
    REQUIRE(ref.size() == logits.size());
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        dmax = std::max(dmax, std::fabs(double(logits[i]) - ref[i]));
        rmax = std::max(rmax, std::fabs(double(ref[i])));
    }
    INFO("max |logit - reference| " << dmax << ", max |reference| " << rmax);
    CHECK(rmax > 1.0);
    CHECK(dmax <= 1e-5 * rmax);

    // our export of the loaded model holds the file's tensors bit for bit (and no extras)
    std::vector<float> out(model.params.num_params);
    model.get_params_whole(out.data());
    const TempDir tmp("llmc_gpt2_hf");
    const std::string dir = tmp.path, path = dir + "/export.safetensors";
    hf_write_weights(path, s, out);
    const SafetensorsReader ours(path);
    size_t params_in_ref = 0;
    for (const auto& kv : m.entries()) {
        const std::string& n = kv.first;
        if (n == "lm_head.weight" || n.find(".attn.bias") != std::string::npos ||
            n.find(".attn.masked_bias") != std::string::npos)
            continue;
        params_in_ref++;
        INFO("tensor " << n);
        REQUIRE(ours.has(n));
        CHECK(ours.entry(n).shape == kv.second.shape);
        CHECK(ours.read(n) == m.read(n));
    }
    CHECK(ours.entries().size() == params_in_ref);
}

// A model sharded over several files (transformers' from_pretrained past max_shard_size):
// model.init names the index, model.safetensors.index.json, whose "weight_map" places each tensor
// in a shard beside it. Read whole, checked, and in pieces as one file is; an index and shards that
// disagree, or an index that is not one, are refused naming the file and the tensor.
TEST_CASE("gpt2 hf: a sharded model loads through its index; index and shards that disagree are refused",
          "[gpt2_hf]") {
    const ModelShape s = tiny_shape();
    const std::vector<float> whole = tiny_whole();
    const TempDir tmp("llmc_gpt2_hf");
    const std::string dir = tmp.path, one = dir + "/one.safetensors";
    hf_write_weights(one, s, whole);
    // the layers' tensors in shard 2, the rest in shard 1
    nlohmann::json map = nlohmann::json::object();
    std::set<std::string> layers, rest;
    const SafetensorsReader r(one);
    for (const auto& kv : r.entries()) {
        const bool layer = kv.first.find(".h.") != std::string::npos;
        (layer ? layers : rest).insert(kv.first);
        map[kv.first] = layer ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    rewrite(one, dir + "/model-00001-of-00002.safetensors", layers, {});
    rewrite(one, dir + "/model-00002-of-00002.safetensors", rest, {});
    auto write_index = [&](const std::string& name, const nlohmann::json& j) {
        std::ofstream(dir + "/" + name) << j.dump();
        return dir + "/" + name;
    };
    const std::string index = write_index("model.safetensors.index.json",
                                          {{"metadata", {{"total_size", 4 * kTotal}}}, {"weight_map", map}});
    CHECK(is_safetensors(index));
    CHECK_FALSE(is_safetensors(dir + "/model.index.json"));
    CHECK(hf_read_weights(index, s) == whole);
    CHECK_NOTHROW(hf_check_weights(index, s));
    const ReadFileOrder read = hf_weights_pieces(index, s);
    for (size_t first = 0; first < kTotal; first += 5) {
        const size_t n = std::min<size_t>(211, kTotal - first);
        std::vector<float> got(n, -7.0f);
        read(first, n, got.data());
        REQUIRE(std::equal(got.begin(), got.end(), whole.begin() + long(first)));
    }

    nlohmann::json moved = map;  // the index places ln_f.bias in the shard without it
    moved["transformer.ln_f.bias"] = "model-00002-of-00002.safetensors";
    std::string bad = write_index("moved.safetensors.index.json", {{"weight_map", moved}});
    CHECK_THAT(error_of([&] { hf_read_weights(bad, s); }),
               Catch::Contains(bad) && Catch::Contains("places tensor transformer.ln_f.bias in") &&
                   Catch::Contains("model-00002-of-00002.safetensors, which has no such tensor"));
    nlohmann::json unlisted = map;  // a shard's tensor the index does not list
    unlisted.erase("transformer.wpe.weight");
    bad = write_index("unlisted.safetensors.index.json", {{"weight_map", unlisted}});
    CHECK_THAT(error_of([&] { hf_weights_pieces(bad, s); }),
               Catch::Contains("model-00001-of-00002.safetensors: holds tensor transformer.wpe.weight") &&
                   Catch::Contains("does not list"));
    nlohmann::json absent = map;  // a shard that is not there
    absent["transformer.wpe.weight"] = "model-00003-of-00003.safetensors";
    bad = write_index("absent.safetensors.index.json", {{"weight_map", absent}});
    CHECK_THAT(error_of([&] { hf_check_weights(bad, s); }),
               Catch::Contains("model-00003-of-00003.safetensors") && Catch::Contains("cannot open"));
    nlohmann::json outside = map;  // a shard named by a path, not beside the index
    outside["transformer.wpe.weight"] = "../model-00001-of-00002.safetensors";
    bad = write_index("outside.safetensors.index.json", {{"weight_map", outside}});
    CHECK_THAT(error_of([&] { hf_read_weights(bad, s); }),
               Catch::Contains("weight_map[\"transformer.wpe.weight\"]") && Catch::Contains("beside the index"));
    bad = write_index("nomap.safetensors.index.json", {{"metadata", {{"total_size", 1}}}});
    CHECK_THAT(error_of([&] { hf_read_weights(bad, s); }), Catch::Contains(bad) && Catch::Contains("\"weight_map\""));
    std::ofstream(dir + "/junk.safetensors.index.json") << "{\"weight_map\": ";
    CHECK_THAT(error_of([&] { hf_read_weights(dir + "/junk.safetensors.index.json", s); }),
               Catch::Contains("junk.safetensors.index.json: not valid JSON"));
    // a tensor missing from every shard and the index: named as with one file
    nlohmann::json fewer = map;
    fewer.erase("transformer.ln_f.weight");
    std::set<std::string> first = layers;  // shard 1 without ln_f.weight
    first.insert("transformer.ln_f.weight");
    rewrite(one, dir + "/first.safetensors", first, {});
    for (auto& kv : fewer.items())
        if (kv.value() == "model-00001-of-00002.safetensors") kv.value() = "first.safetensors";
    bad = write_index("fewer.safetensors.index.json", {{"weight_map", fewer}});
    CHECK_THAT(error_of([&] { hf_read_weights(bad, s); }),
               Catch::Contains(bad + ": has no tensor transformer.ln_f.weight"));
}
