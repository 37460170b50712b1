#include "llmc/data/dataloader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "llmc/core/common.h"
#include "llmc/data/shard.h"

namespace {

// splitmix64: a self-contained generator, so permutations are the same with every
// compiler and standard library.
constexpr uint64_t GOLDEN = 0x9e3779b97f4a7c15ull;

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: a bijective 64-bit hash
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct SplitMix64 {
    uint64_t state;
    uint64_t next() { return mix64(state += GOLDEN); }
    // Uniform in [0, n), n > 0, without modulo bias.
    uint64_t below(uint64_t n) {
        uint64_t reject_under = (0 - n) % n;  // 2^64 mod n
        for (;;) {
            uint64_t x = next();
            if (x >= reject_under) return x % n;
        }
    }
};

// Fisher-Yates shuffle of 0..n-1 from a seed that is a pure function of (seed, epoch, stream).
void seeded_permutation(std::vector<uint32_t>& v, size_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
    v.resize(n);
    std::iota(v.begin(), v.end(), 0u);
    SplitMix64 rng{mix64(mix64(mix64(seed + GOLDEN) + epoch) + stream)};
    for (size_t i = n; i > 1; i--) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

DataLoader::Fd& DataLoader::Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd >= 0) ::close(fd);
        fd = o.fd;
        o.fd = -1;
    }
    return *this;
}

DataLoader::Fd::~Fd() {
    if (fd >= 0) ::close(fd);
}

DataLoader::DataLoader(const std::string& glob, int B, int T, int rank, int world, bool shuffle, uint64_t seed,
                       int vocab_size)
    : B_(B), T_(T), rank_(rank), world_(world), vocab_(vocab_size), shuffle_(shuffle) {
    if (B <= 0 || T <= 0) throw UserError(strfmt("data loader: micro_batch (%d) and seq_len (%d) must be > 0", B, T));
    if (world <= 0 || rank < 0 || rank >= world)
        throw UserError(strfmt("data loader: rank %d is not in [0, %d)", rank, world));
    if (vocab_size <= 0) throw UserError(strfmt("data loader: vocab_size %d must be > 0", vocab_size));
    files_ = glob_files(glob);
    if (files_.empty()) throw UserError(strfmt("data: no file matches '%s'", glob.c_str()));
    const uint64_t group_tokens = uint64_t(world) * B_ * T_;
    for (const std::string& f : files_) {
        const ShardInfo info = shard_info(f);
        const uint64_t ntok = info.tokens;
        if (ntok < group_tokens + 1)
            throw UserError(strfmt("shard %s: %llu tokens, too few for one batch: needs at least %llu "
                                   "(world %d x micro_batch %d x seq_len %d + 1)",
                                   f.c_str(), (unsigned long long)ntok, (unsigned long long)(group_tokens + 1),
                                   world, B, T));
        groups_.push_back((ntok - 1) / group_tokens);
        token_bytes_.push_back(info.token_bytes);
    }
    checked_.assign(files_.size(), false);
    raw_.resize((B_ * T_ + 1) * sizeof(uint32_t));
    buf_.resize(B_ * T_ + 1);
    pos_.seed = seed;
    sync();
}

uint64_t DataLoader::windows_per_epoch() const {
    return std::accumulate(groups_.begin(), groups_.end(), uint64_t(0));
}


void DataLoader::sync() {
    bool new_order = order_epoch_ != pos_.epoch || order_seed_ != pos_.seed;
    if (new_order) {
        if (shuffle_) {
            seeded_permutation(shard_order_, files_.size(), pos_.seed, pos_.epoch, 0);
        } else {
            shard_order_.resize(files_.size());
            std::iota(shard_order_.begin(), shard_order_.end(), 0u);
        }
        order_epoch_ = pos_.epoch;
        order_seed_ = pos_.seed;
    }
    size_t file = shard_order_[pos_.shard];
    if (new_order || file != cur_file_) {
        cur_file_ = file;
        if (shuffle_) seeded_permutation(window_order_, groups_[file], pos_.seed, pos_.epoch, file + 1);
    }
    if (fd_file_ != cur_file_) {
        Fd f;
        f.fd = ::open(files_[cur_file_].c_str(), O_RDONLY | O_CLOEXEC);
        if (f.fd < 0)
            throw UserError(strfmt("shard %s: cannot open: %s", files_[cur_file_].c_str(), std::strerror(errno)));
        if (!checked_[cur_file_]) check_tokens(f.fd);
        fd_ = std::move(f);
        fd_file_ = cur_file_;
    }
}

