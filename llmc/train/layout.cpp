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

void assemble_whole(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple,
                    const std::vector<float>& local, Comm& mp, std::vector<float>& whole) {
    const int members = mp.size();
    LLMC_ASSERT(members == pc.tp * pc.pp * pc.ep, "the mp group must hold tp x pp x ep ranks");
    std::vector<ModelLayout> layouts;
    std::vector<std::vector<ParamSpec>> tables;
    std::vector<size_t> counts;
    for (int i = 0; i < members; i++) {
        layouts.push_back(model_layout(shape, pc, i % pc.tp, i / (pc.tp * pc.ep), i / pc.tp % pc.ep));
        size_t n = 0;
        tables.push_back(param_table(shape, layouts.back(), &n));
        counts.push_back((n + pad_multiple - 1) / pad_multiple * pad_multiple);
    }
    LLMC_ASSERT(local.size() == counts[size_t(mp.rank())], "assemble_whole: local buffer of the wrong size");
    // every member's buffer, one after another (alone: the local one, not a copy of it)
    std::vector<float> all;
    const float* from = local.data();
    if (members > 1) {
        if (mp.rank() == 0) {
            size_t total = 0;
            for (size_t c : counts) total += c;
            all.resize(total);
        }
        mp.gather(local.data(), mp.rank() == 0 ? all.data() : nullptr, counts, 0);
        from = all.data();
    }
    if (mp.rank() != 0) {
        whole.clear();
        return;
    }
    whole.resize(num_params(shape));
    std::vector<std::pair<size_t, size_t>> runs;  // (first, count) of whole's elements copied
    size_t base = 0;
    for (int i = 0; i < members; i++) {
        for (const ParamSpec& p : tables[size_t(i)]) {
            if (!p.primary) continue;
            for_each_run(p, [&](size_t loc, size_t dst, size_t n) {
                std::memcpy(&whole[dst], from + base + p.offset + loc, n * sizeof(float));
                runs.emplace_back(dst, n);
            });
        }
        base += counts[size_t(i)];
    }
    std::sort(runs.begin(), runs.end());
    size_t covered = 0;  // whole[0, covered) was written
    for (const auto& r : runs) {
        LLMC_ASSERT(r.first <= covered, "assemble_whole: the layouts' primary pieces do not cover the model");
        covered = std::max(covered, r.first + r.second);
    }
    LLMC_ASSERT(covered == whole.size(), "assemble_whole: the layouts' primary pieces do not cover the model");
}
