// FP8 scaling state (host side): per-tensor scales with amax history, the model's container
// of them, and its bit-exact serialisation. See llmc/precision/fp8.h.
#include "llmc/precision/fp8.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/core/config.h"

// ---- Fp8TensorScale ----

Fp8TensorScale::Fp8TensorScale(Fp8Format format, Fp8Recipe recipe, int history, int margin)
    : format_(format), recipe_(recipe), margin_(margin) {
    LLMC_ASSERT(history >= 1, "fp8: amax history must hold at least one step");
    if (recipe == Fp8Recipe::Delayed) history_.assign((size_t)history, 0.0f);
}

Fp8Cast Fp8TensorScale::cast(float* amax) const {
    Fp8Cast c;
    c.format = format_;
    c.scale = scale_;
    c.current = recipe_ == Fp8Recipe::Current;
    c.margin = margin_;
    c.amax = amax;
    return c;
}

bool Fp8TensorScale::update(float amax) {
    if (fp8_update_one(amax, &scale_, history_.data(), (int)history_.size(), format_, margin_)) return true;
    ++overflows_;
    return false;
}

void Fp8TensorScale::export_to(float* scale, float* hist) const {
    *scale = scale_;
    std::copy(history_.begin(), history_.end(), hist);
}

void Fp8TensorScale::import_from(float scale, const float* hist, uint64_t overflows) {
    scale_ = scale;
    std::copy(hist, hist + history_.size(), history_.begin());
    overflows_ += overflows;
}

namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {
    const size_t o = out.size();
    out.resize(o + sizeof(T));
    std::memcpy(out.data() + o, &v, sizeof(T));
}
template <class T>
bool get(const std::vector<uint8_t>& in, size_t& pos, T* v) {
    if (pos > in.size() || in.size() - pos < sizeof(T)) return false;
    std::memcpy(v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
}

}  // namespace

// Layout: u32 history length, f32 scale, u32 next slot, u64 overflow events, f32 ring[history].
// The ring's oldest entry is at the next slot (where the next amax would go); this code keeps
// the history oldest first and so writes next slot 0, and reads any (a checkpoint written before
// the history was kept in time order: the same state). (Format, recipe and margin belong to
// the options and are checked by Fp8State::load.)
void Fp8TensorScale::save(std::vector<uint8_t>& out) const {
    put<uint32_t>(out, (uint32_t)history_.size());
    put<float>(out, scale_);
    put<uint32_t>(out, 0);
    put<uint64_t>(out, overflows_);
    for (float h : history_) put<float>(out, h);
}

bool Fp8TensorScale::load(const std::vector<uint8_t>& in, size_t& pos) {
    uint32_t n = 0, next = 0;
    float scale = 0;
    uint64_t overflows = 0;
    if (!get(in, pos, &n) || n != history_.size() || !get(in, pos, &scale) || !get(in, pos, &next) ||
        !get(in, pos, &overflows))
        return false;
    if (n ? next >= n : next != 0) return false;
    std::vector<float> ring(n);
    for (auto& h : ring)
        if (!get(in, pos, &h)) return false;
    if (!(scale > 0.0f) || !fp8_is_finite(scale)) return false;
    scale_ = scale;
    overflows_ = overflows;
    for (uint32_t k = 0; k < n; ++k) history_[k] = ring[(next + k) % n];  // oldest first
    return true;
}

// ---- Fp8State ----

Fp8Options fp8_options(const Fp8Config& cfg) {
    Fp8Options o;
    if (cfg.format == "hybrid")
        o.hybrid = true;
    else if (cfg.format == "e4m3")
        o.hybrid = false;
    else
        throw UserError("fp8.format: expected hybrid or e4m3, got '" + cfg.format + "'");
    if (cfg.recipe == "delayed")
        o.recipe = Fp8Recipe::Delayed;
    else if (cfg.recipe == "current")
        o.recipe = Fp8Recipe::Current;
    else
        throw UserError("fp8.recipe: expected delayed or current, got '" + cfg.recipe + "'");
    if (cfg.amax_history < 1) throw UserError(strfmt("fp8.amax_history: must be >= 1, got %d", cfg.amax_history));
    o.amax_history = cfg.amax_history;
    o.margin = cfg.margin;
    return o;
}

Fp8State::Fp8State(int n_layer, const Fp8Options& opt) : n_layer_(n_layer), opt_(opt) {
    LLMC_ASSERT(n_layer >= 0, "fp8: negative layer count");
    scales_.reserve((size_t)n_layer * kLinears * kOperands);
    for (int l = 0; l < n_layer; ++l)
        for (int lin = 0; lin < kLinears; ++lin)
            for (int op = 0; op < kOperands; ++op) {
                const Fp8Format f = fp8_format_of(index(l, (Fp8Linear)lin, (Fp8Operand)op), opt.hybrid);
                scales_.emplace_back(f, opt.recipe, opt.amax_history, opt.margin);
            }
}

Fp8Cast Fp8State::cast(int layer, Fp8Linear lin, Fp8Operand op, float* amax_array, const float* scale_array,
                       const float* inv_array) const {
    LLMC_ASSERT(layer >= 0 && layer < n_layer_, "fp8: layer out of range");
    const int i = index(layer, lin, op);
    Fp8Cast c = scales_[i].cast(amax_array ? amax_array + i : nullptr);
    if (scale_array) {
        c.scale = 1.0f;  // not read: the op reads scale_at (and the value stays alike step to step)
        c.scale_at = scale_array + i;
        if (inv_array && !c.current) c.inv_at = inv_array + (size_t)i * kFp8InvStride;
    }
    return c;
}

