#include "llmc/train/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "llmc/parallel/pipeline_schedule.h"

ModelShape model_shape(const ModelConfig& m) {
    ModelShape s;
    s.n_layer = m.n_layer;
    s.n_head = m.n_head;
    s.d_model = m.d_model;
    s.vocab_size = m.vocab_size;
    s.padded_vocab = m.padded_vocab();
    s.max_seq_len = m.max_seq_len;
    if (m.arch == "llama") {
        s.arch = Arch::Llama;
        s.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
        s.ffn_dim = m.ffn_dim > 0 ? m.ffn_dim : (8 * m.d_model / 3 + 255) / 256 * 256;
        s.rope_theta = float(m.rope_theta);
        s.norm_eps = float(m.norm_eps);
        s.tie_embeddings = m.tie_embeddings;
    }
    if (m.moe.num_experts > 0) {
        s.moe.num_experts = m.moe.num_experts;
        s.moe.top_k = m.moe.top_k;
        s.moe.expert_ffn_dim = m.moe.expert_ffn_dim > 0 ? m.moe.expert_ffn_dim : s.ffn();
        s.moe.every = m.moe.every;
        s.moe.aux_loss_coef = float(m.moe.aux_loss_coef);
        s.moe.capacity_factor = float(m.moe.capacity_factor);
    }
    return s;
}

void check_fits_host_memory(const ModelShape& s) {
    const double n = num_params_double(s);
    const double have = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
    if (4.0 * n > have)
        throw UserError(strfmt("model: %.3g parameters (model.n_layer = %d, model.d_model = %d) need %.3g GiB as fp32, "
                               "more than this machine's %.3g GiB of host memory: the model does not fit in host "
                               "memory (lower model.n_layer or model.d_model)",
                               n, s.n_layer, s.d_model, 4.0 * n / (1 << 30), have / (1 << 30)));
}

ModelLayout model_layout(const ModelShape& shape, const ParallelConfig& pc, int tp_rank, int pp_rank, int ep_rank) {
    ModelLayout L;
    L.ep = pc.ep;
    L.ep_rank = ep_rank;
    L.tp = pc.tp;
    L.tp_rank = tp_rank;
    L.sequence_parallel = pc.sequence_parallel && pc.tp > 1;
    L.cp = pc.cp;
    const int pp = pc.pp, v = pc.pp_virtual;
    const auto stages = pp_layer_split(shape.n_layer, pp, v, pc.pp_layers);
    L.chunks.clear();
    for (int c = 0; c < v; c++) L.chunks.push_back(stages[size_t(pp_virtual_stage(pp_rank, c, pp))]);
    L.first = pp_rank == 0;
    L.last = pp_rank == pp - 1;
    return L;
}

std::vector<float> assemble_whole(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple,
                                  const std::vector<float>& local, Comm& mp) {
    std::vector<float> whole;
    assemble_whole(shape, pc, pad_multiple, local, mp, whole);
    return whole;
}

void FileOrderMap::read(const std::vector<const float*>& members, size_t first, size_t n, float* out) const {
    LLMC_ASSERT(members.size() == counts.size(), "FileOrderMap::read: a buffer for each member");
    for_runs(first, n, [&](int m, size_t at, size_t k, size_t done) {
        std::memcpy(out + done, members[size_t(m)] + at, k * sizeof(float));
    });
}

void FileOrderMap::read(const std::vector<MemberRead>& members, size_t first, size_t n, float* out) const {
    LLMC_ASSERT(members.size() == counts.size(), "FileOrderMap::read: a buffer for each member");
    for_runs(first, n, [&](int m, size_t at, size_t k, size_t done) { members[size_t(m)](at, k, out + done); });
}

FileOrderMap file_order_map(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple) {
    const int members = pc.tp * pc.pp * pc.ep;
    FileOrderMap map;
    std::vector<FileOrderMap::Run> runs;
    for (int i = 0; i < members; i++) {
        size_t n = 0;
        const std::vector<ParamSpec> table =
            param_table(shape, model_layout(shape, pc, i % pc.tp, i / (pc.tp * pc.ep), i / pc.tp % pc.ep), &n);
        for (const ParamSpec& p : table) {
            if (!p.primary) continue;
            for_each_run(p, [&](size_t loc, size_t dst, size_t k) { runs.push_back({dst, k, i, p.offset + loc}); });
        }
        map.counts.push_back(padded_param_count(n, pad_multiple));
    }
    std::sort(runs.begin(), runs.end(), [](const FileOrderMap::Run& a, const FileOrderMap::Run& b) { return a.file < b.file; });
    size_t covered = 0;  // [0, covered) of the whole model mapped
    for (const FileOrderMap::Run& r : runs) {
        LLMC_ASSERT(r.file == covered, "file_order_map: the layouts' primary pieces do not tile the model");
        FileOrderMap::Run* last = map.runs.empty() ? nullptr : &map.runs.back();
        if (last && last->member == r.member && last->at + last->n == r.at) last->n += r.n;
        else map.runs.push_back(r);
        covered = r.file + r.n;
    }
    LLMC_ASSERT(covered == num_params(shape), "file_order_map: the layouts' primary pieces do not tile the model");
    return map;
}

