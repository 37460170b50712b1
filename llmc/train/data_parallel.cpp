#include "llmc/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/train/powersgd.h"

MemoryPlan zero_memory_plan(size_t padded_params, int dp, int zero, size_t dtype_bytes, bool master,
                            size_t bucket_elems, size_t activation_bytes, const UnitSizes& u, bool offload_optimizer,
                            size_t optimizer_elems) {
    MemoryPlan m;
    m.padded_params = padded_params;
    m.dp = dp;
    m.zero = zero;
    const size_t psi = padded_params, shard = padded_params / size_t(dp), o = master ? 12 : 8;
    m.params = (zero >= 3 ? shard : psi) * dtype_bytes;
    m.grads = (zero >= 2 ? shard : psi) * dtype_bytes;
    const size_t range = zero >= 1 ? (optimizer_elems ? optimizer_elems : shard) : psi;  // the optimizer's
    m.optimizer = range * o;
    if (offload_optimizer) {
        m.optimizer = 0;
        m.host = AdamW::offload_host_bytes(range, AdamW::offload_piece(range, bucket_elems), dtype_bytes, master);
    }
    m.comm_buffers = (zero == 0 ? 1 : 2) * bucket_elems * sizeof(float);
    m.activations = activation_bytes;
    if (zero >= 3) m.unit_params = (u.embedding + u.head + 2 * u.layer) * dtype_bytes;
    if (zero >= 2) m.unit_grads = (u.embedding + u.head + u.layer) * dtype_bytes;
    return m;
}

std::vector<std::pair<size_t, size_t>> dense_runs(const ParamLayout& layout) {
    std::vector<std::pair<size_t, size_t>> runs;
    size_t at = 0;  // the runs between the experts' tensors (specs are in memory order)
    for (const ParamSpec& p : layout.specs) {
        if (p.expert < 0) continue;
        if (p.offset > at) runs.push_back({at, p.offset});
        at = p.offset + p.numel;
    }
    if (layout.padded_params > at) runs.push_back({at, layout.padded_params});
    return runs;
}

size_t runs_numel(const std::vector<std::pair<size_t, size_t>>& runs) {
    size_t n = 0;
    for (const auto& r : runs) n += r.second - r.first;
    return n;
}

namespace {
// runs clipped to [lo, hi)
std::vector<std::pair<size_t, size_t>> clip_runs(const std::vector<std::pair<size_t, size_t>>& runs, size_t lo,
                                                 size_t hi) {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& r : runs) {
        const size_t b = std::max(r.first, lo), e = std::min(r.second, hi);
        if (b < e) out.push_back({b, e});
    }
    return out;
}
// The cut of nd dense elements into ep parts: part k is [cut[k], cut[k + 1])
std::vector<size_t> dense_cuts(size_t nd, int ep) {
    std::vector<size_t> cut;
    for (int k = 0; k <= ep; k++) cut.push_back(nd * size_t(k) / size_t(ep));
    return cut;
}
}  // namespace

std::vector<std::pair<size_t, size_t>> zero_optimizer_runs(const ParamLayout& layout, int edp, int edp_rank, int ep,
                                                           int ep_rank) {
    LLMC_ASSERT(edp >= 1 && ep >= 1 && edp_rank >= 0 && edp_rank < edp && ep_rank >= 0 && ep_rank < ep,
                "zero_optimizer_runs: rank outside its group");
    const size_t shard = layout.padded_params / size_t(edp), lo = size_t(edp_rank) * shard, hi = lo + shard;
    const std::vector<std::pair<size_t, size_t>> dense = clip_runs(dense_runs(layout), lo, hi);
    const std::vector<size_t> cut = dense_cuts(runs_numel(dense), ep);
    auto flat = [&](size_t i) {  // where the shard's dense element i sits (hi for i = nd)
        for (const auto& r : dense) {
            if (i < r.second - r.first) return r.first + i;
            i -= r.second - r.first;
        }
        return hi;
    };
    // the experts (the gaps between the dense runs) and [flat(cut[k]), flat(cut[k + 1]))
    std::vector<std::pair<size_t, size_t>> parts;
    size_t at = lo;
    for (const auto& r : dense) {
        if (r.first > at) parts.push_back({at, r.first});
        at = r.second;
    }
    if (hi > at) parts.push_back({at, hi});
    const size_t mb = flat(cut[size_t(ep_rank)]), me = flat(cut[size_t(ep_rank) + 1]);
    if (mb < me) parts.push_back({mb, me});
    std::sort(parts.begin(), parts.end());
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& p : parts) {
        if (!out.empty() && p.first <= out.back().second) out.back().second = std::max(out.back().second, p.second);
        else out.push_back(p);
    }
    return out;
}

