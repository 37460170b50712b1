// Resuming in pieces: a rank other than world rank 0 opens a checkpoint with checkpoint_open and
// reads only what it holds (its part of the weights, its ZeRO shard of the moments), through
// pick_file_order. Checked here against checkpoint_load's whole arrays, element for element and
// bit for bit, on checkpoints with every section (bf16 weights, master weights, fp8 bytes, local
// SGD replicas; PowerSGD), and for the bytes it reads.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "llmc/io/checkpoint.h"
#include "llmc/model/param_table.h"
#include "llmc/train/layout.h"
#include "test/temp_dir.h"
#include "test/user_error.h"

namespace {

// GPT-2 with 4 layers of width 128, vocabulary 1000: 0.93M parameters, 3.7 MB an fp32 array
const ModelShape kShape{4, 4, 128, 1000, 1024, 64};
// with 5 layers: 1.13M parameters, more than a save's chunk of 1M elements
const ModelShape kShape5{5, 4, 128, 1000, 1024, 64};

std::vector<float> noise(size_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = d(g);
    return x;
}

// a whole state with every array distinct (bf16-exact weights when the model file is bf16)
WholeState make_state(bool master, int local_dp, int psgd_dp, uint32_t seed, const ModelShape& shape = kShape) {
    const size_t n = num_params(shape);
    WholeState w;
    w.params = noise(n, seed);
    for (float& x : w.params) {  // bf16-exact: the version-5 model file keeps them as they are
        uint32_t b;
        std::memcpy(&b, &x, 4);
        b &= 0xffff0000u;
        std::memcpy(&x, &b, 4);
    }
    w.m = noise(n, seed + 1);
    w.v = noise(n, seed + 2);
    if (master) w.master = noise(n, seed + 3);
    w.fp8 = {1, 2, 3, 4, 5, 6, 7};
    if (local_dp > 0) {
        w.local_sgd.anchor = noise(n, seed + 4);
        w.local_sgd.momentum = noise(n, seed + 5);
        for (int k = 1; k < local_dp; k++)
            w.local_sgd.replicas.push_back({noise(n, seed + 10 * k), noise(n, seed + 10 * k + 1),
                                            noise(n, seed + 10 * k + 2), master ? noise(n, seed + 10 * k + 3)
                                                                                : std::vector<float>()});
    }
    if (psgd_dp > 0) {
        w.powersgd.rank = 2;
        for (int k = 0; k < psgd_dp; k++) w.powersgd.errors.push_back(noise(n, seed + 100 + k));
        w.powersgd.q = noise(96, seed + 200);
    }
    return w;
}

// pieces of every length class (one element, under and over the 256 KB read-ahead, the whole array)
// read from `read` equal the same elements of `whole`, bit for bit
void check_pieces(const ReadFileOrder& read, const std::vector<float>& whole) {
    REQUIRE(read);
    const size_t n = whole.size();
    const std::pair<size_t, size_t> pieces[] = {{0, 1},       {n - 1, 1},        {5, 700},         {123457, 64000},
                                                {70000, 65537}, {n / 2, n - n / 2}, {0, n}};
    for (const auto& p : pieces) {
        std::vector<float> got(p.second, -1.0f);
        read(p.first, p.second, got.data());
        INFO("piece [" << p.first << ", +" << p.second << ")");
        CHECK(std::memcmp(got.data(), whole.data() + p.first, p.second * sizeof(float)) == 0);
    }
}

ParallelConfig layout_config(int tp, int pp) {
    ParallelConfig pc;
    pc.tp = tp;
    pc.pp = pp;
    return pc;
}

}  // namespace

