// Data loader: llm.c's exact sequence, distributed windows, shuffling, resume, bad data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "llmc/common.h"
#include "llmc/dataloader.h"
#include "llmc/shard.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/test_dataloader_XXXXXX";
        REQUIRE(mkdtemp(tmpl) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return path + "/" + name; }
};

// Shard k holds tokens k*10000 + i, so a token says which shard and offset it came from.
constexpr int VOCAB = 65536;
constexpr uint16_t SHARD_STRIDE = 10000;

std::vector<std::string> write_shards(const TempDir& d, const std::vector<size_t>& sizes,
                                      const std::string& prefix = "train_") {
    std::vector<std::string> paths;
    for (size_t k = 0; k < sizes.size(); k++) {
        REQUIRE(sizes[k] <= SHARD_STRIDE);
        std::vector<uint16_t> toks(sizes[k]);
        for (size_t i = 0; i < toks.size(); i++) toks[i] = uint16_t(k * SHARD_STRIDE + i);
        char name[64];
        std::snprintf(name, sizeof(name), "%s%06zu.bin", prefix.c_str(), k);
        paths.push_back(d.file(name));
        shard_write(paths.back(), toks.data(), toks.size());
    }
    return paths;
}

struct Window {
    size_t shard;
    size_t offset;  // first token
    bool operator==(const Window& o) const { return shard == o.shard && offset == o.offset; }
    bool operator<(const Window& o) const { return shard < o.shard || (shard == o.shard && offset < o.offset); }
};

// Reads `steps` micro-batches, checks each is one contiguous window, returns where they came from.
std::vector<Window> run(DataLoader& dl, int B, int T, size_t steps) {
    std::vector<int32_t> x(B * T), y(B * T);
    std::vector<Window> out;
    for (size_t s = 0; s < steps; s++) {
        dl.next(x.data(), y.data());
        bool contiguous = true;
        for (int i = 0; i < B * T; i++) {
            contiguous = contiguous && x[i] == x[0] + i && y[i] == x[0] + i + 1;
        }
        REQUIRE(contiguous);
        out.push_back({size_t(x[0]) / SHARD_STRIDE, size_t(x[0]) % SHARD_STRIDE});
    }
    return out;
}

// llm.c's DataLoader, written the way llm.c writes it: a per-shard sample count, a sample
// index advanced after each batch, the shard advanced lazily, wrapping after the last.
std::vector<Window> llmc_reference(const std::vector<size_t>& sizes, int B, int T, int rank, int world,
                                   size_t steps) {
    size_t total_batch = size_t(world) * B * T;
    size_t shard = 0, sample = 0;
    std::vector<Window> out;
    for (size_t s = 0; s < steps; s++) {
        size_t num_samples = (sizes[shard] - 1) / total_batch;
        if (sample >= num_samples) {
            shard = (shard + 1) % sizes.size();
            sample = 0;
        }
        out.push_back({shard, sample * total_batch + size_t(rank) * B * T});
        sample++;
    }
    return out;
}

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const UserError& e) {
        return e.what();
    }
    return "(no UserError thrown)";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

void write_raw(const std::string& path, const std::vector<int32_t>& header, size_t ntok_written) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    std::vector<int32_t> h(256, 0);
    std::copy(header.begin(), header.end(), h.begin());
    std::fwrite(h.data(), 4, 256, f);
    std::vector<uint16_t> toks(ntok_written, 1);
    std::fwrite(toks.data(), 2, toks.size(), f);
    std::fclose(f);
}

}  // namespace

TEST_CASE("dataloader: shuffle=false reproduces llm.c's sequence", "[dataloader]") {
    TempDir d;
    const int B = 2, T = 8;  // B*T = 16
    std::vector<size_t> sizes = {1000, 700};  // 62 and 43 windows
    write_shards(d, sizes);
    DataLoader dl(d.file("train_*.bin"), B, T, 0, 1, false, 0, VOCAB);
    REQUIRE(dl.num_shards() == 2);
    REQUIRE(dl.shard_windows(0) == 62);
    REQUIRE(dl.shard_windows(1) == 43);
    REQUIRE(dl.windows_per_epoch() == 105);

    // the first micro-batch: inputs are tokens [0,16), targets [1,16]
    std::vector<int32_t> x(B * T), y(B * T);
    dl.next(x.data(), y.data());
    for (int i = 0; i < B * T; i++) {
        REQUIRE(x[i] == i);
        REQUIRE(y[i] == i + 1);
    }
    dl.reset();

    std::vector<Window> got = run(dl, B, T, 3 * 105 + 5);
    // micro-batch i of the first shard starts at token i*B*T
    for (size_t i = 0; i < 62; i++) REQUIRE(got[i] == Window{0, i * 16});
    // then the second shard from its start, then a wrap to the first
    REQUIRE(got[62] == Window{1, 0});
    REQUIRE(got[104] == Window{1, 42 * 16});
    REQUIRE(got[105] == Window{0, 0});
    REQUIRE(got == llmc_reference(sizes, B, T, 0, 1, got.size()));
    REQUIRE(dl.position() == LoaderPosition{3, 0, 5, 0});
}

