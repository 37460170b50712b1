// Streaming, distributed, optionally shuffled reader of llm.c token shards (llmc/data/shard.h):
// uint16 shards (version 1) and uint32 shards (version 7), mixed freely within one glob; a
// window's position is counted in tokens, so the order is the same whatever the token width.
//
// Each shard of ntok tokens is cut into W = (ntok - 1) / (world*B*T) window groups.
// Group g holds one window per rank: rank r reads the B*T+1 tokens starting at token
// (g*world + r)*B*T, so the ranks' windows are disjoint (llm.c's convention).
// A micro-batch is one window: inputs = tokens [0, B*T), targets = tokens [1, B*T].
//
// shuffle=false: shards in sorted glob order, groups in file order, wrapping to the
// first shard after the last (epoch+1); this is exactly llm.c's DataLoader.
// shuffle=true: the shard order of each epoch and the group order of each shard are
// seeded permutations, pure functions of (seed, epoch) and (seed, epoch, shard file):
// identical on every rank, different every epoch, independent of the C++ library.
//
// Shards are never loaded whole: each window is read with pread from the open file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

// Where the loader is: the next micro-batch it will yield. Part of the training state.
struct LoaderPosition {
    uint64_t epoch = 0;   // passes over the data completed
    uint64_t shard = 0;   // index into this epoch's shard order
    uint64_t window = 0;  // index into the current shard's window-group order
    uint64_t seed = 0;    // permutation seed (shuffle only)
    bool operator==(const LoaderPosition& o) const {
        return epoch == o.epoch && shard == o.shard && window == o.window && seed == o.seed;
    }
    bool operator!=(const LoaderPosition& o) const { return !(*this == o); }
};

class DataLoader {
public:
    // Matches the glob, checks every shard's header and size, and that each holds at least
    // one window group (world*B*T+1 tokens). Throws UserError naming the glob or file.
    DataLoader(const std::string& glob, int B, int T, int rank, int world, bool shuffle, uint64_t seed,
               int vocab_size);
    DataLoader(DataLoader&&) = default;  // movable, not copyable (owns an open file)
    DataLoader& operator=(DataLoader&&) = default;

    // Reads the next window into inputs and targets (B*T int32 each) and advances. Each shard's
    // tokens are all checked against vocab_size when it is first opened (the first in the
    // constructor). Throws UserError naming the file on a token id >= vocab_size or a failed read.
    void next(int32_t* inputs, int32_t* targets);

    LoaderPosition position() const { return pos_; }
    // Resumes exactly where position() was taken. Throws UserError if it does not fit the shards.
    void set_position(const LoaderPosition& p);
    // Back to the start of epoch 0 (keeping the seed).
    void reset();

    size_t num_shards() const { return files_.size(); }
    const std::vector<std::string>& files() const { return files_; }  // the shards, in sorted glob order
    // Window groups in shard i (file order) = micro-batches per rank from that shard.
    uint64_t shard_windows(size_t i) const { return groups_[i]; }
    // Micro-batches per rank in one epoch.
    uint64_t windows_per_epoch() const;

private:
    void sync();  // brings the orders and the open file in line with pos_
    void check_tokens(int fd);  // every token of shard cur_file_ < vocab_size, or UserError naming it

    std::vector<std::string> files_;
    std::vector<uint64_t> groups_;  // window groups per file
    std::vector<size_t> token_bytes_;  // 2 or 4 per file
    size_t B_, T_;
    int rank_, world_, vocab_;
    bool shuffle_;
    LoaderPosition pos_;

    // Shuffle orders for the current position: built for (order_seed_, order_epoch_, cur_file_).
    std::vector<uint32_t> shard_order_;   // shard order position -> file index
    std::vector<uint32_t> window_order_;  // window position -> group in cur_file_
    uint64_t order_seed_ = 0, order_epoch_ = UINT64_MAX;
    size_t cur_file_ = SIZE_MAX;  // file of pos_.shard; its window order is in window_order_

    struct Fd {  // owns a file descriptor
        int fd = -1;
        Fd() = default;
        Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
        Fd& operator=(Fd&& o) noexcept;
        ~Fd();
    } fd_;
    size_t fd_file_ = SIZE_MAX;  // file open on fd_
    std::vector<bool> checked_;  // per file: check_tokens() passed
    std::vector<unsigned char> raw_;  // a window as stored
    std::vector<uint32_t> buf_;       // a window's tokens
};