size_t zero_optimizer_most(const ParamLayout& layout, int edp, int ep) {
    const size_t shard = layout.padded_params / size_t(edp);
    const std::vector<std::pair<size_t, size_t>> dense = dense_runs(layout);
    size_t most = 0, d = 0;  // d: the first dense run that may reach into shard j
    for (size_t j = 0; j < size_t(edp); j++) {
        const size_t lo = j * shard, hi = lo + shard;
        size_t nd = 0;
        while (d < dense.size() && dense[d].second <= lo) d++;
        for (size_t i = d; i < dense.size() && dense[i].first < hi; i++)
            nd += std::min(dense[i].second, hi) - std::max(dense[i].first, lo);
        most = std::max(most, shard - nd + (nd + size_t(ep) - 1) / size_t(ep));
    }
    return most;
}

UnitSizes unit_sizes(const std::vector<ParamUnit>& units) {
    UnitSizes s;
    for (const ParamUnit& u : units) {
        size_t& m = u.kind == ParamUnit::Embedding ? s.embedding : u.kind == ParamUnit::Head ? s.head : s.layer;
        m = std::max(m, u.numel());
    }
    return s;
}

size_t DataParallel::bucket_elems_for(double bucket_mb, size_t padded_params) {
    const size_t want = size_t(std::max(1.0, bucket_mb * 1024.0 * 1024.0 / sizeof(float)));
    return std::min(want, padded_params);
}

Tensor DataParallel::alloc(size_t n) {
    void* p = ops_.alloc(n * dtype_size(dtype_));
    allocations_.push_back(p);
    return Tensor(p, n, dtype_);
}

DataParallel::DataParallel(const ParamLayout& layout, Ops& ops, DType dtype, Comm& dp, int zero, double bucket_mb,
                           bool host_staging, Comm* ep, bool local)
    : layout_(layout), ops_(ops), dtype_(dtype), comm_(dp), ep_(ep && ep->size() > 1 ? ep : nullptr),
      ep_stage_(ops, ep_), zero_(zero), local_(local) {
    if (ep_) dense_ = dense_runs(layout);
    LLMC_ASSERT(zero >= 0 && zero <= 3, "ZeRO stage outside 0..3");
    LLMC_ASSERT(!local || (zero == 0 && !ep_), "local updates (local SGD) keep whole replicas: ZeRO-0, no ep");
    LLMC_ASSERT(layout.padded_params % pad_multiple(dp.size()) == 0, "parameters not padded for this dp");
    if (zero < 3) {
        whole_.reset(new WholeStore(ops, layout, dtype, zero < 2));
        param_buf_ = whole_->params;
        grad_buf_ = whole_->grads;
    }
    shard_ = layout.padded_params / size_t(dp.size());
    split_ = ep_ && zero_ >= 1;
    if (split_) {
        opt_runs_ = zero_optimizer_runs(layout, dp.size(), dp.rank(), ep_->size(), ep_->rank());
        range_dense_ = clip_runs(dense_, opt_begin(), opt_end());
        dense_cut_ = dense_cuts(runs_numel(range_dense_), ep_->size());
        LLMC_ASSERT(!opt_runs_.empty(), "ZeRO under expert parallelism: a rank owns no optimizer element");
    } else {
        opt_runs_ = {{opt_begin(), opt_end()}};
    }
    bucket_elems_ = bucket_elems_for(bucket_mb, layout.padded_params);
    // buckets from the end backwards: the order in which backward finishes the gradients
    for (size_t end = layout.padded_params; end > 0;) {
        const size_t begin = end > bucket_elems_ ? end - bucket_elems_ : 0;
        buckets_.push_back({begin, end});
        end = begin;
    }
    LLMC_ASSERT(!(dp.on_device() && ops.host_memory()), "a device communicator over a host backend");
    solo_ = dp.size() == 1 && !ep_;
    direct_ = dp.on_device() || (ops.host_memory() && !host_staging);
    in_place_ = direct_ && dtype == DType::F32;
    norm_ = static_cast<double*>(ops.alloc(2 * sizeof(double)));
    allocations_.push_back(norm_);
    for (Staging* s : {&send_, &recv_}) {
        if (s == &recv_ && zero_ == 0) break;  // stage 0 all-reduces in the send buffer
        if (!direct_) {
            s->host.resize(bucket_elems_);
            continue;
        }
        s->dev = Tensor(ops.alloc(bucket_elems_ * sizeof(float)), bucket_elems_, DType::F32);
        allocations_.push_back(s->dev.ptr);
    }
    unit_sizes_ = unit_sizes(layout.units);
    if (zero_ < 2) return;
    const size_t sizes[3] = {unit_sizes_.embedding, unit_sizes_.layer, unit_sizes_.head};  // by ParamUnit::Kind
    static_assert(ParamUnit::Embedding == 0 && ParamUnit::Layer == 1 && ParamUnit::Head == 2, "kind order");
    grad_shard_ = alloc(shard_);  // alloc zero-initialises
    for (int k = 0; k < 3; k++)
        if (sizes[k]) grad_slots_[k].buf = alloc(sizes[k]);
    if (zero_ == 3) {
        param_shard_ = alloc(shard_);
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < (k == ParamUnit::Layer ? 2 : 1) && sizes[k]; i++) param_slots_[k].push_back(Slot{alloc(sizes[k]), -1, false, {}});
    }
}

