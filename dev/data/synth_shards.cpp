// Writes synthetic token shards in llm.c's formats (llmc/data/shard.h), for tests and benchmarks.
//
//   dev/data/synth_shards --out PREFIX [--shards 1] [--tokens 100000] [--vocab 50257]
//                         [--seed 0] [--noise 0.1] [--period 64] [--u32]
//
// Tokens follow a learnable process: mostly next = (prev * 5 + 3) % period, with a
// fraction `noise` of tokens drawn uniformly from the whole vocabulary, so a model's
// loss visibly falls within a few dozen steps.
// Shards hold uint16 tokens (version 1) for a vocabulary of at most 65536, else uint32 tokens
// (version 7); --u32 writes uint32 shards for any vocabulary. The tokens are the same either way.
// Files: PREFIX_000000.bin, PREFIX_000001.bin, ...
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/rng.h"
#include "llmc/data/shard.h"

static void usage() {
    std::fprintf(stderr,
                 "usage: synth_shards --out PREFIX [--shards N] [--tokens N] [--vocab V] [--seed S] [--noise F] [--period P] [--u32]\n"
                 "  V in [2, 16777216]; V > 65536 or --u32 writes uint32 shards\n");
}

// A flag's value, whole and in [lo, hi]; otherwise a message naming the flag and the value, exit 2.
static long int_arg(const char* flag, const char* s, long lo, long hi) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        std::fprintf(stderr, "synth_shards: %s %s: not an integer in [%ld, %ld]\n", flag, s, lo, hi);
        std::exit(2);
    }
    return v;
}
static double num_arg(const char* flag, const char* s, double lo, double hi) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        std::fprintf(stderr, "synth_shards: %s %s: not a number in [%g, %g]\n", flag, s, lo, hi);
        std::exit(2);
    }
    return v;
}

int main(int argc, char** argv) {
    std::string out;
    long shards = 1, tokens = 100000, vocab = 50257, seed = 0, period = 64;
    double noise = 0.1;
    bool u32 = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&](const char* name) -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "synth_shards: %s needs a value\n", name);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--out") out = val("--out");
        else if (a == "--shards") shards = int_arg("--shards", val("--shards"), 1, 999999);
        else if (a == "--tokens") tokens = int_arg("--tokens", val("--tokens"), 2, INT32_MAX);
        else if (a == "--vocab") vocab = int_arg("--vocab", val("--vocab"), 2, 16777216);
        else if (a == "--seed") seed = int_arg("--seed", val("--seed"), 0, LONG_MAX);
        else if (a == "--period") period = int_arg("--period", val("--period"), 1, LONG_MAX);
        else if (a == "--noise") noise = num_arg("--noise", val("--noise"), 0, 1);
        else if (a == "--u32") u32 = true;
        else if (a == "--help" || a == "-h") { usage(); return 0; }
        else {
            std::fprintf(stderr, "synth_shards: unknown argument %s\n", a.c_str());
            usage();
            return 2;
        }
    }
    if (out.empty()) {
        std::fprintf(stderr, "synth_shards: --out PREFIX is required\n");
        usage();
        return 2;
    }
    try {
        const size_t slash = out.rfind('/');
        if (slash != std::string::npos && slash > 0) make_dirs(out.substr(0, slash), "--out");
        Rng rng(uint64_t(seed), 17);
        uint32_t prev = 0;
        u32 = u32 || vocab > SHARD_U16_MAX_VOCAB;
        std::vector<uint32_t> buf(tokens);
        std::vector<uint16_t> buf16(u32 ? 0 : tokens);
        for (long s = 0; s < shards; s++) {
            for (long i = 0; i < tokens; i++) {
                prev = rng.uniform() < noise ? uint32_t(rng.below(uint64_t(vocab))) : (prev * 5u + 3u) % uint32_t(std::min(period, vocab));
                buf[i] = prev;
            }
            std::string path = out + strfmt("_%06ld.bin", s);
            if (u32) {
                shard_write(path, buf.data(), buf.size());
            } else {
                std::copy(buf.begin(), buf.end(), buf16.begin());
                shard_write(path, buf16.data(), buf16.size());
            }
            std::printf("wrote %s (%ld %s tokens)\n", path.c_str(), tokens, u32 ? "uint32" : "uint16");
        }
    } catch (const UserError& e) {
        std::fprintf(stderr, "synth_shards: %s\n", e.what());
        return 2;
    }
    return 0;
}
