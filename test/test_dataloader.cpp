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

#include "llmc/core/common.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/shard.h"
#include "test/temp_dir.h"

namespace fs = std::filesystem;

namespace {

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
    const TempDir d("test_dataloader");
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
    const TempDir d("test_dataloader");
    write_shards(d, {100});  // B*T = 12: 8 windows
    DataLoader dl(d.file("train_*.bin"), 3, 4, 0, 1, false, 0, VOCAB);
    std::vector<Window> got = run(dl, 3, 4, 20);
    for (size_t i = 0; i < got.size(); i++) REQUIRE(got[i] == Window{0, (i % 8) * 12});
    REQUIRE(dl.position().epoch == 2);
}

TEST_CASE("dataloader: ranks read disjoint windows, llm.c's convention", "[dataloader]") {
    const TempDir d("test_dataloader");
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
    const TempDir d("test_dataloader");
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
    const TempDir d("test_dataloader");
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
    const TempDir d("test_dataloader");
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
    const TempDir d("test_dataloader");
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
    SECTION("a folder the glob matches") {
        fs::remove(bad);
        fs::create_directory(bad);
        std::string msg = error_of([&] { open(); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "is a folder"));
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
    SECTION("token id >= vocab_size, found when its shard is first opened") {
        std::vector<uint16_t> toks(100);
        for (size_t i = 0; i < toks.size(); i++) toks[i] = uint16_t(i);
        toks[75] = 1000;  // in window 4 of shard 1
        shard_write(bad, toks.data(), toks.size());
        DataLoader dl(glob, B, T, 0, 1, false, 0, 1000);  // shard 0 is checked and fine
        std::vector<int32_t> x(B * T), y(B * T);
        for (int i = 0; i < 5; i++) dl.next(x.data(), y.data());  // shard 0 has 6 windows
        // the last window of shard 0 moves on to shard 1, which is checked whole as it opens
        std::string msg = error_of([&] { dl.next(x.data(), y.data()); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "token id 1000 at token offset 75"));
        CHECK(contains(msg, "vocab_size 1000"));
        // so is a shard a resume starts in; and the last token of a shard (a last target)
        toks[75] = 75;
        toks[99] = 4000;
        shard_write(bad, toks.data(), toks.size());
        DataLoader dl2(glob, B, T, 0, 1, false, 0, 1000);
        const LoaderPosition start = dl2.position();
        msg = error_of([&] { dl2.set_position({0, 1, 0, 0}); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "token id 4000 at token offset 99"));
        CHECK(dl2.position() == start);  // a failed set_position leaves the position as it was
    }
    SECTION("bad arguments") {
        CHECK(contains(error_of([&] { DataLoader dl(glob, B, T, 2, 2, false, 0, VOCAB); }), "rank 2"));
        CHECK(contains(error_of([&] { DataLoader dl(glob, 0, T, 0, 1, false, 0, VOCAB); }), "micro_batch"));
    }
}

// ---------------------------------------------------------------- uint32 shards (version 7)

namespace {

// A shard built byte by byte from the documented format, without llmc/shard: 256 int32 (magic,
// version, token count, zeros), then `tokens` as uint32, or as uint16 when token_bytes == 2.
void write_hand_built(const std::string& path, int32_t magic, int32_t version, int32_t count,
                      const std::vector<uint32_t>& tokens, int token_bytes = 4) {
    std::vector<unsigned char> bytes(1024, 0);
    auto put = [&](size_t at, uint32_t v, int n) {
        for (int b = 0; b < n; b++) bytes[at + b] = (unsigned char)(v >> (8 * b));  // little-endian
    };
    put(0, uint32_t(magic), 4);
    put(4, uint32_t(version), 4);
    put(8, uint32_t(count), 4);
    for (uint32_t t : tokens) {
        bytes.resize(bytes.size() + token_bytes);
        put(bytes.size() - token_bytes, t, token_bytes);
    }
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
}

std::vector<unsigned char> file_bytes(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f);
    std::vector<unsigned char> out;
    int c;
    while ((c = std::fgetc(f)) != EOF) out.push_back((unsigned char)c);
    std::fclose(f);
    return out;
}

// The tokens of write_shards' shard k (k*10000 + i), for the same shards in uint32.
std::vector<uint32_t> shard_tokens(size_t k, size_t n) {
    std::vector<uint32_t> t(n);
    for (size_t i = 0; i < n; i++) t[i] = uint32_t(k * SHARD_STRIDE + i);
    return t;
}

}  // namespace