DataParallel::~DataParallel() {
    for (void* p : allocations_) ops_.release(p);
}

ParamStore& DataParallel::param_store() {
    if (zero_ < 2) return *whole_;
    return *this;
}

Tensor DataParallel::opt_params() const {
    return zero_ == 3 ? param_shard_ : param_buf_.slice(opt_begin(), opt_end() - opt_begin());
}

Tensor DataParallel::opt_grads() const {
    return zero_ >= 2 ? grad_shard_ : grad_buf_.slice(opt_begin(), opt_end() - opt_begin());
}

std::vector<size_t> DataParallel::shard_counts(size_t begin, size_t end, size_t shard, int ranks) {
    std::vector<size_t> c(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; r++) {
        const size_t lo = std::max(begin, size_t(r) * shard), hi = std::min(end, size_t(r + 1) * shard);
        c[size_t(r)] = hi > lo ? hi - lo : 0;
    }
    return c;
}

void DataParallel::count_gather(const std::vector<size_t>& counts, const Comm& c) {
    size_t n = 0;
    for (size_t x : counts) n += x;
    bytes_sent_ += ring_bytes_gather(4.0 * double(n), c.size());
}

void DataParallel::load(Staging& s, Tensor src) {
    if (direct_) ops_.copy(s.dev.slice(0, src.n), src);
    else ops_.to_host_f32(s.host.data(), src);
}

void DataParallel::store(Tensor dst, Staging& s) {
    if (direct_) ops_.copy(dst, s.dev.slice(0, dst.n));
    else ops_.from_host_f32(dst, s.host.data());
}

void DataParallel::load_host(Staging& s, const float* src, size_t n) {
    if (direct_) ops_.from_host_bytes(s.dev.ptr, src, n * sizeof(float));
    else std::memcpy(s.host.data(), src, n * sizeof(float));
}

void DataParallel::store_host(float* dst, Staging& s, size_t n) {
    if (direct_) ops_.to_host_bytes(dst, s.dev.ptr, n * sizeof(float));
    else std::memcpy(dst, s.host.data(), n * sizeof(float));
}

void DataParallel::accumulate(Tensor dst) {
    load(send_, dst);
    if (direct_) {
        Tensor a = send_.dev.slice(0, dst.n);
        ops_.residual_forward(a, a, recv_.dev.slice(0, dst.n));
    } else {
        for (size_t i = 0; i < dst.n; i++) send_.host[i] += recv_.host[i];
    }
    store(dst, send_);
}

void DataParallel::reduce_dense(Staging& s, size_t begin, size_t n) {
    if (!ep_ || n == 0) return;
    const std::vector<std::pair<size_t, size_t>> runs = clip_runs(dense_, begin, begin + n);  // flat offsets
    const size_t total = runs_numel(runs);
    if (total == 0) return;  // alike on every member: the same range of the same layout
    std::vector<float> host(n), packed(total);
    store_host(host.data(), s, n);
    float* p = packed.data();
    for (const auto& r : runs) p = std::copy(host.begin() + long(r.first - begin), host.begin() + long(r.second - begin), p);
    if (split_) {  // this rank's part of the sums is all its optimizer reads: a reduce-scatter
        size_t q0 = 0;  // the piece's first dense element among the shard range's (packed order)
        for (const auto& r : range_dense_) q0 += r.first < begin ? std::min(r.second, begin) - r.first : 0;
        const size_t k = size_t(ep_->rank());
        std::vector<size_t> counts;
        for (size_t i = 0; i + 1 < dense_cut_.size(); i++) {
            const size_t lo = std::max(q0, dense_cut_[i]), hi = std::min(q0 + total, dense_cut_[i + 1]);
            counts.push_back(hi > lo ? hi - lo : 0);
        }
        std::vector<float> mine(counts[k]);
        count_gather(counts, *ep_);
        ep_stage_.run_host(packed.data(), total, mine.data(), mine.size(),
                           [&](const float* in, float* out) { ep_->reduce_scatter(in, out, counts); });
        std::copy(mine.begin(), mine.end(), packed.begin() + long(count_offsets(counts)[k]));
    } else {
        count_all_reduce(total, *ep_);
        ep_stage_.run_host(packed.data(), total, [&](float* x) { ep_->all_reduce(x, total, ReduceOp::Sum); });
    }
    p = packed.data();
    for (const auto& r : runs) {
        std::copy(p, p + (r.second - r.first), host.begin() + long(r.first - begin));
        p += r.second - r.first;
    }
    load_host(s, host.data(), n);
}

