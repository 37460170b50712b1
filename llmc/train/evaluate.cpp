#include "llmc/train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "llmc/core/rng.h"
#include "llmc/run/preempt.h"

void next_batch(DataLoader& loader, const ContextParallel& cp, int B, int t, std::vector<int32_t>& x,
                std::vector<int32_t>& y) {
    loader.next(x.data(), y.data());
    if (cp.size() == 1) return;
    std::vector<int32_t> rows(size_t(B) * t);
    for (std::vector<int32_t>* v : {&x, &y}) {
        cp_take_rows(v->data(), rows.data(), B, t * cp.size(), cp.size(), cp.rank());
        std::copy(rows.begin(), rows.end(), v->begin());
    }
}

double evaluate(PipelineEngine& pipeline, DataLoader& val, const ContextParallel& cp, int batches, int B, int t,
                std::vector<int32_t>& x, std::vector<int32_t>& y, DataParallel& dp, Comm& world, int* sig) {
    val.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        if ((*sig = preempt_agreed(world))) return 0.0;
        next_batch(val, cp, B, t, x, y);
        sum += pipeline.forward_only(x.data(), y.data(), B, t);
    }
    return dp.mean(batches > 0 ? sum / batches : 0.0);
}

std::vector<int> sample(PipelineEngine& pipeline, Model& model, TensorParallel& tp, ContextParallel& cp, int eot,
                        int n, uint64_t seed, Comm& world, int* sig) {
    const int V = model.shape.vocab_size, Vl = model.shape.vocab_shard(tp.size());
    Rng rng(seed, 0x5A3D1E);
    std::vector<int32_t> ctx = {eot};
    std::vector<int> out;
    std::vector<float> slice(size_t(Vl), -INFINITY), logits(size_t(Vl) * tp.size());
    for (int i = 0; i < n; i++) {
        if ((*sig = preempt_agreed(world))) break;
        const int ncp = cp.size(), t = std::min<int>(int(ctx.size()), model.T * ncp);
        // sequence parallelism splits a rank's tokens evenly over TP, context parallelism a
        // sequence into 2 x cp equal chunks: pad the window at its end (causal attention keeps
        // the padding out of position t - 1); the padded length still fits (train.seq_len is
        // such a multiple)
        const int sp = model.layout.sequence_parallel ? tp.size() : 1;
        const int unit = ncp == 1 ? sp : ncp * (sp % 2 == 0 ? sp : 2 * sp);
        const int padded = (t + unit - 1) / unit * unit, tl = padded / ncp;
        std::vector<int32_t> window(ctx.end() - t, ctx.end());
        std::vector<int32_t> rows = std::vector<int32_t>(size_t(tl));
        window.resize(size_t(padded), eot);
        cp_take_rows(window.data(), rows.data(), 1, padded, ncp, cp.rank());
        model.set_valid_tokens(t);  // MoE capacity over the window without its padding
        pipeline.forward_only(rows.data(), nullptr, 1, tl);
        model.set_valid_tokens(0);
        // the CP rank holding position t - 1, and its row there
        int holder = 0, row = t - 1;
        for (int r = 0; r < ncp; r++)
            for (int i = 0; i < tl; i++)
                if (cp_global_row(i, tl, ncp, r) == t - 1) holder = r, row = i;
        float next = 0.0f;
        const double u = rng.uniform();  // drawn on every rank: the generators stay in step whichever rank picks
        if (pipeline.is_last_stage() && cp.rank() == holder) {
            int v0 = 0;
            std::fill(slice.begin(), slice.end(), -INFINITY);
            model.get_logits_slice(0, row, slice.data(), &v0);
            if (tp.size() > 1) tp.comm()->all_gather(slice.data(), logits.data(), std::vector<size_t>(size_t(tp.size()), size_t(Vl)));
            else logits = slice;
            float mx = logits[0];
            for (int k = 0; k < V; k++) mx = std::max(mx, logits[size_t(k)]);
            double total = 0.0;
            for (int k = 0; k < V; k++) total += (logits[size_t(k)] = std::exp(logits[size_t(k)] - mx));
            double r = u * total, c = 0.0;
            int pick = V - 1;
            for (int k = 0; k < V; k++)
                if ((c += logits[size_t(k)]) > r) {
                    pick = k;
                    break;
                }
            next = float(pick);
        }
        if (ncp > 1 && pipeline.is_last_stage()) cp.comm()->broadcast(&next, 1, holder);
        next = float(pipeline.broadcast_from_last(next));
        ctx.push_back(int32_t(next));
        out.push_back(int(next));
    }
    return out;
}

void sample_wait(int n, Comm& world, int* sig) {
    for (int i = 0; i < n && !(*sig = preempt_agreed(world)); i++) {
    }
}