namespace {

// Collective over the mp group: member 0 gets the other members' local buffers one after another
// into others (its memory is reused) and returns every member's buffer for FileOrderMap::read (its
// own: local, not a copy); the others leave others empty and get an empty vector.
std::vector<const float*> gather_pieces(const FileOrderMap& map, const std::vector<float>& local, Comm& mp,
                                        std::vector<float>& others) {
    LLMC_ASSERT(int(map.counts.size()) == mp.size(), "gather_pieces: the map is of another mp group");
    LLMC_ASSERT(local.size() == map.counts[size_t(mp.rank())], "gather_pieces: local buffer of the wrong size");
    // member by member (send and recv go in chunks): a gather's int counts and offsets would stop
    // at 2^31 elements, 8 GB, which a model of some 7B parameters reaches at tp = 8
    if (mp.rank() != 0) {
        others.clear();
        mp.send(local.data(), local.size(), 0);
        return {};
    }
    size_t total = 0;  // member 0's own piece stays where it is
    for (size_t i = 1; i < map.counts.size(); i++) total += map.counts[i];
    others.resize(total);
    std::vector<const float*> members = {local.data()};
    for (size_t i = 1, at = 0; i < map.counts.size(); at += map.counts[i], i++) {
        mp.recv(others.data() + at, map.counts[i], int(i));
        members.push_back(others.data() + at);
    }
    return members;
}

}  // namespace

namespace {
constexpr int kPieceTag = 1;
}  // namespace

PieceServer::PieceServer(std::shared_ptr<const FileOrderMap> map, const Comm& mp, const Comm& shard, Comm& world)
    : map_(std::move(map)), world_(world), shards_(shard.size()) {
    for (int i = 0; i < world.size(); i++)
        LLMC_ASSERT(world.members()[size_t(i)] == i, "PieceServer: world must be the world, in rank order");
    // world rank 0's mp group: each member marks its world rank with its index + 1
    std::vector<double> member(size_t(world.size()), 0.0);
    if (mp.members()[0] == 0) member[size_t(world.rank())] = mp.rank() + 1;
    world.all_reduce(member.data(), member.size(), ReduceOp::Max);
    // this rank serves if its shard group's rank 0 is such a member (the same mp index: the same
    // tp, pp and ep coordinates)
    const double lead = member[size_t(shard.members()[0])];
    if (lead > 0) {
        member_ = int(lead) - 1, shard_rank_ = shard.rank();
        LLMC_ASSERT(member_ == mp.rank(), "PieceServer: a shard group across mp indices");
        LLMC_ASSERT(map_ && map_->counts.size() == size_t(mp.size()), "PieceServer: the map is of another mp group");
    }
    std::vector<double> who(size_t(mp.size()) * size_t(shards_), 0.0);
    if (member_ >= 0) who[size_t(member_) * size_t(shards_) + size_t(shard_rank_)] = world.rank() + 1;
    world.all_reduce(who.data(), who.size(), ReduceOp::Max);
    if (world.rank() != 0) return;
    LLMC_ASSERT(member_ == 0 && shard_rank_ == 0, "PieceServer: world rank 0 is member 0, shard rank 0");
    for (double w : who) {
        LLMC_ASSERT(w > 0, "PieceServer: a part of world rank 0's mp group's state no rank holds");
        servers_.push_back(int(w) - 1);
    }
}

int PieceServer::add(FileOrderMap::MemberRead read, bool sharded) {
    LLMC_ASSERT(serves(), "PieceServer::add: this rank holds none of world rank 0's mp group's state");
    arrays_.push_back({std::move(read), sharded});
    return int(arrays_.size()) - 1;
}

int PieceServer::add(const std::vector<float>* local) {
    if (local->empty())  // (a read never called: another shard rank's, or an array not kept)
        return add(shard_rank_ == 0 ? FileOrderMap::MemberRead() : [](size_t, size_t, float*) {}, false);
    LLMC_ASSERT(shard_rank_ == 0 && local->size() == map_->counts[size_t(member_)], "PieceServer::add: a piece of the wrong size");
    const int k = add([local](size_t at, size_t n, float* out) { std::memcpy(out, local->data() + at, n * sizeof(float)); },
                      false);
    arrays_.back().copy = true;
    return k;
}

std::pair<size_t, size_t> PieceServer::held(const Array& a, int m, int d) const {
    const size_t c = map_->counts[size_t(m)];
    if (!a.sharded) return {0, d == 0 ? c : 0};
    const size_t each = c / size_t(shards_);
    return {size_t(d) * each, size_t(d + 1) * each};
}