void DataParallel::post_staged(CommHandle h, std::function<void()> then) {
    staged_ = std::move(h);
    staged_then_ = std::move(then);
}

void DataParallel::settle() {
    comm_.wait(staged_);
    if (staged_then_) {
        std::function<void()> then = std::move(staged_then_);
        staged_then_ = nullptr;
        then();
    }
}

void DataParallel::launch(const Bucket& b) {
    if (solo_) return;  // the buffer holds the sum already
    settle();
    const size_t n = b.end - b.begin;
    load(send_, grad_buf_.slice(b.begin, n));
    if (zero_ == 0) {
        count_all_reduce(n, comm_);
        post_staged(comm_.all_reduce_async(send_.data(), n, ReduceOp::Sum), [this, b, n] {
            reduce_dense(send_, b.begin, n);
            store(grad_buf_.slice(b.begin, n), send_);
        });
        return;
    }
    const std::vector<size_t> counts = shard_counts(b.begin, b.end);
    const size_t mine = counts[size_t(dp_rank())];
    count_gather(counts, comm_);
    post_staged(comm_.reduce_scatter_async(send_.data(), recv_.data(), counts), [this, b, mine] {
        reduce_dense(recv_, std::max(b.begin, opt_begin()), mine);
        if (mine > 0) store(grad_buf_.slice(std::max(b.begin, opt_begin()), mine), recv_);
    });
}

void DataParallel::set_compression(PowerSgd* compression) {
    LLMC_ASSERT(!compression || (zero_ == 0 && !local_ && !ep_), "PowerSGD replaces the ZeRO-0 all-reduce only");
    compression_ = compression;
}

std::function<void(size_t)> DataParallel::grads_ready() {
    // ZeRO-2/3: the units' reduce-scatters go out from release_grads; PowerSGD: all at once in finish_grad_sync
    if (zero_ >= 2 || local_ || compression_) return {};
    next_bucket_ = 0;
    return [this](size_t ready_from) {
        while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].begin >= ready_from)
            launch(buckets_[next_bucket_++]);
    };
}

void DataParallel::finish_grad_sync() {
    if (local_) return;  // each rank keeps its own gradients
    if (compression_) return compression_->reduce(grad_buf_);
    if (zero_ >= 2) {  // the step-long units: the embedding, then the head
        std::vector<CommHandle> posted;
        for (int k : {int(ParamUnit::Embedding), int(ParamUnit::Head)}) {
            Slot& g = grad_slots_[k];
            if (g.unit >= 0) {
                const Tensor grads = g.buf.slice(0, layout_.units[size_t(g.unit)].numel());
                // (in place: not under expert parallelism, whose dense sums need a second reduction)
                if (in_place_ && !ep_ && !solo_) posted_step_long(g.unit, grads, &posted);
                else reduce_scatter_unit(g.unit, grads);
            }
            g.unit = -1;
        }
        for (CommHandle& h : posted) comm_.wait(h);
    } else {
        while (next_bucket_ < buckets_.size()) launch(buckets_[next_bucket_++]);
        next_bucket_ = 0;
    }
    settle();
}

// ---- stages 2 and 3: the model's units ----

void DataParallel::for_each_piece(int unit,
                                  const std::function<void(size_t, size_t, const std::vector<size_t>&)>& f) const {
    const ParamUnit& u = layout_.units[size_t(unit)];
    for (size_t b = u.begin; b < u.end; b += bucket_elems_) {
        const size_t e = std::min(u.end, b + bucket_elems_);
        f(b, e, shard_counts(b, e));
    }
}

void DataParallel::reduce_scatter_unit(int unit, Tensor grads) {
    const size_t ub = layout_.units[size_t(unit)].begin;
    if (solo_) {  // the shard is the whole buffer: added in place, on the backend
        Tensor dst = grad_shard_.slice(ub, grads.n);
        ops_.residual_forward(dst, dst, grads);
        return;
    }
    for_each_piece(unit, [&](size_t b, size_t e, const std::vector<size_t>& counts) {
        settle();
        const size_t mine = counts[size_t(dp_rank())];
        load(send_, grads.slice(b - ub, e - b));
        count_gather(counts, comm_);
        // added to the shard: the micro-steps' sums add up
        post_staged(comm_.reduce_scatter_async(send_.data(), recv_.data(), counts), [this, b, mine] {
            reduce_dense(recv_, std::max(b, opt_begin()), mine);
            if (mine > 0) accumulate(grad_shard_.slice(std::max(b, opt_begin()) - opt_begin(), mine));
        });
    });
}

