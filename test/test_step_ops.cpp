// The step's multi-tensor ops (issue 29: gradient norm, clipping decision and AdamW without a
// read back) against the per-tensor ops they replace, bit for bit, and the CPU backend's
// accounting of what a device would move (Ops::counters).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "llmc/backend/ops.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/core/rng.h"
#include "llmc/model/optimizer.h"

namespace {
std::vector<float> random_vec(Rng& r, size_t n, float scale, bool positive = false) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * (positive ? std::fabs(r.normal()) : r.normal());
    return v;
}
}  // namespace

TEST_CASE("sum_squares_multi is the per-region sums added in order", "[adamw]") {
    auto ops = make_cpu_ops();
    Rng r(7);
    // sizes around the kernels' blocks, one empty region
    std::vector<float> g = random_vec(r, 70000, 0.3f);
    const size_t cuts[][2] = {{0, 5}, {5, 4096}, {4101, 0}, {4101, 33333}, {37434, 32566}};
    std::vector<Tensor> regions;
    double want = 0.0;
    for (const auto& c : cuts) {
        regions.push_back(Tensor(g.data() + c[0], c[1], DType::F32));
        want += ops->sum_squares(regions.back());
    }
    double got = -1.0;
    ops->sum_squares_multi(&got, regions);
    CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    ops->sum_squares_multi(&got, {});
    CHECK(got == 0.0);
}

TEST_CASE("step_control: torch's clip factor and the non-finite decision", "[adamw]") {
    auto ops = make_cpu_ops();
    const double inf = INFINITY;
    struct Case {
        double ss, loss_check, clip;
        float scale, update;
        double loss_scale = 1.0;
    } cases[] = {
        {0.25, 0.0, 1.0, 1.0f, 1.0f},  // norm 0.5 < clip
        {16.0, 3.0, 1.0, float(1.0 / (4.0 + 1e-6)), 1.0f},
        {16.0, 0.0, 0.0, 1.0f, 1.0f},  // clipping off
        {NAN, 0.0, 1.0, 1.0f, 0.0f},   // NaN gradient
        {inf, 0.0, 1.0, 0.0f, 0.0f},   // clip / inf
        {4.0, NAN, 1.0, float(1.0 / (2.0 + 1e-6)), 0.0f},  // a NaN loss
        {4.0, inf, 1.0, float(1.0 / (2.0 + 1e-6)), 0.0f},  // an infinite loss
        // loss scaling: the gradient is 1024 x the true one (true norm 4 / 1024 x 1024 = 4 -> clipped),
        // ctl[0] unscales: 1/1024 times the clip factor
        {16.0 * 1024 * 1024, 0.0, 1.0, float(1.0 / (4.0 + 1e-6) / 1024.0), 1.0f, 1024.0},
        {0.25 * 65536.0 * 65536.0, 0.0, 1.0, 1.0f / 65536.0f, 1.0f, 65536.0},  // true norm 0.5: unscaled only
        {16.0 * 9.0, 0.0, 0.0, 1.0f / 3.0f, 1.0f, 3.0},  // clipping off: 1 / scale
        {inf, 0.0, 1.0, 0.0f, 0.0f, 65536.0},  // an overflowed gradient: skip
    };
    for (const Case& c : cases) {
        const double ss[2] = {c.ss, c.loss_check};
        float ctl[2] = {-1.0f, -1.0f};
        ops->step_control(ctl, ss, c.clip, c.loss_scale);
        INFO("ss " << c.ss << " loss check " << c.loss_check << " clip " << c.clip << " loss scale " << c.loss_scale);
        CHECK(ctl[0] == c.scale);
        CHECK(ctl[1] == c.update);
        if (std::isfinite(c.ss) && c.loss_scale == 1.0) CHECK(ctl[0] == clip_scale(std::sqrt(c.ss), c.clip));
    }
}