TEST_CASE("checkpoint_open hands out the arrays checkpoint_load reads whole, in pieces", "[checkpoint]") {
    const TempDir tmp("llmc_pieces");
    for (int variant = 0; variant < 2; variant++) {
        // 0: bf16 weights (model.bin version 5), master weights, fp8 bytes, local SGD of 3 DP ranks
        // 1: fp32 weights, no master, PowerSGD state of 2 DP ranks
        const bool bf16 = variant == 0;
        const WholeState w = make_state(bf16, bf16 ? 3 : 0, bf16 ? 0 : 2, 7u + uint32_t(variant));
        TrainState st;
        st.step = 4 + variant;
        const std::string dir = tmp.file("ck" + std::to_string(variant));
        checkpoint_save(dir, st, kShape, bf16 ? 5 : 3, w, nlohmann::json::object(), 1);
        const std::string ck = dir + "/" + (variant ? "step_00000005" : "step_00000004");
        WholeState back;
        const TrainState loaded = checkpoint_load(ck, kShape, &back);
        const StateView v = checkpoint_open(ck, kShape);
        INFO("variant " << variant);
        CHECK(v.st.step == loaded.step);
        // at the open only the small sections: the fp8 bytes and PowerSGD's Q
        CHECK(*v.bytes_read == back.fp8.size() + back.powersgd.q.size() * sizeof(float));
        check_pieces(v.main.params, back.params);
        check_pieces(v.main.m, back.m);
        check_pieces(v.main.v, back.v);
        CHECK(bool(v.main.master) == bf16);
        if (bf16) check_pieces(v.main.master, back.master);
        CHECK(v.fp8 == back.fp8);
        CHECK(v.local_dp == back.local_sgd.dp());
        CHECK(v.replicas.size() == back.local_sgd.replicas.size());
        if (bf16) {
            check_pieces(v.anchor, back.local_sgd.anchor);
            check_pieces(v.momentum, back.local_sgd.momentum);
            for (size_t k = 0; k < v.replicas.size(); k++) {
                const ReplicaState& r = back.local_sgd.replicas[k];
                check_pieces(v.replicas[k].params, r.params);
                check_pieces(v.replicas[k].m, r.m);
                check_pieces(v.replicas[k].v, r.v);
                check_pieces(v.replicas[k].master, r.master);
            }
        }
        CHECK(v.psgd_rank == back.powersgd.rank);
        REQUIRE(v.psgd_errors.size() == back.powersgd.errors.size());
        for (size_t k = 0; k < v.psgd_errors.size(); k++) check_pieces(v.psgd_errors[k], back.powersgd.errors[k]);
        CHECK(v.psgd_q == back.powersgd.q);
        // and what was saved is what comes back (the bf16 weights exactly: they were bf16-exact)
        CHECK((back.params == w.params));
        CHECK((back.m == w.m));
        // the view of a whole state in memory hands out the same
        const StateView mem = view_of(back, loaded);
        check_pieces(mem.main.v, w.v);
        CHECK(*mem.bytes_read == 0);
    }
}

TEST_CASE("pick_file_order: a shard of a rank's piece, read alone, is that part of the whole piece", "[checkpoint]") {
    const size_t n = num_params(kShape);
    const std::vector<float> whole = noise(n, 3);
    size_t asked = 0, calls = 0;  // elements read, reads
    const ReadFileOrder read = [&](size_t first, size_t k, float* out) {
        REQUIRE(first + k <= n);
        std::memcpy(out, whole.data() + first, k * sizeof(float));
        asked += k;
        calls++;
    };
    const struct { int tp, pp, tp_rank, pp_rank; } layouts[] = {{1, 1, 0, 0}, {2, 1, 1, 0}, {2, 2, 0, 1}, {1, 2, 0, 1}};
    for (const auto& l : layouts) {
        const ParallelConfig pc = layout_config(l.tp, l.pp);
        const ParamLayout pl = param_layout(kShape, model_layout(kShape, pc, l.tp_rank, l.pp_rank), 999);
        INFO("tp " << l.tp << " pp " << l.pp << " rank (" << l.tp_rank << ", " << l.pp_rank << ")");
        REQUIRE(pl.padded_params > pl.num_params);  // some padding, to see it stay 0
        asked = 0, calls = 0;
        const std::vector<float> all = pick_file_order(pl, read, {{0, pl.padded_params}});
        REQUIRE(all.size() == pl.padded_params);
        // every element of its tensors (the tied copy too), with little else: a dp-only piece is
        // whole tensors; under tp the rows of a column-split tensor come with the other ranks'
        // columns between them (at most as many again), and in a few reads, not one per row
        CHECK(asked >= pl.num_params);
        CHECK(double(asked) <= (l.tp == 1 ? 1.05 : 2.0) * double(pl.num_params));
        CHECK(calls < 40);
        for (size_t i = pl.num_params; i < pl.padded_params; i++) REQUIRE(all[i] == 0.0f);
        // what the whole-buffer copy before pick_file_order did: each run copied where it lies
        std::vector<float> copied(pl.padded_params, 0.0f);
        for (const ParamSpec& p : pl.specs)
            for_each_run(p, [&](size_t local, size_t src, size_t k) {
                std::memcpy(&copied[p.offset + local], whole.data() + src, k * sizeof(float));
            });
        CHECK((all == copied));
        // ZeRO shards of 4 ranks (one run each), and runs that cut tensors and reach into the padding
        const size_t P = pl.padded_params, q = P / 4;
        const std::vector<std::vector<std::pair<size_t, size_t>>> cases = {
            {{0, q}}, {{q, 2 * q}}, {{3 * q, P}}, {{1, 2}, {100, 4000}, {q + 17, 2 * q + 5}, {P - 70, P}}};
        for (const auto& runs : cases) {
            asked = 0;
            const std::vector<float> got = pick_file_order(pl, read, runs);
            std::vector<float> want;
            size_t real = 0;  // elements of the runs that are not padding
            for (const auto& r : runs) {
                want.insert(want.end(), all.begin() + long(r.first), all.begin() + long(r.second));
                if (r.first < pl.num_params) real += std::min(r.second, pl.num_params) - r.first;
            }
            CHECK((got == want));  // (not expanded: 10^5 elements)
            CHECK(asked >= real);
            CHECK(double(asked) <= 2.5 * double(real));  // (where runs cut tensors: gaps of up to 64 KB more)
        }
    }
}