void DataParallel::posted_step_long(int unit, Tensor grads, std::vector<CommHandle>* posted) {
    const size_t ub = layout_.units[size_t(unit)].begin;
    for_each_piece(unit, [&](size_t b, size_t e, const std::vector<size_t>& counts) {
        const size_t mine = counts[size_t(dp_rank())];
        float* dst = grad_shard_.slice(mine > 0 ? std::max(b, opt_begin()) - opt_begin() : 0, mine).f32();
        count_gather(counts, comm_);
        posted->push_back(comm_.reduce_scatter_async(grads.slice(b - ub, e - b).f32(), dst, counts));
    });
}

std::vector<CommHandle> DataParallel::gather_unit(int unit, Tensor dst) {
    const size_t ub = layout_.units[size_t(unit)].begin;
    std::vector<CommHandle> posted;
    for_each_piece(unit, [&](size_t b, size_t e, const std::vector<size_t>& counts) {
        const size_t mine = counts[size_t(dp_rank())];
        const Tensor own = param_shard_.slice(mine > 0 ? std::max(b, opt_begin()) - opt_begin() : 0, mine);
        if (solo_) {  // the shard is the whole buffer
            ops_.copy(dst.slice(b - ub, e - b), own);
            return;
        }
        count_gather(counts, comm_);
        if (in_place_) {
            posted.push_back(comm_.all_gather_async(own.f32(), dst.slice(b - ub, e - b).f32(), counts));
            return;
        }
        settle();
        if (mine > 0) load(send_, own);
        comm_.all_gather(send_.data(), recv_.data(), counts);
        store(dst.slice(b - ub, e - b), recv_);
    });
    return posted;
}

void DataParallel::wait_gathers(Slot& s) {
    for (CommHandle& h : s.gathering) comm_.wait(h);
    s.gathering.clear();
}

Tensor DataParallel::acquire_params(int unit) {
    if (zero_ < 3) return whole_->acquire_params(unit);
    const ParamUnit& u = layout_.units[size_t(unit)];
    std::vector<Slot>& slots = param_slots_[u.kind];
    Slot* pick = nullptr;
    for (Slot& s : slots)
        if (s.unit == unit) pick = &s;  // prefetched
    if (!pick) {  // a free slot, else one holding an unused prefetch
        for (Slot& s : slots)
            if (!pick && s.unit < 0) pick = &s;
        for (Slot& s : slots)
            if (!pick && !s.in_use) pick = &s;
        LLMC_ASSERT(pick, strfmt("ZeRO-3: no free working buffer for unit %d", unit));
        wait_gathers(*pick);  // an unused prefetch's gathers still write into it
        pick->gathering = gather_unit(unit, pick->buf.slice(0, u.numel()));
        pick->unit = unit;
    }
    wait_gathers(*pick);
    LLMC_ASSERT(!pick->in_use, "ZeRO-3: unit acquired twice");
    pick->in_use = true;
    return pick->buf.slice(0, u.numel());
}

void DataParallel::release_params(int unit) {
    if (zero_ < 3) return whole_->release_params(unit);
    for (Slot& s : param_slots_[layout_.units[size_t(unit)].kind])
        if (s.unit == unit && s.in_use) {
            s.unit = -1;  // freed after use: the next use gathers again
            s.in_use = false;
            return;
        }
    LLMC_ASSERT(false, "ZeRO-3: release_params of a unit not acquired");
}

void DataParallel::prefetch_params(int unit) {
    if (zero_ < 3) return whole_->prefetch_params(unit);
    const ParamUnit& u = layout_.units[size_t(unit)];
    std::vector<Slot>& slots = param_slots_[u.kind];
    for (Slot& s : slots)
        if (s.unit == unit) return;
    for (Slot& s : slots)
        if (s.unit < 0) {
            s.gathering = gather_unit(unit, s.buf.slice(0, u.numel()));
            s.unit = unit;
            return;
        }
    // no free slot: the acquire gathers it
}

void DataParallel::drop_prefetched() {
    for (auto& slots : param_slots_)
        for (Slot& s : slots) {
            LLMC_ASSERT(!s.in_use, "ZeRO-3: a unit is still acquired");
            wait_gathers(s);
            s.unit = -1;
        }
}

std::pair<size_t, size_t> DataParallel::params_held() const {
    return zero_ < 3 ? std::make_pair(size_t(0), layout_.padded_params) : std::make_pair(opt_begin(), opt_end());
}

void DataParallel::load_params_held(const float* held) {
    settle();
    if (zero_ < 3) return whole_->load_params(held);
    drop_prefetched();
    ops_.from_host_f32(param_shard_, held);
}

