// llmc/safetensors: reading files whose bytes are made here by hand (not by our writer):
// header, metadata, F32 / BF16 / F16 decoding, and the errors for broken files, each naming
// the file (and the tensor where there is one).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/io/safetensors.h"
#include "test/temp_dir.h"
#include "test/user_error.h"

namespace {

void put_u16(std::vector<uint8_t>& b, uint16_t v) {
    b.push_back(uint8_t(v));
    b.push_back(uint8_t(v >> 8));
}

void put_f32(std::vector<uint8_t>& b, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; i++) b.push_back(uint8_t(u >> (8 * i)));
}

// 8-byte little-endian header length (header.size() unless given), header, data.
std::vector<uint8_t> file_bytes(const std::string& header, const std::vector<uint8_t>& data, int64_t length = -1) {
    const uint64_t n = length < 0 ? header.size() : uint64_t(length);
    std::vector<uint8_t> b;
    for (int i = 0; i < 8; i++) b.push_back(uint8_t(n >> (8 * i)));
    b.insert(b.end(), header.begin(), header.end());
    b.insert(b.end(), data.begin(), data.end());
    return b;
}

std::string write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(b.data(), 1, b.size(), f) == b.size());
    std::fclose(f);
    return path;
}

// a: F32 [2, 2], b: BF16 [4], c: F16 [6], d: I32 [1], and metadata.
const char* kHeader =
    "{\"__metadata__\":{\"format\":\"pt\",\"n_layer\":\"3\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
    "\"c\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[24,36]},"
    "\"d\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[36,40]}}";

std::vector<uint8_t> good_data() {
    std::vector<uint8_t> d;
    for (float f : {1.0f, -2.5f, 0.125f, 3.0e-3f}) put_f32(d, f);
    for (uint16_t h : {0x3F80, 0xC040, 0x3E20, 0x0001}) put_u16(d, h);                  // bf16
    for (uint16_t h : {0x3C00, 0xC000, 0x3555, 0x0001, 0x7BFF, 0xFC00}) put_u16(d, h);  // f16
    for (int i = 0; i < 4; i++) d.push_back(uint8_t(7 * (i == 0)));                      // int32 7
    return d;
}

}  // namespace

TEST_CASE("safetensors: reads a hand-made file: entries, metadata, F32, BF16 and F16", "[safetensors]") {
    const TempDir tmp("llmc_safetensors");
    const std::string path = write_bytes(tmp.path + "/good.safetensors", file_bytes(kHeader, good_data()));
    const SafetensorsReader r(path);
    CHECK(r.path() == path);
    CHECK(r.entries().size() == 4);
    CHECK(r.metadata().size() == 2);
    CHECK(r.metadata().at("format") == "pt");
    CHECK(r.metadata().at("n_layer") == "3");
    CHECK(r.has("a"));
    CHECK_FALSE(r.has("__metadata__"));
    CHECK(r.entry("a").dtype == "F32");
    CHECK(r.entry("a").shape == std::vector<int64_t>{2, 2});
    CHECK(r.entry("c").begin == 24);
    CHECK(r.entry("c").end == 36);
    CHECK(r.entry("d").dtype == "I32");

    CHECK(r.read("a") == std::vector<float>{1.0f, -2.5f, 0.125f, 3.0e-3f});
    // bf16: the high half of the fp32 bit pattern (0x0001: the fp32 denormal 2^-133)
    CHECK(r.read("b") == std::vector<float>{1.0f, -3.0f, 0.15625f, std::ldexp(1.0f, -133)});
    // f16: 1, -2, 0x3555 = 1365/4096, the smallest subnormal 2^-24, the largest finite 65504, -inf
    const std::vector<float> c = r.read("c");
    REQUIRE(c.size() == 6);
    CHECK(c[0] == 1.0f);
    CHECK(c[1] == -2.0f);
    CHECK(c[2] == 1365.0f / 4096.0f);
    CHECK(c[3] == std::ldexp(1.0f, -24));
    CHECK(c[4] == 65504.0f);
    CHECK(c[5] == -INFINITY);
    // read_range: any window of a tensor, each dtype, as read() has it
    for (const char* name : {"a", "b", "c"}) {
        INFO(name);
        const std::vector<float> all = r.read(name);
        for (size_t first = 0; first < all.size(); first++)
            for (size_t n = 1; first + n <= all.size(); n++) {
                std::vector<float> got(n, 7.0f);
                r.read_range(name, first, n, got.data());
                CHECK(std::equal(got.begin(), got.end(), all.begin() + long(first)));
            }
    }
    CHECK_THAT(error_of([&] { float x; r.read_range("d", 0, 1, &x); }), Catch::Contains("tensor d is I32"));
}

