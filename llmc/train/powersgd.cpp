#include "llmc/train/powersgd.h"

#include <algorithm>
#include <cmath>

#include "llmc/core/rng.h"
#include "llmc/train/data_parallel.h"

PowerSgdPlan powersgd_plan(const ParamLayout& layout, int rank) {
    LLMC_ASSERT(rank >= 1, "PowerSGD: rank must be >= 1");
    PowerSgdPlan plan;
    plan.rank = rank;
    plan.total = layout.padded_params;
    const size_t r = size_t(rank);
    size_t at = 0;  // the plain run not yet closed starts here
    for (const ParamSpec& p : layout.specs) {  // memory order
        const size_t m = p.col_end - p.col_begin, n = m ? p.numel / m : 0;
        if (m == 0 || n * m != p.numel || r * (n + m) >= n * m) continue;  // sent as it is
        if (p.offset > at) plan.plain.push_back({at, p.offset});
        at = p.offset + p.numel;
        plan.matrices.push_back({p.offset, n, m, plan.q_elems});
        plan.p_elems += n * r;
        plan.q_elems += m * r;
    }
    if (plan.total > at) plan.plain.push_back({at, plan.total});
    for (const auto& run : plan.plain) plan.plain_elems += run.second - run.first;
    return plan;
}

void orthonormalize_columns(float* p, size_t n, size_t r) {
    for (size_t j = 0; j < r; j++) {
        for (size_t k = 0; k < j; k++) {
            double dot = 0;
            for (size_t i = 0; i < n; i++) dot += double(p[i * r + j]) * double(p[i * r + k]);
            for (size_t i = 0; i < n; i++) p[i * r + j] = float(double(p[i * r + j]) - dot * double(p[i * r + k]));
        }
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += double(p[i * r + j]) * double(p[i * r + j]);
        const double inv = ss > 0 ? 1.0 / std::sqrt(ss) : 0.0;
        for (size_t i = 0; i < n; i++) p[i * r + j] = float(double(p[i * r + j]) * inv);
    }
}

PowerSgd::PowerSgd(const ParamLayout& layout, int rank, uint64_t seed, Ops& ops, Comm& dp, size_t piece)
    : plan_(powersgd_plan(layout, rank)), ops_(ops), comm_(dp), stage_(ops, &dp), piece_(std::max<size_t>(1, piece)) {
    error_.assign(plan_.total, 0.0f);
    q_.resize(plan_.q_elems);
    for (size_t k = 0; k < plan_.matrices.size(); k++) {
        const PowerSgdPlan::Matrix& mat = plan_.matrices[k];
        Rng rng(seed, 0x5053474400ull + k);  // "PSGD" and the matrix: alike on every rank
        for (size_t i = 0; i < mat.cols * size_t(rank); i++) q_[mat.q_offset + i] = rng.normal();
    }
    host_.resize(plan_.total);
    send_.resize(plan_.plain_elems + plan_.p_elems);
    qsum_.resize(plan_.q_elems);
}

namespace {
bool all_finite(const std::vector<float>& x) {
    size_t bad = 0;
    for (float v : x) bad += !std::isfinite(v);
    return bad == 0;
}
}  // namespace