Tensor DataParallel::acquire_grads(int unit) {
    LLMC_ASSERT(zero_ >= 2, "acquire_grads: gradients are not sharded");
    const ParamUnit& u = layout_.units[size_t(unit)];
    Slot& g = grad_slots_[u.kind];
    Tensor buf = g.buf.slice(0, u.numel());
    if (u.kind == ParamUnit::Layer) {  // lives for this layer's backward
        LLMC_ASSERT(!g.in_use, "ZeRO-2/3: two layers' gradients at once");
        ops_.zero(buf);
        g.in_use = true;
    }
    LLMC_ASSERT(g.unit < 0 || g.unit == unit, "ZeRO-2/3: unit gradient buffer taken");
    g.unit = unit;  // the embedding and head keep theirs (zeroed per step) until finish_grad_sync
    return buf;
}

void DataParallel::release_grads(int unit) {
    const ParamUnit& u = layout_.units[size_t(unit)];
    if (u.kind != ParamUnit::Layer) return;
    Slot& g = grad_slots_[u.kind];
    LLMC_ASSERT(g.in_use && g.unit == unit, "ZeRO-2/3: release_grads of a unit not acquired");
    reduce_scatter_unit(unit, g.buf.slice(0, u.numel()));
    g.unit = -1;
    g.in_use = false;
}

void DataParallel::zero_grads() {
    ops_.zero(grad_shard_);
    for (Slot& g : grad_slots_) {
        if (g.buf.ptr) ops_.zero(g.buf);
        g.unit = -1;
        g.in_use = false;
    }
}

void reduce_backend_doubles(Ops& ops, Comm& c, double* dev, size_t n, ReduceOp op) {
    if (c.size() == 1 || n == 0) return;
    if (c.on_device() || ops.host_memory()) {
        c.all_reduce_dev(dev, n, op);
        return;
    }
    std::vector<double> host(n);
    ops.to_host_bytes(host.data(), dev, n * sizeof(double));
    c.all_reduce(host.data(), n, op);
    ops.from_host_bytes(dev, host.data(), n * sizeof(double));
}

void DataParallel::grad_norm_squares(double* ss, Comm* model_parallel) {
    // primary copies only: TP replicas and the tied head copy would count twice
    // (under ep with ZeRO, each dense element on its owner: every ep rank's copy of it may count)
    std::vector<Tensor> regions;
    const Tensor g = opt_grads();
    for (const ParamSpec& p : layout_.specs) {
        if (!(split_ ? p.ep_primary : p.primary)) continue;
        for (const auto& r : opt_runs_) {
            const size_t lo = std::max(r.first, p.offset), hi = std::min(r.second, p.offset + p.numel);
            if (lo < hi) regions.push_back(g.slice(lo - opt_begin(), hi - lo));
        }
    }
    ops_.sum_squares_multi(ss, regions);
    // stage 0 holds the whole summed gradient on every rank: only the losses' part is summed;
    // local updates: this replica's own gradient and losses
    if (zero_ > 0) reduce_backend_doubles(ops_, comm_, ss, 2, ReduceOp::Sum);
    else if (!local_) reduce_backend_doubles(ops_, comm_, ss + 1, 1, ReduceOp::Sum);
    if (model_parallel) reduce_backend_doubles(ops_, *model_parallel, ss, 2, ReduceOp::Sum);
}

double DataParallel::grad_norm(Comm* model_parallel) {
    double ss[2] = {0.0, 0.0};
    ops_.from_host_bytes(norm_ + 1, &ss[1], sizeof(double));
    grad_norm_squares(norm_, model_parallel);
    ops_.to_host_bytes(ss, norm_, sizeof(ss));
    return std::sqrt(ss[0]);
}

void DataParallel::before_update() {
    // the optimizer writes the shards: a prefetched unit's gathers (still reading the shard on a
    // communicator's stream) end first, and nothing gathered before stays valid
    if (zero_ == 3) drop_prefetched();
}

void DataParallel::after_update() {
    if (zero_ == 3) drop_prefetched();  // (the callers that skip before_update: tests)
    if (zero_ == 0 || solo_) return;
    settle();
    if (split_) share_dense_parts(opt_params());  // the shard range whole on each ep rank
    if (zero_ == 3) return;
    std::vector<CommHandle> posted;
    for (const Bucket& b : buckets_) {
        const std::vector<size_t> counts = shard_counts(b.begin, b.end);
        const size_t mine = counts[size_t(dp_rank())];
        count_gather(counts, comm_);
        if (in_place_) {  // every bucket at once: this rank's piece is already in place (MPI_IN_PLACE)
            float* whole = param_buf_.slice(b.begin, b.end - b.begin).f32();
            posted.push_back(comm_.all_gather_async(whole + count_offsets(counts)[size_t(dp_rank())], whole, counts));
            continue;
        }
        settle();
        if (mine > 0) load(send_, param_buf_.slice(std::max(b.begin, opt_begin()), mine));
        post_staged(comm_.all_gather_async(send_.data(), recv_.data(), counts),
                    [this, b] { store(param_buf_.slice(b.begin, b.end - b.begin), recv_); });
    }
    settle();
    for (CommHandle& h : posted) comm_.wait(h);
}