TEST_CASE("adamw_multi updates every piece as one adamw call would, and nothing when skipped", "[adamw]") {
    auto ops = make_cpu_ops();
    Rng r(11);
    const size_t n = 20000;
    for (bool master : {false, true}) {
        const std::vector<float> p0 = random_vec(r, n, 1.0f), g = random_vec(r, n, 0.1f),
                                 m0 = random_vec(r, n, 0.01f), v0 = random_vec(r, n, 0.01f, true);
        std::vector<float> pa = p0, ma = m0, va = v0, wa = p0, pb = p0, mb = m0, vb = v0, wb = p0;
        const size_t cuts[][2] = {{0, 3}, {3, 4097}, {4100, 10000}, {14100, 5900}};
        const float decay[] = {0.1f, 0.0f, 0.1f, 0.05f}, scale = 0.7f, lr = 1e-2f;
        std::vector<AdamWPiece> pieces;
        for (int i = 0; i < 4; i++) {
            const size_t o = cuts[i][0], k = cuts[i][1];
            ops->adamw(Tensor(pa.data() + o, k, DType::F32), master ? wa.data() + o : nullptr,
                       Tensor(const_cast<float*>(g.data()) + o, k, DType::F32), ma.data() + o, va.data() + o, lr, 0.9f,
                       0.95f, 1e-8f, decay[i], scale, 3, 5u + uint32_t(i), uint32_t(o));
            pieces.push_back({Tensor(pb.data() + o, k, DType::F32), master ? wb.data() + o : nullptr,
                              Tensor(const_cast<float*>(g.data()) + o, k, DType::F32), mb.data() + o, vb.data() + o,
                              decay[i], 5u + uint32_t(i), uint32_t(o)});
        }
        const float skip[2] = {scale, 0.0f}, update[2] = {scale, 1.0f};
        ops->adamw_multi(pieces, skip, lr, 0.9f, 0.95f, 1e-8f, 3);
        CHECK(std::memcmp(pb.data(), p0.data(), n * 4) == 0);
        CHECK(std::memcmp(mb.data(), m0.data(), n * 4) == 0);
        CHECK(std::memcmp(vb.data(), v0.data(), n * 4) == 0);
        ops->adamw_multi(pieces, update, lr, 0.9f, 0.95f, 1e-8f, 3);
        CHECK(std::memcmp(pa.data(), pb.data(), n * 4) == 0);
        CHECK(std::memcmp(ma.data(), mb.data(), n * 4) == 0);
        CHECK(std::memcmp(va.data(), vb.data(), n * 4) == 0);
        CHECK(std::memcmp(wa.data(), wb.data(), n * 4) == 0);
        CHECK(std::memcmp(pa.data(), p0.data(), n * 4) != 0);  // it did update
    }
}

TEST_CASE("the CPU backend counts what a device would move and wait for", "[device]") {
    auto ops = make_cpu_ops();
    const size_t big = Ops::kUploadNoSync / sizeof(float) + 1;
    float* dev = static_cast<float*>(ops->alloc(big * sizeof(float)));
    std::vector<float> host(big, 1.0f);
    const OpsCounters c0 = ops->counters();
    ops->from_host_bytes(dev, host.data(), 64);  // small upload: no wait
    OpsCounters d = ops->counters() - c0;
    CHECK(d.h2d_bytes == 64);
    CHECK(d.host_syncs == 0);
    ops->from_host_f32(Tensor(dev, big, DType::F32), host.data());  // past kUploadNoSync: a wait
    d = ops->counters() - c0;
    CHECK(d.h2d_bytes == 64 + big * 4);
    CHECK(d.host_syncs == 1);
    ops->to_host_bytes(host.data(), dev, 12);  // every read back waits
    d = ops->counters() - c0;
    CHECK(d.d2h_bytes == 12);
    CHECK(d.host_syncs == 2);
    ops->zero(Tensor(dev, big, DType::F32));
    ops->residual_forward(Tensor(dev, 8, DType::F32), Tensor(dev, 8, DType::F32), Tensor(dev + 8, 8, DType::F32));
    ops->synchronize();
    d = ops->counters() - c0;
    CHECK(d.launches == 2);
    CHECK(d.host_syncs == 3);
    const uint64_t id = ops->copy_to_host_async(host.data(), dev, 40);
    ops->wait_copy(id);
    d = ops->counters() - c0;
    CHECK(d.d2h_bytes == 52);
    CHECK(d.host_syncs == 4);
    ops->release(dev);
}