bool PowerSgd::round(float* g, const std::function<void(float*, size_t)>& all_reduce, int ranks) {
    const size_t r = size_t(plan_.rank);
    // M' = M + E in place; the plain elements, then every P = M' Q, into one buffer
    float* s = send_.data();
    for (const auto& run : plan_.plain) s = std::copy(g + run.first, g + run.second, s);
    for (const PowerSgdPlan::Matrix& mat : plan_.matrices) {
        float* m = g + mat.offset;
        const float* e = error_.data() + mat.offset;
        for (size_t i = 0; i < mat.rows * mat.cols; i++) m[i] += e[i];
        const float* q = q_.data() + mat.q_offset;
        for (size_t i = 0; i < mat.rows; i++)
            for (size_t j = 0; j < r; j++) {
                float acc = 0;
                for (size_t c = 0; c < mat.cols; c++) acc += m[i * mat.cols + c] * q[c * r + j];
                s[i * r + j] = acc;
            }
        s += mat.rows * r;
    }
    all_reduce(send_.data(), send_.size());
    // the plain sums are final; P^, then Q = M'^T P^ into one buffer
    s = send_.data();
    for (const auto& run : plan_.plain) {
        std::copy(s, s + (run.second - run.first), g + run.first);
        s += run.second - run.first;
    }
    const bool p_finite = all_finite(send_);
    for (const PowerSgdPlan::Matrix& mat : plan_.matrices) {
        orthonormalize_columns(s, mat.rows, r);
        const float* m = g + mat.offset;
        float* q = qsum_.data() + mat.q_offset;
        std::fill(q, q + mat.cols * r, 0.0f);
        for (size_t i = 0; i < mat.rows; i++)  // row by row: q[c][j] += m[i][c] p[i][j], i ascending
            for (size_t c = 0; c < mat.cols; c++) {
                const float mic = m[i * mat.cols + c];
                for (size_t j = 0; j < r; j++) q[c * r + j] += mic * s[i * r + j];
            }
        s += mat.rows * r;
    }
    all_reduce(qsum_.data(), qsum_.size());
    const bool commit = p_finite && all_finite(qsum_);
    // G = P^ Q^T over M', E = M' - G / dp, Q = Q / dp
    const float inv = 1.0f / float(ranks);
    s = send_.data() + plan_.plain_elems;
    for (const PowerSgdPlan::Matrix& mat : plan_.matrices) {
        float* m = g + mat.offset;
        float* e = error_.data() + mat.offset;
        const float* q = qsum_.data() + mat.q_offset;
        for (size_t i = 0; i < mat.rows; i++)
            for (size_t c = 0; c < mat.cols; c++) {
                float acc = 0;
                for (size_t j = 0; j < r; j++) acc += s[i * r + j] * q[c * r + j];
                if (commit) e[i * mat.cols + c] = m[i * mat.cols + c] - acc * inv;
                m[i * mat.cols + c] = acc;
            }
        s += mat.rows * r;
        if (!commit) continue;
        for (size_t j = 0; j < r; j++) {  // a column that came out zero keeps its warm start
            bool zero = true;
            for (size_t c = 0; c < mat.cols && zero; c++) zero = q[c * r + j] == 0.0f;
            if (zero) continue;
            for (size_t c = 0; c < mat.cols; c++) q_[mat.q_offset + c * r + j] = q[c * r + j] * inv;
        }
    }
    return commit;
}

void PowerSgd::reduce(Tensor grads) {
    LLMC_ASSERT(grads.n == plan_.total, "PowerSGD: the gradient buffer is not the layout's");
    ops_.to_host_f32(host_.data(), grads);
    const int p = comm_.size();
    round(host_.data(),
          [&](float* x, size_t n) {
              stage_.all_reduce_host(x, n, piece_);
              bytes_sent_ += DataParallel::ring_bytes_all_reduce(4.0 * double(n), p);
          },
          p);
    ops_.from_host_f32(grads, host_.data());
}

void PowerSgd::set_state(const std::vector<float>& error, const std::vector<float>& q) {
    LLMC_ASSERT(error.size() == plan_.total && q.size() == plan_.q_elems, "PowerSGD state of another layout or rank");
    error_ = error;
    q_ = q;
}

void PowerSgd::gather(std::vector<std::vector<float>>* errors, std::vector<float>* q) {
    errors->clear();
    if (comm_.rank() == 0) *q = q_;
    for (int from = 0; from < comm_.size(); from++) {
        std::vector<float> e = stage_.gather_host(error_, from, piece_);
        if (comm_.rank() == 0) errors->push_back(std::move(e));
    }
}