// One sequential pass over the tokens of shard cur_file_ (open on fd): a token >= vocab_size fails when the shard is
// first opened, not in whichever step reads its window.
void DataLoader::check_tokens(int fd) {
    const std::string& path = files_[cur_file_];
    const size_t width = token_bytes_[cur_file_];
    const uint64_t tokens = shard_info(path).tokens;
    std::vector<unsigned char> chunk(size_t(1) << 20);
    for (uint64_t first = 0; first < tokens;) {
        const size_t n = size_t(std::min<uint64_t>(tokens - first, chunk.size() / width));
        size_t got = 0;
        while (got < n * width) {
            const ssize_t r = ::pread(fd, chunk.data() + got, n * width - got,
                                      off_t(SHARD_HEADER_BYTES + first * width + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                throw UserError(strfmt("shard %s: read failed: %s", path.c_str(),
                                       r < 0 ? std::strerror(errno) : "file shorter than its header says"));
            got += size_t(r);
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t t = 0;
            if (width == sizeof(uint16_t)) {
                uint16_t t16;
                std::memcpy(&t16, chunk.data() + i * width, sizeof(t16));
                t = t16;
            } else {
                std::memcpy(&t, chunk.data() + i * width, sizeof(t));
            }
            if (t >= uint32_t(vocab_))
                throw UserError(strfmt("shard %s: token id %u at token offset %llu is >= vocab_size %d", path.c_str(), t,
                                       (unsigned long long)(first + i), vocab_));
        }
        first += n;
    }
    checked_[cur_file_] = true;
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
    sync();  // a no-op unless an earlier open failed
    const std::string& path = files_[cur_file_];
    const uint64_t group = shuffle_ ? window_order_[pos_.window] : pos_.window;
    const uint64_t start = (group * world_ + rank_) * B_ * T_;  // first token of the window
    const size_t n = B_ * T_ + 1;
    const size_t width = token_bytes_[cur_file_];
    unsigned char* dst = raw_.data();
    size_t want = n * width, got = 0;
    while (got < want) {
        ssize_t r = ::pread(fd_.fd, dst + got, want - got, off_t(SHARD_HEADER_BYTES + start * width + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            throw UserError(strfmt("shard %s: read of tokens [%llu, %llu) failed: %s", path.c_str(),
                                   (unsigned long long)start, (unsigned long long)(start + n),
                                   r < 0 ? std::strerror(errno) : "file shorter than its header says (changed "
                                                                   "since the loader opened it?)"));
        got += size_t(r);
    }
    for (size_t i = 0; i < n; i++) {  // tokens in the host's byte order (little-endian, as llm.c's)
        if (width == sizeof(uint16_t)) {
            uint16_t t;
            std::memcpy(&t, dst + i * width, sizeof(t));
            buf_[i] = t;
        } else {
            std::memcpy(&buf_[i], dst + i * width, sizeof(uint32_t));
        }
        if (buf_[i] >= uint32_t(vocab_))
            throw UserError(strfmt("shard %s: token id %u at token offset %llu is >= vocab_size %d", path.c_str(),
                                   buf_[i], (unsigned long long)(start + i), vocab_));
    }
    for (size_t i = 0; i + 1 < n; i++) {
        inputs[i] = int32_t(buf_[i]);
        targets[i] = int32_t(buf_[i + 1]);
    }
    // advance to the next window, shard, epoch
    if (++pos_.window == groups_[cur_file_]) {
        pos_.window = 0;
        if (++pos_.shard == files_.size()) {
            pos_.shard = 0;
            pos_.epoch++;
        }
    }
    sync();
}

void DataLoader::set_position(const LoaderPosition& p) {
    if (p.shard >= files_.size())
        throw UserError(strfmt("data loader position: shard %llu, but the glob matches %zu shards (data changed "
                               "since the checkpoint?)",
                               (unsigned long long)p.shard, files_.size()));
    LoaderPosition old = pos_;
    pos_ = p;
    try {
        sync();  // may open a shard that fails its check
    } catch (const UserError&) {
        pos_ = old;
        sync();
        throw;
    }
    if (p.window >= groups_[cur_file_]) {
        std::string file = files_[cur_file_];
        uint64_t have = groups_[cur_file_];
        pos_ = old;
        sync();
        throw UserError(strfmt("data loader position: window %llu, but shard %s has %llu windows (data or batch "
                               "size changed since the checkpoint?)",
                               (unsigned long long)p.window, file.c_str(), (unsigned long long)have));
    }
}

void DataLoader::reset() {
    LoaderPosition p;
    p.seed = pos_.seed;
    set_position(p);
}