TEST_CASE("checkpoint_open: a rank's shard reads a fraction of the file; bad folders name the file", "[checkpoint]") {
    const TempDir tmp("llmc_pieces_io");
    const WholeState w = make_state(true, 0, 0, 11);
    TrainState st;
    st.step = 2;
    checkpoint_save(tmp.file("ck"), st, kShape, 5, w, nlohmann::json::object(), 1);
    const std::string ck = tmp.file("ck/step_00000002");
    // DP rank 1 of 4 under ZeRO-1, one process per model copy: its quarter of m, v and master
    const ParamLayout pl = param_layout(kShape, model_layout(kShape, layout_config(1, 1), 0, 0), 4);
    const size_t q = pl.padded_params / 4;
    const std::vector<std::pair<size_t, size_t>> shard = {{q, 2 * q}};
    {
        const StateView v = checkpoint_open(ck, kShape), mem = view_of(w, st);
        for (const auto& a : {std::make_pair(v.main.m, mem.main.m), std::make_pair(v.main.v, mem.main.v),
                              std::make_pair(v.main.master, mem.main.master)})
            CHECK((pick_file_order(pl, a.first, shard) == pick_file_order(pl, a.second, shard)));
        const double shard_bytes = 3.0 * double(q) * sizeof(float);
        // its own bytes and little more (the small tensors between its pieces), not the whole arrays
        INFO("read " << *v.bytes_read << " bytes for a shard of " << shard_bytes);
        CHECK(double(*v.bytes_read) >= shard_bytes + double(w.fp8.size()));
        CHECK(double(*v.bytes_read) <= 1.05 * shard_bytes);
        // and the weights: the whole piece (bf16 in model.bin, widened)
        const std::vector<std::pair<size_t, size_t>> all = {{0, pl.padded_params}};
        CHECK((pick_file_order(pl, v.main.params, all) == pick_file_order(pl, mem.main.params, all)));
    }
    auto copy = [&](const std::string& name) {
        const std::string d = tmp.file(name);
        std::filesystem::copy(ck, d);
        return d;
    };
    const std::string no_done = copy("no_done");
    std::filesystem::remove(no_done + "/DONE");
    CHECK_THAT(error_of([&] { checkpoint_open(no_done, kShape); }), Catch::Contains("incomplete (no DONE marker)"));
    const std::string cut = copy("cut");
    std::filesystem::resize_file(cut + "/state.bin", std::filesystem::file_size(cut + "/state.bin") - 4);
    CHECK_THAT(error_of([&] { checkpoint_open(cut, kShape); }),
               Catch::Contains(cut + "/state.bin: truncated or wrong size"));
    ModelShape wider = kShape;
    wider.d_model = 256;
    CHECK_THAT(error_of([&] { checkpoint_open(ck, wider); }), Catch::Contains("model.d_model is 128 in the file but 256"));
    // a file cut after it was opened: the read that comes short names it
    const std::string later = copy("later");
    const StateView v = checkpoint_open(later, kShape);
    std::filesystem::resize_file(later + "/state.bin", 4096);
    std::vector<float> x(1000);
    CHECK_THAT(error_of([&] { v.main.v(0, x.size(), x.data()); }), Catch::Contains(later + "/state.bin: truncated"));
}