TEST_CASE("dataloader: a single shard wraps onto itself", "[dataloader]") {
    TempDir d;
    write_shards(d, {100});  // B*T = 12: 8 windows
    DataLoader dl(d.file("train_*.bin"), 3, 4, 0, 1, false, 0, VOCAB);
    std::vector<Window> got = run(dl, 3, 4, 20);
    for (size_t i = 0; i < got.size(); i++) REQUIRE(got[i] == Window{0, (i % 8) * 12});
    REQUIRE(dl.position().epoch == 2);
}

TEST_CASE("dataloader: ranks read disjoint windows, llm.c's convention", "[dataloader]") {
    TempDir d;
    const int B = 2, T = 8;
    SECTION("sizes that every world divides: ranks interleave the world=1 sequence") {
        std::vector<size_t> sizes = {64 * 15 + 1, 64 * 10 + 1};  // 15 and 10 groups at world 4
        write_shards(d, sizes);
        DataLoader one(d.file("train_*.bin"), B, T, 0, 1, false, 0, VOCAB);
        std::vector<Window> serial = run(one, B, T, 2 * 100);
        for (int world : {2, 4}) {
            size_t steps = 2 * 100 / world;
            for (int r = 0; r < world; r++) {
                DataLoader dl(d.file("train_*.bin"), B, T, r, world, false, 0, VOCAB);
                std::vector<Window> got = run(dl, B, T, steps);
                for (size_t s = 0; s < steps; s++) REQUIRE(got[s] == serial[s * world + r]);
            }
        }
    }
    SECTION("uneven sizes: windows disjoint within an epoch and equal to llm.c's") {
        std::vector<size_t> sizes = {1000, 700, 333};
        write_shards(d, sizes);
        for (int world : {2, 4}) {
            DataLoader probe(d.file("train_*.bin"), B, T, 0, world, false, 0, VOCAB);
            size_t epoch = probe.windows_per_epoch();
            std::set<Window> seen;
            for (int r = 0; r < world; r++) {
                DataLoader dl(d.file("train_*.bin"), B, T, r, world, false, 0, VOCAB);
                std::vector<Window> got = run(dl, B, T, 2 * epoch);
                REQUIRE(got == llmc_reference(sizes, B, T, r, world, got.size()));
                for (size_t s = 0; s < epoch; s++) seen.insert(got[s]);
                // the second epoch repeats the first
                REQUIRE(std::equal(got.begin(), got.begin() + epoch, got.begin() + epoch));
            }
            REQUIRE(seen.size() == epoch * world);  // no window read by two ranks
            // windows of one step never overlap: each is B*T+1 tokens at distinct multiples of B*T
        }
    }
}

TEST_CASE("dataloader: shuffle is seeded, per epoch, identical on every rank", "[dataloader]") {
    TempDir d;
    const int B = 2, T = 8;
    std::vector<size_t> sizes = {1000, 700, 333, 1500, 257};
    write_shards(d, sizes);
    const std::string glob = d.file("train_*.bin");

    DataLoader plain(glob, B, T, 0, 1, false, 0, VOCAB);
    const size_t E = plain.windows_per_epoch();
    std::vector<Window> ordered = run(plain, B, T, E);

    DataLoader a(glob, B, T, 0, 1, true, 7, VOCAB), a2(glob, B, T, 0, 1, true, 7, VOCAB),
        b(glob, B, T, 0, 1, true, 8, VOCAB);
    std::vector<Window> sa = run(a, B, T, 3 * E), sa2 = run(a2, B, T, 3 * E), sb = run(b, B, T, 3 * E);
    REQUIRE(sa == sa2);  // same seed, same sequence
    REQUIRE(sa != sb);   // different seed, different sequence
    REQUIRE(sa != ordered);

    auto epoch_of = [&](const std::vector<Window>& s, size_t e) {
        return std::vector<Window>(s.begin() + e * E, s.begin() + (e + 1) * E);
    };
    auto shard_sequence = [](const std::vector<Window>& s) {
        std::vector<size_t> order;
        for (const Window& w : s)
            if (order.empty() || order.back() != w.shard) order.push_back(w.shard);
        return order;
    };
    std::vector<Window> sorted_all = ordered;
    std::sort(sorted_all.begin(), sorted_all.end());
    for (size_t e = 0; e < 3; e++) {
        std::vector<Window> ep = epoch_of(sa, e);
        // each shard is read in one run, and the shard order is a permutation
        std::vector<size_t> shards = shard_sequence(ep);
        REQUIRE(shards.size() == sizes.size());
        // every window exactly once per epoch
        std::sort(ep.begin(), ep.end());
        REQUIRE(ep == sorted_all);
    }
    // the order changes every epoch: shards and windows within a shard
    REQUIRE(epoch_of(sa, 0) != epoch_of(sa, 1));
    REQUIRE(epoch_of(sa, 1) != epoch_of(sa, 2));
    REQUIRE(shard_sequence(epoch_of(sa, 0)) != shard_sequence(epoch_of(sa, 1)));

    // world = 2: both ranks follow the same permutation of window groups
    DataLoader r0(glob, B, T, 0, 2, true, 7, VOCAB), r1(glob, B, T, 1, 2, true, 7, VOCAB);
    const size_t E2 = r0.windows_per_epoch();
    std::vector<Window> w0 = run(r0, B, T, 2 * E2), w1 = run(r1, B, T, 2 * E2);
    std::set<Window> seen;
    for (size_t s = 0; s < 2 * E2; s++) {
        REQUIRE(w0[s].shard == w1[s].shard);
        REQUIRE(w1[s].offset == w0[s].offset + B * T);
        REQUIRE(w0[s].offset % (2 * B * T) == 0);
        if (s < E2) {
            seen.insert(w0[s]);
            seen.insert(w1[s]);
        }
    }
    REQUIRE(seen.size() == 2 * E2);
}

