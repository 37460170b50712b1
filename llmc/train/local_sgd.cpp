#include "llmc/train/local_sgd.h"

#include <algorithm>

#include "llmc/train/data_parallel.h"

LocalSgd::LocalSgd(const LocalSgdConfig& cfg, size_t padded, Ops& ops, Comm& dp, int zero, size_t piece)
    : cfg_(cfg), padded_(padded), comm_(dp), stage_(ops, &dp), zero_(zero), piece_(std::max<size_t>(1, piece)) {
    LLMC_ASSERT(cfg.every >= 1, "local SGD: every must be >= 1");
    LLMC_ASSERT(zero == 0 || zero == 1, "local SGD: ZeRO stage 0 or 1");
    LLMC_ASSERT(padded % size_t(dp.size()) == 0, "local SGD: the buffer does not divide among the DP ranks");
    const size_t shard = padded / size_t(dp.size());
    begin_ = zero == 0 ? 0 : size_t(dp.rank()) * shard;
    end_ = zero == 0 ? padded : begin_ + shard;
    anchor_.assign(end_ - begin_, 0.0f);
    momentum_.assign(end_ - begin_, 0.0f);
}

std::vector<size_t> LocalSgd::counts(size_t begin, size_t end) const {
    return DataParallel::shard_counts(begin, end, padded_ / size_t(comm_.size()), comm_.size());
}

void LocalSgd::start(const AdamW& opt) {
    LLMC_ASSERT(opt.begin() == 0 && opt.end() == padded_ && opt.owned() == padded_,
                "local SGD: the inner optimizer must own the whole buffer");
    const std::vector<float> w = opt.get_weights();
    std::copy(w.begin() + long(begin_), w.begin() + long(end_), anchor_.begin());
    std::fill(momentum_.begin(), momentum_.end(), 0.0f);
}

void LocalSgd::sync(AdamW& opt) {
    LLMC_ASSERT(opt.owned() == padded_, "local SGD: the inner optimizer must own the whole buffer");
    std::vector<float> w = opt.get_weights();
    const int dp = comm_.size();
    // sum[i] over the outer range: the replicas' weights summed (in place at ZeRO-0)
    std::vector<float> shard_sum(zero_ == 1 ? end_ - begin_ : 0);
    float* sum = zero_ == 0 ? w.data() : shard_sum.data();
    if (zero_ == 0) {
        stage_.all_reduce_host(w.data(), padded_, piece_);
        bytes_sent_ += DataParallel::ring_bytes_all_reduce(4.0 * double(padded_), dp);
    }
    for (size_t b = 0; b < padded_ && dp > 1 && zero_ == 1; b += piece_) {
        const size_t n = std::min(piece_, padded_ - b);
        const std::vector<size_t> c = counts(b, b + n);
        const size_t mine = c[size_t(comm_.rank())];
        float* out = shard_sum.data() + (mine ? std::max(b, begin_) - begin_ : 0);
        stage_.run_host(w.data() + b, n, out, mine,
                        [&](const float* in, float* o) { comm_.reduce_scatter(in, o, c); });
        bytes_sent_ += DataParallel::ring_bytes_gather(4.0 * double(n), dp);
    }
    if (dp == 1 && zero_ == 1) std::copy(w.begin(), w.end(), shard_sum.begin());  // (a group of one: the range is all)
    // the outer step: SGD with Nesterov momentum on the averaged delta
    const float lr = float(cfg_.outer_lr), mu = float(cfg_.outer_momentum), inv = float(dp);
    for (size_t i = 0; i < anchor_.size(); i++) {
        const float mean = sum[i] / inv;
        const float delta = anchor_[i] - mean;
        momentum_[i] = mu * momentum_[i] + delta;
        anchor_[i] -= lr * (delta + mu * momentum_[i]);
    }
    // every replica gets the new weights
    if (zero_ == 0) {
        w = anchor_;
    } else {
        for (size_t b = 0; b < padded_; b += piece_) {
            const size_t n = std::min(piece_, padded_ - b);
            const std::vector<size_t> c = counts(b, b + n);
            const size_t mine = c[size_t(comm_.rank())];
            const float* own = anchor_.data() + (mine ? std::max(b, begin_) - begin_ : 0);
            if (dp == 1) {
                std::copy(own, own + n, w.begin() + long(b));
                continue;
            }
            stage_.run_host(own, mine, w.data() + b, n, [&](const float* in, float* o) { comm_.all_gather(in, o, c); });
            bytes_sent_ += DataParallel::ring_bytes_gather(4.0 * double(n), dp);
        }
    }
    opt.set_weights(w);
}

void LocalSgd::set_state(const std::vector<float>& anchor_whole, const std::vector<float>& momentum_whole) {
    LLMC_ASSERT(anchor_whole.size() == padded_ && momentum_whole.size() == padded_,
                "local SGD state is not the whole buffer");
    std::copy(anchor_whole.begin() + long(begin_), anchor_whole.begin() + long(end_), anchor_.begin());
    std::copy(momentum_whole.begin() + long(begin_), momentum_whole.begin() + long(end_), momentum_.begin());
}

std::vector<float> LocalSgd::gather_ranges(const std::vector<float>& range) {
    if (zero_ == 0) return comm_.rank() == 0 ? range : std::vector<float>();
    const int me = comm_.rank();
    std::vector<float> out(me == 0 ? padded_ : 0);
    for (size_t b = 0; b < padded_; b += piece_) {
        const size_t n = std::min(piece_, padded_ - b);
        const std::vector<size_t> c = counts(b, b + n);
        const size_t mine = c[size_t(me)];
        const float* own = range.data() + (mine ? std::max(b, begin_) - begin_ : 0);
        stage_.run_host(own, mine, me == 0 ? out.data() + b : nullptr, me == 0 ? n : 0,
                        [&](const float* in, float* o) { comm_.gather(in, o, c, 0); });
    }
    return out;
}

LocalSgdState LocalSgd::gather(const ReplicaState& mine) {
    LocalSgdState st;
    st.anchor = gather_ranges(anchor_);
    st.momentum = gather_ranges(momentum_);
    for (int k = 1; k < comm_.size(); k++) {
        ReplicaState r;
        r.params = stage_.gather_host(mine.params, k, piece_);
        r.m = stage_.gather_host(mine.m, k, piece_);
        r.v = stage_.gather_host(mine.v, k, piece_);
        r.master = stage_.gather_host(mine.master, k, piece_);
        if (comm_.rank() == 0) st.replicas.push_back(std::move(r));
    }
    return st;
}