TEST_CASE("safetensors: broken files and bad requests are UserErrors naming the file and tensor", "[safetensors]") {
    const TempDir tmp("llmc_safetensors");
    const std::string dir = tmp.path;
    const std::vector<uint8_t> good = file_bytes(kHeader, good_data());

    SECTION("a file shorter than the 8-byte header length") {
        const std::string p = write_bytes(dir + "/short.safetensors", {1, 0, 0, 0, 0});
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("truncated"));
    }
    SECTION("a file cut inside the data section") {
        const std::string p =
            write_bytes(dir + "/cut.safetensors", std::vector<uint8_t>(good.begin(), good.end() - 2));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        // the last tensor, d [36, 40), no longer fits
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor d") && Catch::Contains("truncated"));
    }
    SECTION("a header length past the end of the file") {
        const std::string p = write_bytes(dir + "/len.safetensors", file_bytes(kHeader, good_data(), 100000));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("header length 100000"));
    }
    SECTION("a header that is not JSON") {
        const std::string p = write_bytes(dir + "/json.safetensors", file_bytes("{\"a\": [1, 2", {}));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("not valid JSON"));
    }
    SECTION("data_offsets past the data section") {
        const std::string h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}";
        const std::string p = write_bytes(dir + "/range.safetensors", file_bytes(h, std::vector<uint8_t>(16)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor x") && Catch::Contains("[8, 24)"));
    }
    SECTION("numbers that are not non-negative integers, and shapes whose count would wrap (found by fuzzing)") {
        for (const char* h : {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,2.465e127]}}",
                              "{\"x\":{\"dtype\":\"F32\",\"shape\":[4.5],\"data_offsets\":[0,16]}}",
                              "{\"x\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}"}) {
            const std::string p = write_bytes(dir + "/num.safetensors", file_bytes(h, std::vector<uint8_t>(16)));
            const std::string m = error_of([&] { SafetensorsReader r(p); });
            CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor x") && Catch::Contains("integers"));
        }
        // 2^33 x 2^31 x 4 elements: 2^66 wraps to 0 in uint64, as would the data_offsets [0, 0)
        const std::string h =
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[8589934592,2147483648,4],\"data_offsets\":[0,0]}}";
        const std::string p = write_bytes(dir + "/wrap.safetensors", file_bytes(h, {}));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor x") && Catch::Contains("too large"));
    }
    SECTION("data_offsets that do not match the shape") {
        const std::string h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}";
        const std::string p = write_bytes(dir + "/size.safetensors", file_bytes(h, std::vector<uint8_t>(16)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor x") && Catch::Contains("4 F32 elements"));
    }
    SECTION("data_offsets ending before they begin") {
        const std::string h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}";
        const std::string p = write_bytes(dir + "/order.safetensors", file_bytes(h, std::vector<uint8_t>(16)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor x"));
    }
    SECTION("reading a tensor of a dtype other than F32, BF16, F16") {
        const std::string p = write_bytes(dir + "/dtype.safetensors", good);
        const SafetensorsReader r(p);
        const std::string m = error_of([&] { r.read("d"); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensor d") && Catch::Contains("I32"));
    }
    SECTION("a missing tensor") {
        const std::string p = write_bytes(dir + "/missing.safetensors", good);
        const SafetensorsReader r(p);
        std::string m = error_of([&] { r.read("nope"); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("nope"));
        m = error_of([&] { r.entry("nope"); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("nope"));
    }
    SECTION("a file that does not exist") {
        const std::string p = dir + "/absent.safetensors";
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p));
    }
    SECTION("two tensors over overlapping bytes (issue 34)") {
        // y's [8, 24) reaches into x's [0, 16); z after them is fine
        const std::string h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                              "\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[24,28]},"
                              "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}";
        const std::string p = write_bytes(dir + "/overlap.safetensors", file_bytes(h, std::vector<uint8_t>(28)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("tensors x [0, 16) and y [8, 24) overlap"));
        // the same bytes under two names overlap too; adjacent tensors and empty ones do not
        const std::string same = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                                 "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
        const std::string p2 = write_bytes(dir + "/alias.safetensors", file_bytes(same, std::vector<uint8_t>(16)));
        CHECK_THAT(error_of([&] { SafetensorsReader r(p2); }), Catch::Contains("tensors w [0, 16) and x [0, 16) overlap"));
        const std::string fine = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                                 "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}";
        const std::string p3 = write_bytes(dir + "/adjacent.safetensors", file_bytes(fine, std::vector<uint8_t>(32)));
        CHECK_NOTHROW(SafetensorsReader(p3));
    }
    SECTION("a tensor named twice (JSON keeps the last silently; issue 34)") {
        const std::string h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                              "\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}";
        const std::string p = write_bytes(dir + "/dup.safetensors", file_bytes(h, std::vector<uint8_t>(32)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("names \"x\" twice"));
    }
    SECTION("a header of invalid UTF-8 is shown escaped, never raw (issue 34)") {
        const std::string h = "{\"x\xff\xfe\x1b[31m\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
        const std::string p = write_bytes(dir + "/utf8.safetensors", file_bytes(h, std::vector<uint8_t>(4)));
        const std::string m = error_of([&] { SafetensorsReader r(p); });
        CHECK_THAT(m, Catch::Contains(p) && Catch::Contains("not valid JSON") && Catch::Contains("{\"x\\xff"));
        for (char c : m) CHECK((c >= 0x20 && c < 0x7f));  // no raw byte, no escape sequence
    }
}

// The writer takes each tensor from its fill as it writes (hf_write_weights: the final weights a
// tensor at a time): the fills run once each, in order, and what they wrote is what a reader reads;
// a fill that fails leaves the file at that path as it was and no temporary beside it.
TEST_CASE("safetensors: the writer streams each tensor from its fill; a failing fill leaves the old file",
          "[safetensors]") {
    const TempDir tmp("llmc_safetensors");
    const std::string path = tmp.file("w.safetensors");
    std::vector<std::string> order;
    SafetensorsWriter w;
    w.add("b", {2, 3}, [&](float* out) {
        order.push_back("b");
        for (int i = 0; i < 6; i++) out[i] = float(i) + 0.5f;
    });
    const float a[4] = {-1.0f, 2.0f, -3.0f, 4.0f};
    w.add("a", {4}, a);
    w.write(path);
    CHECK(order == std::vector<std::string>{"b"});
    const SafetensorsReader r(path);
    CHECK(r.read("b") == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f});
    CHECK(r.read("a") == std::vector<float>{-1.0f, 2.0f, -3.0f, 4.0f});
    CHECK(r.entry("b").shape == std::vector<int64_t>{2, 3});

    SafetensorsWriter bad;
    bad.add("a", {4}, a);
    bad.add("c", {1 << 20}, [](float*) { throw UserError("no weights for c"); });
    CHECK(error_of([&] { bad.write(path); }) == "no weights for c");
    CHECK(SafetensorsReader(path).read("b") == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f});
    int others = 0;
    for (const auto& e : std::filesystem::directory_iterator(tmp.path)) others += e.path() != path;
    CHECK(others == 0);
}