TEST_CASE("shards: the writers produce the documented bytes", "[dataloader][shard]") {
    const TempDir d("test_dataloader");
    const std::vector<uint32_t> big = {0, 1, 65535, 65536, 70000, 16777215, 4294967295u};
    shard_write(d.file("w32.bin"), big.data(), big.size());
    write_hand_built(d.file("h32.bin"), 20240801, 7, int32_t(big.size()), big);
    CHECK(file_bytes(d.file("w32.bin")) == file_bytes(d.file("h32.bin")));
    ShardInfo i32 = shard_info(d.file("w32.bin"));
    CHECK(i32.tokens == big.size());
    CHECK(i32.token_bytes == 4);

    const std::vector<uint16_t> small = {0, 1, 50256, 65535};
    shard_write(d.file("w16.bin"), small.data(), small.size());
    write_hand_built(d.file("h16.bin"), 20240520, 1, int32_t(small.size()), {0, 1, 50256, 65535}, 2);
    CHECK(file_bytes(d.file("w16.bin")) == file_bytes(d.file("h16.bin")));
    ShardInfo i16 = shard_info(d.file("w16.bin"));
    CHECK(i16.tokens == small.size());
    CHECK(i16.token_bytes == 2);
}

TEST_CASE("dataloader: uint32 shards deliver tokens past 65535 intact", "[dataloader]") {
    const TempDir d("test_dataloader");
    const int B = 2, T = 8;  // windows of 17 tokens, 16 apart
    std::vector<uint32_t> toks(100);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = uint32_t(65530 + 1009 * i);  // 65530 .. 165421
    toks[40] = 16777215;  // the largest id model.vocab_size allows
    toks[41] = 65536;
    write_hand_built(d.file("train_000000.bin"), 20240801, 7, 100, toks);
    DataLoader dl(d.file("train_*.bin"), B, T, 0, 1, false, 0, 16777216);
    REQUIRE(dl.shard_windows(0) == 6);  // (100 - 1) / 16
    std::vector<int32_t> x(B * T), y(B * T);
    for (size_t w = 0; w < 6 + 2; w++) {  // past the end: wraps to window 0
        dl.next(x.data(), y.data());
        size_t start = (w % 6) * 16;
        for (int i = 0; i < B * T; i++) {
            REQUIRE(x[i] == int32_t(toks[start + i]));
            REQUIRE(y[i] == int32_t(toks[start + i + 1]));
        }
    }
}