namespace {
size_t fp8_wide_at(int n, int history) {  // bytes before Fp8Device::wide, a multiple of 8
    return ((size_t(n) * (kFp8InvStride + 1) + fp8_image_floats(n, history)) * sizeof(float) + 7) / 8 * 8;
}
}  // namespace

size_t fp8_device_bytes(int n, int history) { return fp8_wide_at(n, history) + size_t(n) * sizeof(double); }

Fp8Device fp8_device_in(void* block, int n, int history, int margin, bool hybrid) {
    Fp8Device d;
    d.n = n, d.history = history, d.margin = margin, d.hybrid = hybrid;
    d.inv = static_cast<float*>(block);
    d.scale = d.inv + size_t(n) * kFp8InvStride;
    d.hist = d.scale + n;
    d.overflows = reinterpret_cast<uint32_t*>(d.hist + size_t(n) * history);
    d.amax = d.scale + fp8_image_floats(n, history);
    d.wide = reinterpret_cast<double*>(static_cast<char*>(block) + fp8_wide_at(n, history));
    return d;
}

void Fp8State::export_image(float* scale, float* hist) const {
    const int H = image_history();
    for (size_t i = 0; i < scales_.size(); ++i) scales_[i].export_to(scale + i, hist + i * H);
}

void Fp8State::import_image(const float* scale, const float* hist, const uint32_t* overflows) {
    const int H = image_history();
    for (size_t i = 0; i < scales_.size(); ++i) {
        LLMC_ASSERT(scale[i] > 0.0f && fp8_is_finite(scale[i]), "fp8: the device image holds a bad scale");
        scales_[i].import_from(scale[i], hist + i * H, overflows[i]);
    }
}

int Fp8State::update(const float* amaxes) {
    int bad = 0;
    for (size_t i = 0; i < scales_.size(); ++i) bad += !scales_[i].update(amaxes[i]);
    return bad;
}

uint64_t Fp8State::overflow_events() const {
    uint64_t n = 0;
    for (const auto& s : scales_) n += s.overflow_events();
    return n;
}

namespace {
constexpr uint32_t kStateMagic = 0x38504621;  // "!FP8" little-endian
constexpr uint32_t kStateVersion = 1;
}  // namespace

// Layout: u32 magic, u32 version, i32 n_layer, u8 hybrid, u8 recipe, i32 amax_history,
// i32 margin, u32 tensor count, then every Fp8TensorScale in index order.
std::vector<uint8_t> Fp8State::save() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, kStateMagic);
    put<uint32_t>(out, kStateVersion);
    put<int32_t>(out, n_layer_);
    put<uint8_t>(out, opt_.hybrid ? 1 : 0);
    put<uint8_t>(out, (uint8_t)opt_.recipe);
    put<int32_t>(out, opt_.amax_history);
    put<int32_t>(out, opt_.margin);
    put<uint32_t>(out, (uint32_t)scales_.size());
    for (const auto& s : scales_) s.save(out);
    return out;
}

void Fp8State::load(const std::vector<uint8_t>& bytes, const std::string& what) {
    size_t pos = 0;
    uint32_t magic = 0, version = 0, count = 0;
    int32_t n_layer = 0, history = 0, margin = 0;
    uint8_t hybrid = 0, recipe = 0;
    if (!get(bytes, pos, &magic) || magic != kStateMagic || !get(bytes, pos, &version) || version != kStateVersion)
        throw UserError(what + ": not an fp8 scaling state (or an unknown version)");
    if (!get(bytes, pos, &n_layer) || !get(bytes, pos, &hybrid) || !get(bytes, pos, &recipe) ||
        !get(bytes, pos, &history) || !get(bytes, pos, &margin) || !get(bytes, pos, &count))
        throw UserError(what + ": fp8 scaling state is truncated");
    const bool same = n_layer == n_layer_ && (hybrid != 0) == opt_.hybrid && recipe == (uint8_t)opt_.recipe &&
                      history == opt_.amax_history && margin == opt_.margin && count == scales_.size();
    if (!same)
        throw UserError(strfmt("%s: fp8 scaling state was written with n_layer=%d fp8.format=%s fp8.recipe=%s "
                               "fp8.amax_history=%d fp8.margin=%d; this run has n_layer=%d %s %s %d %d "
                               "(resume needs the same fp8 settings)",
                               what.c_str(), n_layer, hybrid ? "hybrid" : "e4m3", recipe ? "current" : "delayed",
                               history, margin, n_layer_, opt_.hybrid ? "hybrid" : "e4m3",
                               opt_.recipe == Fp8Recipe::Current ? "current" : "delayed", opt_.amax_history,
                               opt_.margin));
    std::vector<Fp8TensorScale> loaded = scales_;  // keeps formats; commit only when all of it reads
    for (auto& s : loaded)
        if (!s.load(bytes, pos)) throw UserError(what + ": fp8 scaling state is truncated or corrupt");
    if (pos != bytes.size()) throw UserError(what + ": fp8 scaling state has trailing bytes");
    scales_ = std::move(loaded);
}
