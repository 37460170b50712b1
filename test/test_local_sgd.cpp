// Local SGD's outer optimizer (llmc/train/local_sgd.h) on one rank, against the update written out
// here in double (PyTorch's SGD with Nesterov momentum on the pseudo-gradient anchor - mean), and
// AdamW's fp32 weights (get_weights / set_weights) with and without master weights. The DP group's
// sums and the checkpoints run in test/e2e/test_local_sgd.sh.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/param_table.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/local_sgd.h"

namespace {
std::vector<float> ramp(size_t n, float scale, int salt) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = scale * float(int((i * 7919 + size_t(salt) * 104729) % 201) - 100);
    return x;
}
}  // namespace

TEST_CASE("local SGD: the outer step is SGD with Nesterov momentum on anchor - mean", "[local_sgd]") {
    auto ops = make_cpu_ops();
    const ModelShape s{2, 2, 16, 100, 128, 16};
    const ParamLayout layout = param_layout(s, ModelLayout(), DataParallel::pad_multiple(1));
    const size_t n = layout.padded_params;
    for (int zero : {0, 1}) {
        for (double mu : {0.0, 0.9}) {
            INFO("zero " << zero << ", momentum " << mu);
            const double lr = 0.7;
            std::unique_ptr<Comm> self = make_self_comm(0);
            Tensor params(ops->alloc(n * 4), n, DType::F32), grads(ops->alloc(n * 4), n, DType::F32);
            AdamW opt(layout, *ops, 0, n, params, grads);
            LocalSgdConfig cfg;
            cfg.every = 3, cfg.outer_lr = lr, cfg.outer_momentum = mu;
            LocalSgd outer(cfg, n, *ops, *self, zero, 97);  // pieces of 97: the last one short
            CHECK((outer.begin() == 0 && outer.end() == n));
            CHECK(outer.due(3, 10));
            CHECK(!outer.due(4, 10));
            CHECK(outer.due(10, 10));  // the last step syncs
            const std::vector<float> w0 = ramp(n, 0.01f, 0);
            opt.set_weights(w0);
            outer.start(opt);
            std::vector<double> anchor(w0.begin(), w0.end()), buf(n, 0.0);
            for (int sync = 1; sync <= 3; sync++) {
                // the inner steps moved the weights somewhere
                std::vector<float> w = opt.get_weights();
                const std::vector<float> d = ramp(n, 1e-3f, sync);
                for (size_t i = 0; i < n; i++) w[i] -= d[i];
                opt.set_weights(w);
                outer.sync(opt);
                // PyTorch SGD(nesterov=True, dampening=0): buf = mu buf + g; p -= lr (g + mu buf)
                for (size_t i = 0; i < n; i++) {
                    const double g = anchor[i] - double(w[i]);
                    buf[i] = mu * buf[i] + g;
                    anchor[i] -= lr * (g + mu * buf[i]);
                }
                const std::vector<float> got = opt.get_weights();
                double worst = 0;
                for (size_t i = 0; i < n; i++) {
                    worst = std::max(worst, std::fabs(double(got[i]) - anchor[i]));
                    worst = std::max(worst, std::fabs(double(outer.anchor()[i]) - anchor[i]));
                    worst = std::max(worst, std::fabs(double(outer.momentum()[i]) - buf[i]));
                }
                CHECK(worst < 1e-6);
                CHECK(outer.anchor() == got);  // every replica gets the anchor itself
            }
            CHECK(outer.bytes_sent() == 0.0);  // a group of one sends nothing
            // a checkpoint's view: the whole state on DP rank 0, no other replicas
            const LocalSgdState st = outer.gather(ReplicaState{});
            CHECK(st.anchor == outer.anchor());
            CHECK(st.momentum == outer.momentum());
            CHECK(st.replicas.empty());
            ops->release(params.ptr);
            ops->release(grads.ptr);
        }
    }
}

TEST_CASE("local SGD: lr 1 and momentum 0 make the sync the mean of the replicas", "[local_sgd]") {
    auto ops = make_cpu_ops();
    const ModelShape s{1, 2, 16, 100, 128, 16};
    const ParamLayout layout = param_layout(s, ModelLayout(), DataParallel::pad_multiple(1));
    const size_t n = layout.padded_params;
    std::unique_ptr<Comm> self = make_self_comm(0);
    Tensor params(ops->alloc(n * 4), n, DType::F32), grads(ops->alloc(n * 4), n, DType::F32);
    AdamW opt(layout, *ops, 0, n, params, grads);
    LocalSgdConfig cfg;
    cfg.every = 1;
    REQUIRE((cfg.outer_lr == 1.0 && cfg.outer_momentum == 0.0));  // the defaults: plain averaging
    LocalSgd outer(cfg, n, *ops, *self, 0, 1 << 20);
    opt.set_weights(ramp(n, 0.01f, 0));
    outer.start(opt);
    const std::vector<float> w = ramp(n, 0.013f, 5);
    opt.set_weights(w);
    outer.sync(opt);
    const std::vector<float> got = opt.get_weights();
    double worst = 0, most = 0;
    for (size_t i = 0; i < n; i++) worst = std::max(worst, std::fabs(double(got[i]) - w[i])), most = std::max(most, std::fabs(double(w[i])));
    CHECK(worst <= 1e-7 * most);  // anchor - (anchor - w): w but for the rounding of a - w
    ops->release(params.ptr);
    ops->release(grads.ptr);
}

TEST_CASE("AdamW's weights: the master where kept, rounded to the model's dtype in the parameters", "[local_sgd]") {
    auto ops = make_cpu_ops();
    const ModelShape s{1, 2, 16, 100, 128, 16};
    const ParamLayout layout = param_layout(s, ModelLayout(), DataParallel::pad_multiple(1));
    const size_t n = layout.padded_params;
    Tensor params(ops->alloc(n * 2), n, DType::BF16), grads(ops->alloc(n * 2), n, DType::BF16);
    for (bool offload : {false, true}) {
        AdamW opt(layout, *ops, 0, n, params, grads, OptimizerOffload{offload, 50});
        REQUIRE(opt.has_master());
        std::vector<float> w = ramp(n, 1.001e-3f, 3);
        opt.set_weights(w);
        CHECK(opt.get_weights() == w);  // the fp32 master, not the bf16 parameters
        std::vector<float> p(n);
        ops->to_host_f32(p.data(), params);
        size_t rounded = 0;
        for (size_t i = 0; i < n; i++) {
            rounded += p[i] != w[i];
            CHECK(std::fabs(p[i] - w[i]) <= std::fabs(w[i]) * (1.0f / 256));  // bf16: 8 bits of mantissa
        }
        CHECK(rounded > n / 2);
    }
    ops->release(params.ptr);
    ops->release(grads.ptr);
}