TEST_CASE("dataloader: uint16 and uint32 shards of the same tokens, mixed in one glob, give the same batches",
          "[dataloader]") {
    const TempDir d16("test_dataloader"), dmix("test_dataloader");
    const int B = 2, T = 8;
    const std::vector<size_t> sizes = {1000, 700, 333, 1500, 257};
    write_shards(d16, sizes);
    // the same tokens, shards 1 and 3 stored as uint32
    write_shards(dmix, sizes);
    for (size_t k : {size_t(1), size_t(3)}) {
        char name[64];
        std::snprintf(name, sizeof(name), "train_%06zu.bin", k);
        write_hand_built(dmix.file(name), 20240801, 7, int32_t(sizes[k]), shard_tokens(k, sizes[k]));
        REQUIRE(shard_info(dmix.file(name)).token_bytes == 4);
    }
    const std::string g16 = d16.file("train_*.bin"), gmix = dmix.file("train_*.bin");
    for (bool shuffle : {false, true}) {
        for (int world : {1, 2}) {
            for (int rank = 0; rank < world; rank++) {
                DataLoader a(g16, B, T, rank, world, shuffle, 5, VOCAB), b(gmix, B, T, rank, world, shuffle, 5, VOCAB);
                REQUIRE(a.windows_per_epoch() == b.windows_per_epoch());
                const size_t steps = 2 * a.windows_per_epoch() + 3;
                std::vector<Window> wa = run(a, B, T, steps), wb = run(b, B, T, steps);
                REQUIRE(wa == wb);
                if (!shuffle) REQUIRE(wb == llmc_reference(sizes, B, T, rank, world, steps));
                REQUIRE(a.position() == b.position());
                // resume on the mixed glob from the uint16 loader's position
                DataLoader c(gmix, B, T, rank, world, shuffle, 5, VOCAB);
                c.set_position(a.position());
                REQUIRE(run(c, B, T, 40) == run(a, B, T, 40));
            }
        }
    }
}

TEST_CASE("dataloader: bad uint32 shards are UserErrors naming the file", "[dataloader]") {
    const TempDir d("test_dataloader");
    const int B = 2, T = 8;
    write_shards(d, {100, 100});  // train_000000 (uint16); tests write train_000001
    const std::string glob = d.file("train_*.bin");
    const std::string bad = d.file("train_000001.bin");
    std::vector<uint32_t> toks(100);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = uint32_t(69900 + i);  // the last is 69999
    auto open = [&](int vocab) { DataLoader dl(glob, B, T, 0, 1, false, 0, vocab); };

    SECTION("token id >= vocab_size, found when its shard is first opened") {
        toks[75] = 70000;
        write_hand_built(bad, 20240801, 7, 100, toks);
        DataLoader dl(glob, B, T, 0, 1, false, 0, 70000);
        std::string msg = error_of([&] { dl.set_position({0, 1, 0, 0}); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "token id 70000"));
        CHECK(contains(msg, "offset 75"));
        CHECK(contains(msg, "vocab_size 70000"));
    }
    SECTION("a token id past 2^31 is reported unsigned") {
        toks[3] = 4294967295u;
        write_hand_built(bad, 20240801, 7, 100, toks);
        DataLoader dl(glob, B, T, 0, 1, false, 0, 16777216);
        std::string msg = error_of([&] { dl.set_position({0, 1, 0, 0}); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "token id 4294967295"));
    }
    SECTION("unknown versions and magics") {
        for (auto [magic, version] : std::vector<std::pair<int, int>>{{20240801, 1}, {20240801, 2}, {20240520, 7},
                                                                     {20240520, 2}}) {
            write_hand_built(bad, magic, version, 100, toks);
            std::string msg = error_of([&] { open(70000); });
            INFO(msg);
            CHECK(contains(msg, bad));
            CHECK(contains(msg, "unsupported version " + std::to_string(version)));
        }
        write_hand_built(bad, 20240802, 7, 100, toks);
        std::string msg = error_of([&] { open(70000); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "bad magic 20240802"));
    }
    SECTION("truncated: uint16-sized tokens under a uint32 header, or one byte short") {
        write_hand_built(bad, 20240801, 7, 100, toks, 2);
        std::string msg = error_of([&] { open(70000); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "uint32"));
        CHECK(contains(msg, "truncated"));
        write_hand_built(bad, 20240801, 7, 100, toks);
        fs::resize_file(bad, 1024 + 4 * 100 - 1);
        msg = error_of([&] { open(70000); });
        CHECK(contains(msg, bad));
        CHECK(contains(msg, "truncated"));
        // and the intact file opens
        write_hand_built(bad, 20240801, 7, 100, toks);
        DataLoader ok(glob, B, T, 0, 1, false, 0, 70000);
        CHECK(ok.shard_windows(1) == 6);
    }
}