namespace {
std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("checkpoint_save from the mp group's pieces writes what a whole state writes", "[checkpoint]") {
    // tp = 2 x pp = 2: each member's piece (pick_file_order) of every array, read back through
    // file_order_map from the members' buffers: the files must be
    // those of the whole state, byte for byte (1.13M parameters: two chunks of the save's 1M)
    const TempDir tmp("llmc_pieces_save");
    const ParallelConfig pc = layout_config(2, 2);
    const size_t pad = 16;
    auto map = std::make_shared<const FileOrderMap>(file_order_map(kShape5, pc, pad));
    WholeState w = make_state(true, 0, 0, 21, kShape5);
    auto gathered = [&](const std::vector<float>& whole) {
        const ReadFileOrder read = [&](size_t first, size_t k, float* out) {
            std::memcpy(out, whole.data() + first, k * sizeof(float));
        };
        std::vector<std::vector<float>> pieces;
        for (int i = 0; i < 4; i++) {
            const ParamLayout pl = param_layout(kShape5, model_layout(kShape5, pc, i % 2, i / 2), pad);
            pieces.push_back(pick_file_order(pl, read, {{0, pl.padded_params}}));
        }
        return pieces;
    };
    using Pieces = std::vector<std::vector<float>>;
    auto view_of_pieces = [&](const std::vector<Pieces>& all, const TrainState& st) {
        StateView v;
        v.st = st;
        v.num_params = num_params(kShape5);
        auto reader = [&](const Pieces& x) -> ReadFileOrder {
            std::vector<const float*> members;
            for (const std::vector<float>& piece : x) members.push_back(piece.data());
            return [map, members](size_t first, size_t n, float* out) { map->read(members, first, n, out); };
        };
        v.main = {reader(all[0]), reader(all[1]), reader(all[2]), reader(all[3])};
        v.fp8 = w.fp8;
        return v;
    };
    TrainState st;
    st.step = 3;
    const std::vector<Pieces> all = {gathered(w.params), gathered(w.m), gathered(w.v), gathered(w.master)};
    REQUIRE(all[0].size() == 4);
    checkpoint_save(tmp.file("whole"), st, kShape5, 5, w, nlohmann::json::object(), 1);
    checkpoint_save(tmp.file("pieces"), view_of_pieces(all, st), kShape5, 5, nlohmann::json::object(), 1);
    for (const char* f : {"/step_00000003/model.bin", "/step_00000003/state.bin"}) {
        INFO(f);
        const std::string a = file_bytes(tmp.file("whole") + f), b = file_bytes(tmp.file("pieces") + f);
        CHECK(a.size() > num_params(kShape5) * 2);
        CHECK((a == b));
    }
    WholeState back;  // and they hold the state (the weights bf16-exact), across the chunk boundary
    checkpoint_load(tmp.file("pieces") + "/step_00000003", kShape5, &back);
    CHECK((back.params == w.params));
    CHECK((back.m == w.m));
    CHECK((back.v == w.v));
    CHECK((back.master == w.master));
    CHECK(back.fp8 == w.fp8);
    // a non-finite moment past the first chunk: nothing of the checkpoint is written, the one
    // before stays, and the message counts every one in the array and names the first
    std::vector<float> v = w.v;
    const size_t n = num_params(kShape5);
    REQUIRE(n > 1050000);
    v[1050000] = NAN;
    v[n - 1] = INFINITY;
    const std::vector<Pieces> bad = {all[0], all[1], gathered(v), all[3]};
    st.step = 4;
    CHECK_THROWS_WITH(checkpoint_save(tmp.file("pieces"), view_of_pieces(bad, st), kShape5, 5, nlohmann::json::object(), 1),
                      Catch::Contains("step 4: 2 of " + std::to_string(n) + " Adam v are not finite (the first at index 1050000, nan)"));
    CHECK(!std::filesystem::exists(tmp.file("pieces") + "/step_00000004"));
    CHECK(!std::filesystem::exists(tmp.file("pieces") + "/step_00000004.tmp"));
    CHECK(std::filesystem::exists(tmp.file("pieces") + "/step_00000003/DONE"));
    CHECK_THROWS_WITH(check_finite_state(view_of_pieces(bad, st), 4), Catch::Contains("2 of " + std::to_string(n) + " Adam v"));
    CHECK_NOTHROW(check_finite_state(view_of_pieces(all, st), 4));
}