TEST_CASE("dataloader: set_position resumes exactly", "[dataloader]") {
    TempDir d;
    const int B = 2, T = 8;
    std::vector<size_t> sizes = {1000, 700, 333, 1500, 257};
    write_shards(d, sizes);
    const std::string glob = d.file("train_*.bin");
    for (bool shuffle : {false, true}) {
        DataLoader probe(glob, B, T, 1, 2, shuffle, 3, VOCAB);
        const size_t E = probe.windows_per_epoch();
        for (size_t k : {size_t(0), size_t(1), size_t(30), size_t(31), E - 1, E, E + 3, 2 * E + 17}) {
            DataLoader a(glob, B, T, 1, 2, shuffle, 3, VOCAB);
            run(a, B, T, k);
            LoaderPosition pos = a.position();
            std::vector<Window> rest = run(a, B, T, E + 10);
            // a loader built with another seed that has already read elsewhere
            DataLoader b(glob, B, T, 1, 2, shuffle, 99, VOCAB);
            run(b, B, T, 5);
            b.set_position(pos);
            REQUIRE(b.position() == pos);
            REQUIRE(run(b, B, T, E + 10) == rest);
        }
        // the position after a whole epoch is the start of the next
        DataLoader c(glob, B, T, 1, 2, shuffle, 3, VOCAB);
        run(c, B, T, E);
        REQUIRE(c.position() == LoaderPosition{1, 0, 0, 3});
        c.reset();
        REQUIRE(c.position() == LoaderPosition{0, 0, 0, 3});
    }
    // positions that do not fit the data are user errors, and leave the loader as it was
    DataLoader dl(glob, B, T, 0, 1, false, 0, VOCAB);
    run(dl, B, T, 3);
    LoaderPosition before = dl.position();
    CHECK(contains(error_of([&] { dl.set_position({0, 5, 0, 0}); }), "5 shards"));
    std::string msg = error_of([&] { dl.set_position({0, 4, 16, 0}); });  // shard 4 has 16 windows
    CHECK(contains(msg, "train_000004.bin"));
    CHECK(contains(msg, "16 windows"));
    REQUIRE(dl.position() == before);
    REQUIRE(run(dl, B, T, 1)[0] == Window{0, 3 * 16});
}

TEST_CASE("dataloader: streams many shards of different sizes", "[dataloader]") {
    TempDir d;
    const int B = 4, T = 16;  // B*T = 64
    std::vector<size_t> sizes = {65, 9999, 640, 1281, 4000, 129};
    write_shards(d, sizes);
    write_shards(d, {100}, "val_");  // not matched by the train glob
    DataLoader dl(d.file("train_*.bin"), B, T, 0, 1, false, 0, VOCAB);
    REQUIRE(dl.num_shards() == sizes.size());
    size_t E = 0;
    for (size_t k = 0; k < sizes.size(); k++) {
        REQUIRE(dl.shard_windows(k) == (sizes[k] - 1) / 64);
        E += (sizes[k] - 1) / 64;
    }
    REQUIRE(dl.windows_per_epoch() == E);
    std::vector<Window> got = run(dl, B, T, 2 * E + 1);
    REQUIRE(got == llmc_reference(sizes, B, T, 0, 1, got.size()));

    // a larger shard, read window by window (tokens = index mod 65000)
    const size_t N = 3000000;
    std::vector<uint16_t> toks(N);
    for (size_t i = 0; i < N; i++) toks[i] = uint16_t(i % 65000);
    shard_write(d.file("big_000.bin"), toks.data(), N);
    DataLoader big(d.file("big_*.bin"), 8, 1024, 0, 1, false, 0, VOCAB);
    REQUIRE(big.windows_per_epoch() == (N - 1) / 8192);
    std::vector<int32_t> x(8192), y(8192);
    for (size_t s = 0; s < big.windows_per_epoch() + 2; s++) {
        big.next(x.data(), y.data());
        size_t start = (s % big.windows_per_epoch()) * 8192;
        REQUIRE(x[0] == int32_t(start % 65000));
        REQUIRE(y[8191] == int32_t((start + 8192) % 65000));
    }
}