double DataParallel::mean(double x) {
    comm_.all_reduce(&x, 1, ReduceOp::Sum);
    if (ep_) ep_->all_reduce(&x, 1, ReduceOp::Sum);
    return x / (dp() * (ep_ ? ep_->size() : 1));
}

void DataParallel::gather_params(std::vector<float>& out) {
    if (zero_ == 3) {
        std::vector<float> shard(shard_);
        ops_.to_host_f32(shard.data(), param_shard_);
        gather_shards(shard.data(), out);
        return;
    }
    out.resize(dp_rank() == 0 ? layout_.padded_params : 0);
    if (dp_rank() == 0) ops_.to_host_f32(out.data(), param_buf_);
}

void DataParallel::read_params(size_t at, size_t n, float* out) const {
    LLMC_ASSERT(zero_ < 3, "read_params: ZeRO-3 holds no whole parameter buffer");
    ops_.to_host_f32(out, param_buf_.slice(at, n));
}

void DataParallel::read_param_shard(size_t at, size_t n, float* out) const {
    LLMC_ASSERT(zero_ == 3, "read_param_shard: ZeRO-3's");
    ops_.to_host_f32(out, param_shard_.slice(at, n));
}

std::vector<float> DataParallel::local_params() {
    LLMC_ASSERT(zero_ < 3, "local_params: ZeRO-3 holds no whole parameter buffer");
    std::vector<float> whole(layout_.padded_params);
    ops_.to_host_f32(whole.data(), param_buf_);
    return whole;
}

void DataParallel::check_replicas() {
    if (dp() == 1 || zero_ == 3) return;  // ZeRO-3 keeps no replicas
    std::vector<float> host(layout_.padded_params);
    ops_.to_host_f32(host.data(), param_buf_);
    const uint64_t h = fnv1a(host.data(), host.size() * sizeof(float));
    double v[2] = {double(h >> 12), -double(h >> 12)};  // 52 bits: exact in a double
    comm_.all_reduce(v, 2, ReduceOp::Max);
    LLMC_ASSERT(v[0] == -v[1], "parameter replicas differ between DP ranks");
}

void DataParallel::gather_shards(const float* shard, std::vector<float>& out) {
    settle();
    // bucket by bucket: every rank sends its shard's intersection with the bucket
    out.resize(dp_rank() == 0 ? layout_.padded_params : 0);
    for (const Bucket& b : buckets_) {
        const std::vector<size_t> counts = shard_counts(b.begin, b.end);
        const size_t mine = counts[size_t(dp_rank())];
        if (mine > 0) load_host(send_, shard + (std::max(b.begin, opt_begin()) - opt_begin()), mine);
        comm_.gather(send_.data(), dp_rank() == 0 ? recv_.data() : nullptr, counts, 0);
        if (dp_rank() == 0) store_host(out.data() + b.begin, recv_, b.end - b.begin);
    }
}

void DataParallel::for_each_dense(size_t a, size_t b, const std::function<void(size_t, size_t, size_t)>& f) const {
    size_t q = 0;  // the packed index of the run's first element
    for (const auto& r : range_dense_) {
        const size_t n = r.second - r.first, lo = std::max(q, a), hi = std::min(q + n, b);
        if (lo < hi) f(r.first + (lo - q), hi - lo, lo);
        q += n;
        if (q >= b) return;
    }
}

void DataParallel::share_dense_parts(const std::function<void(size_t, size_t, float*)>& get,
                                     const std::function<void(size_t, size_t, const float*)>& put) {
    const size_t k = size_t(ep_->rank()), total = dense_cut_.back();
    std::vector<float> mine, all;
    // in pieces of a bucket of the packed dense elements: every rank's share of the piece from its owner
    for (size_t c0 = 0; c0 < total; c0 += bucket_elems_) {
        const size_t c1 = std::min(total, c0 + bucket_elems_);
        std::vector<size_t> counts;
        for (size_t i = 0; i + 1 < dense_cut_.size(); i++) {
            const size_t lo = std::max(c0, dense_cut_[i]), hi = std::min(c1, dense_cut_[i + 1]);
            counts.push_back(hi > lo ? hi - lo : 0);
        }
        const size_t lo = std::max(c0, std::min(c1, dense_cut_[k])), hi = lo + counts[k];  // this rank's share
        mine.resize(counts[k]);
        all.resize(c1 - c0);
        for_each_dense(lo, hi, [&](size_t flat, size_t n, size_t at) { get(flat, n, mine.data() + (at - lo)); });
        count_gather(counts, *ep_);
        ep_stage_.run_host(mine.data(), mine.size(), all.data(), all.size(),
                           [&](const float* in, float* out) { ep_->all_gather(in, out, counts); });
        for (const auto& o : {std::make_pair(c0, lo), std::make_pair(hi, c1)})  // the others' shares
            for_each_dense(o.first, o.second, [&](size_t flat, size_t n, size_t at) { put(flat, n, all.data() + (at - c0)); });
    }
}