void PieceServer::snapshot(std::vector<std::vector<float>>& keep) {
    if (!serves()) return;
    keep.resize(std::max(keep.size(), arrays_.size()));
    for (size_t k = 0; k < arrays_.size(); k++) {
        Array& a = arrays_[k];
        const auto [lo, hi] = held(a, member_, shard_rank_);
        if (!a.read || a.copy || hi == lo) continue;
        keep[k].resize(hi - lo);
        a.read(lo, hi - lo, keep[k].data());
        a.read = [x = keep[k].data(), lo = lo](size_t at, size_t n, float* out) {
            std::memcpy(out, x + (at - lo), n * sizeof(float));
        };
    }
}

template <class F>
void PieceServer::for_parts(const Array& a, size_t first, size_t n, F f) const {
    map_->for_runs(first, n, [&](int m, size_t at, size_t c, size_t done) {
        if (!a.sharded) return f(m, 0, at, c, done);
        const size_t each = held(a, m, 0).second;
        for (size_t end = at + c; at < end;) {  // the shard ranks in turn, in memory order
            const size_t d = at / each, k = std::min(end, (d + 1) * each) - at;
            f(m, int(d), at, k, done);
            at += k, done += k;
        }
    });
}

size_t PieceServer::pack(const Array& a, size_t first, size_t n, float* out) const {
    size_t count = 0, span_at = 0, span_n = 0;  // parts next to each other in memory: one read
    auto flush = [&] {
        if (out && span_n > 0) a.read(span_at, span_n, out + count);
        count += span_n;
    };
    for_parts(a, first, n, [&](int m, int d, size_t at, size_t c, size_t) {
        if (m != member_ || d != shard_rank_) return;
        if (span_n > 0 && at == span_at + span_n) return void(span_n += c);
        flush();
        span_at = at, span_n = c;
    });
    flush();
    return count;
}

ReadFileOrder PieceServer::reader(int k) {
    LLMC_ASSERT(world_.rank() == 0 && size_t(k) < arrays_.size(), "PieceServer::reader: world rank 0, an added array");
    if (!arrays_[size_t(k)].read) return nullptr;
    return [this, k](size_t first, size_t n, float* out) {
        double request[3] = {double(k + 1), double(first), double(n)};  // exact: below 2^53
        world_.all_reduce(request, 3, ReduceOp::Max);                  // (the others pass zeros)
        const Array& a = arrays_[size_t(k)];
        // buf_ holds each server's elements (server s = i S + d: member i, shard rank d) from at[s],
        // world rank 0's own read here, the others' received
        std::vector<size_t> at(servers_.size() + 1, 0);
        for_parts(a, first, n, [&](int m, int d, size_t, size_t c, size_t) { at[size_t(m * shards_ + d) + 1] += c; });
        for (size_t s = 0; s < servers_.size(); s++) at[s + 1] += at[s];
        buf_.resize(at.back());
        pack(a, first, n, buf_.data());
        for (size_t s = 1; s < servers_.size(); s++)
            if (at[s + 1] > at[s]) world_.recv(buf_.data() + at[s], at[s + 1] - at[s], servers_[s], kPieceTag);
        for_parts(a, first, n, [&](int m, int d, size_t, size_t c, size_t done) {
            const size_t s = size_t(m * shards_ + d);
            std::memcpy(out + done, buf_.data() + at[s], c * sizeof(float));
            at[s] += c;
        });
    };
}

void PieceServer::serve() {
    LLMC_ASSERT(world_.rank() != 0, "PieceServer::serve: world rank 0 reads");
    for (;;) {
        double request[3] = {0, 0, 0};
        world_.all_reduce(request, 3, ReduceOp::Max);
        if (request[0] == 0) break;  // finish()
        if (!serves()) continue;
        const size_t k = size_t(request[0]) - 1, first = size_t(request[1]), n = size_t(request[2]);
        if (k >= arrays_.size() && shard_rank_ > 0) continue;  // (one held whole by shard rank 0)
        LLMC_ASSERT(k < arrays_.size() && arrays_[k].read, "PieceServer: a request for an array not added");
        const Array& a = arrays_[k];
        buf_.resize(pack(a, first, n, nullptr));
        pack(a, first, n, buf_.data());
        if (!buf_.empty()) world_.send(buf_.data(), buf_.size(), 0, kPieceTag);
    }
    buf_ = std::vector<float>();
}

void PieceServer::finish() {
    LLMC_ASSERT(world_.rank() == 0, "PieceServer::finish: world rank 0");
    double request[3] = {0, 0, 0};
    world_.all_reduce(request, 3, ReduceOp::Max);
    buf_ = std::vector<float>();
}

void assemble_whole(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple,
                    const std::vector<float>& local, Comm& mp, std::vector<float>& whole) {
    LLMC_ASSERT(mp.size() == pc.tp * pc.pp * pc.ep, "the mp group must hold tp x pp x ep ranks");
    const FileOrderMap map = file_order_map(shape, pc, pad_multiple);
    std::vector<float> others;
    const std::vector<const float*> members = gather_pieces(map, local, mp, others);
    if (mp.rank() != 0) {
        whole.clear();
        return;
    }
    whole.resize(num_params(shape));
    map.read(members, 0, whole.size(), whole.data());
}
