#include "llmc/model/param_table.h"
#include <algorithm>
#include <cstring>

#include "llmc/core/common.h"

namespace {

size_t decl_numel(const TensorDecl& d) { return d.rows * d.cols; }
bool in_set(const ModelShape& s, LayerSet k, int l) { return k == LayerSet::All || (k == LayerSet::Moe) == s.moe.is_moe_layer(l); }
int experts_of(const ModelShape& s, const TensorDecl& d) { return d.per_expert ? s.moe.num_experts : 1; }
// Instances of a declaration, counted without listing them (a file header's shape is checked with it)
size_t decl_count(const ModelShape& s, const TensorDecl& d) {
    if (d.part != ModelPart::Layer) return 1;
    const size_t moe_layers = s.moe.enabled() ? size_t(s.n_layer / s.moe.every) : 0;
    const size_t layers = d.layers == LayerSet::All   ? size_t(s.n_layer)
                          : d.layers == LayerSet::Moe ? moe_layers
                                                      : size_t(s.n_layer) - moe_layers;
    return layers * size_t(experts_of(s, d));
}
// Layer l's place among the layers of its set (the MoE layers are every-1, 2 every-1, ...).
size_t rank_in_set(const ModelShape& s, LayerSet k, int l) {
    if (k == LayerSet::All || !s.moe.enabled()) return size_t(l);
    const int moe_before = l / s.moe.every;
    return size_t(k == LayerSet::Moe ? moe_before : l - moe_before);
}

std::vector<std::pair<int, int>> layout_chunks(const ModelShape& s, const ModelLayout& L) {
    if (L.chunks.empty()) return {{0, s.n_layer}};
    return L.chunks;
}

}  // namespace

std::vector<std::pair<int, int>> decl_instances(const ModelShape& s, const TensorDecl& d) {
    if (d.part != ModelPart::Layer) return {{-1, -1}};
    std::vector<std::pair<int, int>> out;
    for (int l = 0; l < s.n_layer; l++) {
        if (!in_set(s, d.layers, l)) continue;
        if (!d.per_expert) out.push_back({l, -1});
        else
            for (int e = 0; e < s.moe.num_experts; e++) out.push_back({l, e});
    }
    return out;
}

std::string instance_name(const std::string& pattern, int layer, int expert) {
    if (layer < 0) return pattern;
    return expert < 0 ? strfmt(pattern.c_str(), layer) : strfmt(pattern.c_str(), layer, expert);
}

size_t num_params(const ModelShape& s) {
    size_t n = 0;
    for (const TensorDecl& d : model_tensors(s)) n += decl_numel(d) * decl_count(s, d);
    return n;
}

double num_params_double(const ModelShape& s) {
    double n = 0;
    for (const TensorDecl& d : model_tensors(s)) n += double(d.rows) * double(d.cols) * double(decl_count(s, d));
    return n;
}

size_t num_params_unpadded(const ModelShape& s) {
    size_t n = 0;
    for (const TensorDecl& d : model_tensors(s)) {
        const size_t rows = d.split == TpSplit::Vocab ? size_t(s.vocab_size) : d.rows;
        n += rows * d.cols * decl_count(s, d);
    }
    return n;
}

size_t num_expert_params(const ModelShape& s) {
    size_t n = 0;
    for (const TensorDecl& d : model_tensors(s))
        if (d.per_expert) n += d.rows * d.cols * decl_instances(s, d).size();
    return n;
}

void check_model_layout(const ModelShape& s, const ModelLayout& L, int T) {
    const int tp = L.tp;
    if (s.n_head % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide model.n_head = %d (attention heads are split "
                               "whole across tensor-parallel ranks)", tp, s.n_head));
    if (s.kv_heads() % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide model.n_kv_head = %d (key/value heads are split "
                               "whole across tensor-parallel ranks)", tp, s.kv_heads()));
    if (s.ffn() % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide model.ffn_dim = %d (the MLP is split by columns)",
                               tp, s.ffn()));
    if (s.moe.enabled() && s.moe.expert_ffn_dim % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide model.moe.expert_ffn_dim = %d (each expert's MLP is "
                               "split by columns)", tp, s.moe.expert_ffn_dim));
    if (L.ep > 1 && (!s.moe.enabled() || s.moe.num_experts % L.ep != 0))
        throw UserError(strfmt("parallel.ep: %d must divide model.moe.num_experts = %d (each expert-parallel rank holds "
                               "num_experts / ep whole experts)", L.ep, s.moe.num_experts));
    if (L.cp > 1 && T % (2 * L.cp) != 0)
        throw UserError(strfmt("parallel.cp: train.seq_len = %d must be a multiple of 2 x parallel.cp = %d (each "
                               "context-parallel rank holds two equal chunks of every sequence)", T, 2 * L.cp));
    if (L.sequence_parallel && tp > 1 && (T / L.cp) % tp != 0)
        throw UserError(strfmt("parallel.sequence_parallel: train.seq_len / parallel.cp = %d must be a multiple of "
                               "parallel.tp = %d (the tokens are split evenly)", T / L.cp, tp));
    for (const auto& c : layout_chunks(s, L))
        LLMC_ASSERT(c.first >= 0 && c.first < c.second && c.second <= s.n_layer, "bad chunk layer range");
}