void DataParallel::share_dense_parts(Tensor range) {
    share_dense_parts([&](size_t b, size_t n, float* dst) { ops_.to_host_f32(dst, range.slice(b - opt_begin(), n)); },
                      [&](size_t b, size_t n, const float* src) { ops_.from_host_f32(range.slice(b - opt_begin(), n), src); });
}

void DataParallel::share_dense_parts(float* range) {
    const size_t base = opt_begin();
    share_dense_parts([&](size_t b, size_t n, float* dst) { std::copy(range + (b - base), range + (b - base + n), dst); },
                      [&](size_t b, size_t n, const float* src) { std::copy(src, src + n, range + (b - base)); });
}

std::vector<float> DataParallel::range_state(const std::vector<float>& packed) {
    if (!split_) return packed;  // the runs are the range
    std::vector<float> range(shard_);
    size_t q = 0;
    for (const auto& r : opt_runs_) {
        std::copy(packed.begin() + long(q), packed.begin() + long(q + r.second - r.first),
                  range.begin() + long(r.first - opt_begin()));
        q += r.second - r.first;
    }
    share_dense_parts(range.data());
    return range;
}

void DataParallel::gather_optimizer_state(const AdamW& opt, OptimizerState& out, bool weights_only) {
    std::vector<float> mine;
    for (const AdamW::Array a : {AdamW::Array::M, AdamW::Array::V, AdamW::Array::Master}) {
        std::vector<float>& dst = a == AdamW::Array::M ? out.m : a == AdamW::Array::V ? out.v : out.master;
        if ((weights_only && a != AdamW::Array::Master) || (a == AdamW::Array::Master && !opt.has_master())) {
            dst.clear();
        } else if (zero_ == 0) {  // replicated: rank 0 already has it all
            if (dp_rank() == 0) opt.get_state(a, dst);
            else dst.clear();
        } else {
            opt.get_state(a, mine);
            gather_shards(range_state(mine).data(), dst);
        }
    }
}

std::vector<float> DataParallel::gather_gradients() {
    std::vector<float> g(opt_end() - opt_begin());
    ops_.to_host_f32(g.data(), opt_grads());
    if (zero_ == 0) return dp_rank() == 0 ? g : std::vector<float>();
    if (split_) share_dense_parts(g.data());  // each rank summed its own dense part only
    std::vector<float> out;
    gather_shards(g.data(), out);
    return out;
}

MemoryPlan DataParallel::memory_plan(bool master, size_t activation_bytes, bool offload_optimizer) const {
    return zero_memory_plan(layout_.padded_params, dp(), zero_, dtype_size(dtype_), master, bucket_elems_,
                            activation_bytes, unit_sizes_, offload_optimizer, split_ ? runs_numel(opt_runs_) : 0);
}

MemoryPlan DataParallel::allocated(size_t optimizer_bytes, size_t host_bytes, size_t activation_bytes) const {
    MemoryPlan m;
    m.padded_params = layout_.padded_params;
    m.dp = dp();
    m.zero = zero_;
    m.params = param_buf_.bytes() + param_shard_.bytes();
    m.grads = grad_buf_.bytes() + grad_shard_.bytes();
    m.optimizer = optimizer_bytes;
    m.host = host_bytes;
    m.comm_buffers = send_.bytes() + recv_.bytes();
    m.activations = activation_bytes;
    for (const auto& slots : param_slots_)
        for (const Slot& s : slots) m.unit_params += s.buf.bytes();
    for (const Slot& g : grad_slots_) m.unit_grads += g.buf.bytes();
    return m;
}

LoaderPosition convert_loader_position(const LoaderPosition& p, int saved_dp, int dp, bool shuffle) {
    if (saved_dp == dp) return p;
    // A window group holds one window per rank; the same data position is group * dp windows.
    if (shuffle)
        throw UserError(strfmt("checkpoint: saved at parallel.dp=%d with data.shuffle=true; the shuffled window "
                               "order depends on dp, so it resumes only at dp=%d (or start with data.shuffle=false)",
                               saved_dp, saved_dp));
    if (p.window > UINT64_MAX / uint64_t(saved_dp))
        throw UserError(strfmt("checkpoint: the data position (window %llu at dp %d) is out of range (corrupt "
                               "checkpoint?)",
                               (unsigned long long)p.window, saved_dp));
    const uint64_t windows = p.window * uint64_t(saved_dp);
    if (windows % uint64_t(dp) != 0)
        throw UserError(strfmt("checkpoint: the data position (%llu windows into the shard) does not divide "
                               "among parallel.dp=%d ranks; resume with a dp that divides it",
                               (unsigned long long)windows, dp));
    LoaderPosition q = p;
    q.window = windows / uint64_t(dp);
    return q;
}