TEST_CASE("dataloader: bad data is a UserError naming the file", "[dataloader]") {
    TempDir d;
    const int B = 2, T = 8;
    write_shards(d, {100, 100, 100});  // train_000000..2; tests overwrite train_000001
    const std::string glob = d.file("train_*.bin");
    const std::string bad = d.file("train_000001.bin");
    auto open = [&](int world = 1) { DataLoader dl(glob, B, T, 0, world, false, 0, VOCAB); };

    SECTION("no file matches the glob") {
        std::string pattern = d.file("nothing_*.bin");
        std::string msg = error_of([&] { DataLoader dl(pattern, B, T, 0, 1, false, 0, VOCAB); });
        CHECK(contains(msg, pattern));
    }
    SECTION("wrong magic") {
        write_raw(bad, {12345, 1, 100}, 100);
        std::string msg = error_of([&] { open(); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "magic"));
    }
    SECTION("wrong version") {
        write_raw(bad, {SHARD_MAGIC, 2, 100}, 100);
        std::string msg = error_of([&] { open(); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "version"));
    }
    SECTION("truncated header") {
        FILE* f = std::fopen(bad.c_str(), "wb");
        std::fwrite("abcdefgh", 1, 8, f);
        std::fclose(f);
        std::string msg = error_of([&] { open(); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "truncated"));
    }
    SECTION("truncated tokens") {
        fs::resize_file(bad, SHARD_HEADER_BYTES + 2 * 99);
        CHECK(contains(error_of([&] { open(); }), bad));
    }
    SECTION("more bytes than the header says") {
        write_raw(bad, {SHARD_MAGIC, 1, 100}, 150);
        CHECK(contains(error_of([&] { open(); }), bad));
    }
    SECTION("a shard too small for one window group") {
        write_raw(bad, {SHARD_MAGIC, 1, 2 * 16}, 2 * 16);  // world 2 needs 2*16+1 tokens
        std::string msg = error_of([&] { open(2); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "32 tokens"));
        CHECK(contains(msg, "33"));
        // exactly one group is enough
        write_raw(bad, {SHARD_MAGIC, 1, 2 * 16 + 1}, 2 * 16 + 1);
        DataLoader ok(glob, B, T, 0, 2, false, 0, VOCAB);
        CHECK(ok.shard_windows(1) == 1);
    }
    SECTION("token id >= vocab_size, found in the window that holds it") {
        std::vector<uint16_t> toks(100);
        for (size_t i = 0; i < toks.size(); i++) toks[i] = uint16_t(i);
        toks[75] = 1000;  // window 4 covers tokens [64, 80]
        shard_write(bad, toks.data(), toks.size());
        DataLoader dl(glob, B, T, 0, 1, false, 0, 1000);
        std::vector<int32_t> x(B * T), y(B * T);
        for (int i = 0; i < 6 + 4; i++) dl.next(x.data(), y.data());  // shard 0 (6 windows), shard 1 up to 4
        LoaderPosition before = dl.position();
        std::string msg = error_of([&] { dl.next(x.data(), y.data()); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "offset 75"));
        CHECK(contains(msg, "1000"));
        CHECK(dl.position() == before);
        // the last token of a window (the last target) is checked too
        toks[75] = 75;
        toks[16] = 4000;  // window 0 reads tokens [0, 16]
        shard_write(bad, toks.data(), toks.size());
        DataLoader dl2(glob, B, T, 0, 1, false, 0, 1000);
        dl2.set_position({0, 1, 0, 0});
        msg = error_of([&] { dl2.next(x.data(), y.data()); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "offset 16"));
        CHECK(contains(msg, "4000"));
    }
    SECTION("bad arguments") {
        CHECK(contains(error_of([&] { DataLoader dl(glob, B, T, 2, 2, false, 0, VOCAB); }), "rank 2"));
        CHECK(contains(error_of([&] { DataLoader dl(glob, 0, T, 0, 1, false, 0, VOCAB); }), "micro_batch"));
    }
}