std::vector<ParamSpec> param_table(const ModelShape& s, const ModelLayout& L, size_t* num_local) {
    const std::vector<TensorDecl> decls = model_tensors(s);
    std::vector<size_t> file_base(decls.size());
    size_t acc = 0;
    for (size_t i = 0; i < decls.size(); i++) {
        file_base[i] = acc;
        acc += decl_numel(decls[i]) * decl_count(s, decls[i]);
    }
    const size_t tp = size_t(L.tp), r = size_t(L.tp_rank);
    std::vector<ParamSpec> table;
    size_t offset = 0;
    auto add = [&](size_t i, int layer, int expert, bool tied_copy) {
        const TensorDecl& d = decls[i];
        ParamSpec p;
        p.role = d.role;
        p.decl = int(i);
        p.part = tied_copy ? ModelPart::Head : d.part;
        p.layer = layer;
        p.expert = expert;
        p.name = instance_name(d.name, layer, expert);
        if (tied_copy) p.name += " (head copy)";
        p.rows = {{0, d.rows}};
        p.cols = d.cols;
        p.col_begin = 0;
        p.col_end = d.cols;
        p.tp_replicated = false;
        size_t pad_rows = 0;
        switch (d.split) {
            case TpSplit::Vocab: {  // rows [r Vl, (r+1) Vl) of the padded vocabulary; those in the file
                const size_t Vl = size_t(s.vocab_shard(L.tp)), b = std::min(r * Vl, d.rows);
                const size_t e = std::min((r + 1) * Vl, d.rows);
                p.rows.clear();
                if (e > b) p.rows.push_back({b, e});
                pad_rows = Vl - (e - b);
                break;
            }
            case TpSplit::Column: {  // this rank's rows of each of the stride blocks
                const size_t blk = d.rows / size_t(d.stride);
                p.rows.clear();
                for (size_t k = 0; k < size_t(d.stride); k++)
                    p.rows.push_back({k * blk + r * blk / tp, k * blk + (r + 1) * blk / tp});
                break;
            }
            case TpSplit::Row:
                p.col_begin = r * d.cols / tp;
                p.col_end = (r + 1) * d.cols / tp;
                break;
            case TpSplit::Replicated:
                p.tp_replicated = true;
                break;
        }
        p.numel = pad_rows * d.cols;  // the memory-only vocabulary rows follow the file's
        for (const auto& rr : p.rows) p.numel += (rr.second - rr.first) * (p.col_end - p.col_begin);
        p.offset = offset;
        p.decay = d.decay;
        p.tied_copy = tied_copy;
        p.ep_primary = !tied_copy && (!p.tp_replicated || r == 0);
        p.primary = p.ep_primary && (expert >= 0 || L.ep_rank == 0);
        const size_t instance = layer >= 0 ? rank_in_set(s, d.layers, layer) * experts_of(s, d) + size_t(std::max(expert, 0)) : 0;
        p.file_offset = file_base[i] + instance * decl_numel(d);
        table.push_back(p);
        offset += p.numel;
    };
    if (L.first)
        for (size_t i = 0; i < decls.size(); i++)
            if (decls[i].part == ModelPart::Embedding) add(i, -1, -1, false);
    for (const auto& c : layout_chunks(s, L))
        for (int l = c.first; l < c.second; l++)
            for (size_t i = 0; i < decls.size(); i++) {
                if (decls[i].part != ModelPart::Layer || !in_set(s, decls[i].layers, l)) continue;
                if (!decls[i].per_expert) {
                    add(i, l, -1, false);
                    continue;
                }
                size_t j = i;  // the run of per-expert declarations [i, j), expert by expert
                while (j < decls.size() && decls[j].part == ModelPart::Layer && decls[j].per_expert) j++;
                for (int e = L.experts_begin(s.moe.num_experts); e < L.experts_end(s.moe.num_experts); e++)
                    for (size_t k = i; k < j; k++)
                        if (in_set(s, decls[k].layers, l)) add(k, l, e, false);
                i = j - 1;
            }
    if (L.last) {
        for (size_t i = 0; i < decls.size(); i++)
            if (decls[i].part == ModelPart::Head) add(i, -1, -1, false);
        if (!L.first && s.tie_embeddings)
            for (size_t i = 0; i < decls.size(); i++)
                if (decls[i].role == TokEmb) add(i, -1, -1, true);
    }
    *num_local = offset;
    return table;
}

std::vector<ParamUnit> param_units(const std::vector<ParamSpec>& table, size_t padded_params,
                                   std::vector<int>* param_unit) {
    std::vector<ParamUnit> units;
    param_unit->resize(table.size());
    for (size_t i = 0; i < table.size(); i++) {
        const ParamSpec& p = table[i];
        const ParamUnit::Kind k = p.part == ModelPart::Layer ? ParamUnit::Layer
                                  : p.part == ModelPart::Head ? ParamUnit::Head
                                                              : ParamUnit::Embedding;
        if (units.empty() || units.back().kind != k || units.back().layer != p.layer)
            units.push_back({k, p.offset, p.offset, p.layer});
        LLMC_ASSERT(units.back().end == p.offset, "units must be contiguous");
        units.back().end = p.offset + p.numel;
        (*param_unit)[i] = int(units.size()) - 1;
    }
    if (!units.empty()) units.back().end = padded_params;
    return units;
}

ParamLayout param_layout(const ModelShape& s, const ModelLayout& layout, size_t pad_multiple) {
    LLMC_ASSERT(pad_multiple >= 1, "pad_multiple must be >= 1");
    ParamLayout p;
    p.specs = param_table(s, layout, &p.num_params);
    p.padded_params = padded_param_count(p.num_params, pad_multiple);
    p.total_params = num_params(s);
    p.units = param_units(p.specs, p.padded_params, &p.spec_unit);
    return p;
}

void for_each_chunk(const ReadFileOrder& read, size_t n, const std::function<void(size_t, const float*, size_t)>& f) {
    std::vector<float> buf(std::min(n, size_t(1) << 20));
    for (size_t first = 0; first < n; first += buf.size()) {
        const size_t k = std::min(buf.size(), n - first);
        read(first, k, buf.data());
        f(first, buf.data(), k);
    }
}

std::vector<float> pick_file_order(const ParamLayout& layout, const ReadFileOrder& read,
                                   const std::vector<std::pair<size_t, size_t>>& runs) {
    std::vector<size_t> at(runs.size() + 1, 0);  // where each run starts in the packed output
    for (size_t i = 0; i < runs.size(); i++) {
        LLMC_ASSERT(runs[i].first < runs[i].second && runs[i].second <= layout.padded_params &&
                        (i == 0 || runs[i - 1].second <= runs[i].first),
                    "pick_file_order: runs must be ascending, disjoint and within the buffer");
        at[i + 1] = at[i] + (runs[i].second - runs[i].first);
    }
    std::vector<float> out(at.back(), 0.0f);
    // Pieces close together in the file are read as one span and copied out: the rows of a tensor
    // split by columns (each a row apart), a fused tensor's blocks, adjacent small tensors. A
    // piece joins the span when the gap before it is at most its own size or kGap elements
    // (64 KB), and the span stays within kSpan elements (4 MB). A rank's shard reads little more
    // than it holds; a column-split tensor's rows are read with the other ranks' columns between.
    constexpr size_t kSpan = size_t(1) << 20, kGap = size_t(16) << 10;
    struct Piece {
        size_t src, n;
        float* dst;
    };
    std::vector<Piece> span;
    std::vector<float> scratch;
    auto flush = [&] {
        if (span.empty()) return;
        const size_t first = span.front().src, n = span.back().src + span.back().n - first;
        bool in_place = true;  // one after another in the file and in out (a fused tensor's blocks): read into place
        for (size_t k = 1; k < span.size(); k++)
            in_place = in_place && span[k].src == span[k - 1].src + span[k - 1].n &&
                       span[k].dst == span[k - 1].dst + span[k - 1].n;
        if (in_place) {
            read(first, n, span.front().dst);
        } else {
            scratch.resize(n);
            read(first, n, scratch.data());
            for (const Piece& q : span) std::memcpy(q.dst, &scratch[q.src - first], q.n * sizeof(float));
        }
        span.clear();
    };
    auto add = [&](size_t src, size_t n, float* dst) {
        if (!span.empty()) {
            const size_t end = span.back().src + span.back().n;
            if (src < end || src - end > std::max(n, kGap) || src + n - span.front().src > kSpan) flush();
        }
        span.push_back({src, n, dst});
    };
    for (const ParamSpec& p : layout.specs)
        for_each_run(p, [&](size_t local, size_t src, size_t n) {
            const size_t a = p.offset + local, b = a + n;  // memory positions [a, b) hold file [src, src + n)
            // the first run that ends after a, then every run that starts before b
            size_t i = size_t(std::upper_bound(runs.begin(), runs.end(), a,
                                               [](size_t x, const std::pair<size_t, size_t>& r) { return x < r.second; }) -
                              runs.begin());
            for (; i < runs.size() && runs[i].first < b; i++) {
                const size_t x = std::max(a, runs[i].first), y = std::min(b, runs[i].second);
                add(src + (x - a), y - x, &out[at[i] + (x - runs[i].first)]);
            }
        });
    flush();
    return out;
}
