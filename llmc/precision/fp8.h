// FP8 for the linear layers (precision "fp8"): the two formats, per-tensor scaling, and the
// scaling state of a model.
//
// Formats (OCP FP8):
//   E4M3 ("E4M3FN"): bias 7, 3 mantissa bits, no infinities, NaN = S.1111.111, max 448.
//   E5M2:            bias 15, 2 mantissa bits, IEEE-like (inf, NaN), max 57344.
// Encoding is what NVIDIA's cvt.rn.satfinite does: round to nearest, ties to even; finite
// overflow and +-inf saturate to +-max; NaN gives 0x7F. fp8_encode/fp8_decode are plain
// inline functions, host and device, so the CPU backend emulates the GPU's casts exactly.
//
// Scaling. A tensor x is cast as code = encode(x * s); the GEMM multiplies the decoded codes
// and dequantizes with 1/s. The CPU backend's quantize-dequantize is
//   q(x) = decode(encode(x * s)) * (1/s)        (fp32 arithmetic, 1/s rounded to fp32)
// with  s = fp8_max / amax / 2^margin  (fp8_scale_from_amax). amax = max|x| of the unscaled
// tensor. Two recipes:
//   delayed: s comes from the history of the amaxes of the last `amax_history` optimizer steps
//            (Fp8TensorScale below); the op only records this step's amax. The first step has
//            no history and casts with s = 1 (values beyond the format's max saturate).
//   current: the op computes amax of the tensor itself right before the cast and uses it.
//
// How the model uses it (one optimizer step):
//   1. zero the backend float array of Fp8State::size() amaxes;
//   2. for every linear layer call Ops::matmul_forward_fp8 / matmul_backward_fp8 with
//      state.cast(layer, linear, operand, amax_array) for each of its operands (the forward's
//      Input and Weight casts, the backward's GradOutput cast plus the same Input and Weight
//      casts again; micro-steps max-combine into the same array);
//   3. after the step, advance every tensor's scale from its amax: in the trainer on the backend
//      (Ops::fp8_update_scales over the state's device image, Fp8Device: no host round trip, so
//      an fp8 step waits for the device once, as any step, and a CUDA graph can hold it); on the
//      host, state.update(host_amaxes), the same arithmetic (fp8_update_one). Both count the
//      non-finite amaxes (overflow events, to log).
//   Checkpoints store state.save() (after export of the device image) and restore it with
//   load(): resume is bit-exact.
#pragma once
#include <math.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define FP8_HD __host__ __device__
#else
#define FP8_HD
#endif

enum class Fp8Format : uint8_t { E4M3 = 0, E5M2 = 1 };
enum class Fp8Recipe : uint8_t { Delayed = 0, Current = 1 };

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;
constexpr uint8_t kFp8NaN = 0x7F;  // the NaN code both encoders produce (a NaN in either format)

FP8_HD inline float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? kFp8E4M3Max : kFp8E5M2Max; }
inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

// Bits of a float and back (host and device).
FP8_HD inline uint32_t fp8_float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
#endif
}
FP8_HD inline float fp8_bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, 4);
    return x;
#endif
}
// max|x| as the ops record it: the maximum of the float bits of |x| read as unsigned
// integers. For non-negative floats that order is the numeric order, and it ranks NaN above
// inf above every finite value, so one NaN or inf in a tensor makes its amax non-finite
// (plain fmax would drop NaN). Deterministic in any reduction order.
FP8_HD inline uint32_t fp8_abs_bits(float x) { return fp8_float_bits(x) & 0x7FFFFFFFu; }
FP8_HD inline bool fp8_is_finite(float x) { return fp8_abs_bits(x) < 0x7F800000u; }

// Round to nearest even, saturating (see the file comment). Works for every float32 input,
// float32 denormals included. (C math functions: they exist on the device too.)
FP8_HD inline uint8_t fp8_encode(float x, Fp8Format f) {
    const uint32_t ax_bits = fp8_abs_bits(x);
    if (ax_bits > 0x7F800000u) return kFp8NaN;
    const int M = f == Fp8Format::E4M3 ? 3 : 2;   // mantissa bits
    const int B = f == Fp8Format::E4M3 ? 7 : 15;  // exponent bias
    const int max_code = f == Fp8Format::E4M3 ? 0x7E : 0x7B;
    const uint8_t sign = (fp8_float_bits(x) >> 24) & 0x80;
    const float a = fp8_bits_to_float(ax_bits);
    if (a >= fp8_max(f)) return sign | (uint8_t)max_code;  // also +-inf
    if (a == 0.0f) return sign;
    // Quantum of a's binade, or of the subnormal range below 2^(1-B): a / q is exact (power of
    // two) and r = rne(a / q) counts quanta. r may reach 2^(M+1) (a carry into the next binade)
    // or 2^M in the subnormal range (the smallest normal): code = ((e + B - 1) << M) + r covers
    // both without a special case.
    int e = ilogbf(a);
    if (e < 1 - B) e = 1 - B;
    const float r = nearbyintf(ldexpf(a, M - e));  // default rounding mode: ties to even
    int code = ((e + B - 1) << M) + (int)r;
    if (code > max_code) code = max_code;  // rounded past max (E4M3: onto the NaN code)
    return sign | (uint8_t)code;
}

FP8_HD inline float fp8_decode(uint8_t c, Fp8Format f) {
    const int M = f == Fp8Format::E4M3 ? 3 : 2;
    const int B = f == Fp8Format::E4M3 ? 7 : 15;
    const float sign = (c & 0x80) ? -1.0f : 1.0f;
    const int e = (c & 0x7F) >> M, m = c & ((1 << M) - 1);
    if (f == Fp8Format::E4M3 && (c & 0x7F) == 0x7F) return NAN;
    if (f == Fp8Format::E5M2 && e == 31) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexpf((float)m, 1 - B - M);
    return sign * ldexpf((float)((1 << M) + m), e - B - M);
}

// decode(encode(x * s)) * inv_s: the value the fp8 GEMM sees for x (inv_s = 1/s in fp32).
FP8_HD inline float fp8_quantize(float x, float s, float inv_s, Fp8Format f) {
    return fp8_decode(fp8_encode(x * s, f), f) * inv_s;
}

// s = fp8_max / amax / 2^margin, in fp32 (one division, then an exact power of two). When
// amax is 0 (a tensor of zeros), not finite (overflow, NaN), or the result is not a finite
// positive number, there is nothing to learn from it: `fallback` (the previous scale).
FP8_HD inline float fp8_scale_from_amax(float amax, Fp8Format f, int margin, float fallback) {
    if (!(amax > 0.0f) || !fp8_is_finite(amax)) return fallback;
    const float s = ldexpf(fp8_max(f) / amax, -margin);
    return (fp8_is_finite(s) && s > 0.0f) ? s : fallback;
}

// One tensor's step of the scaling state: `amax` is the step's (max over its micro-steps, in the
// fp8_abs_bits order). Not finite: nothing changes, false (an overflow event). Current recipe
// (history 0): scale = fp8_scale_from_amax(amax, ..., scale). Delayed: hist (the last `history`
// step amaxes, oldest first) drops its oldest and appends amax; scale = fp8_scale_from_amax(the
// largest of hist, ..., scale). Host and device run this same function: the same bits.
FP8_HD inline bool fp8_update_one(float amax, float* scale, float* hist, int history, Fp8Format f, int margin) {
    if (!fp8_is_finite(amax)) return false;
    float m = amax;
    for (int k = 0; k + 1 < history; ++k) {
        hist[k] = hist[k + 1];
        m = hist[k] > m ? hist[k] : m;
    }
    if (history > 0) hist[history - 1] = amax;
    *scale = fp8_scale_from_amax(m, f, margin, *scale);
    return true;
}

// The format of tensor `index` of a model's state (Fp8State::index): E5M2 for output gradients
// under the hybrid format, else E4M3.
FP8_HD inline Fp8Format fp8_format_of(int index, bool hybrid) {
    return hybrid && index % 3 == 2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
}

// How an op casts one operand (see Ops::matmul_forward_fp8 in llmc/backend/ops.h).
struct Fp8Cast {
    Fp8Format format = Fp8Format::E4M3;
    float scale = 1.0f;     // delayed: the scale s; current: the fallback when the tensor's amax is 0 / non-finite
    // backend memory holding `scale` instead (nullptr: the value above), read when the op runs:
    // the trainer's casts read the state's device image, so a queued or graphed step sees the
    // scale of its own time and the host passes no per-step value
    const float* scale_at = nullptr;
    // with scale_at, the delayed recipe: 1/scale there too (16-byte aligned: it is a cuBLASLt scale
    // pointer, llmc/cuda/fp8_rules.h rule 11), so that the op computes neither (CUDA: no scale kernel)
    const float* inv_at = nullptr;
    bool current = false;   // current recipe: s = fp8_scale_from_amax(this tensor's amax, format, margin, scale)
    int margin = 0;         // used by the current recipe (the delayed scale already includes it)
    float* amax = nullptr;  // backend memory, or nullptr: *amax = max(*amax, max|x|), ordered as fp8_abs_bits
    // the operand is gelu_tanh of the tensor given (a GELU's pre-activation), computed in fp32 in
    // the cast: the model keeps no GELU output for fp8's fc_proj (Ops "fp8")
    bool gelu = false;
};

// Where an fp8 linear's forward leaves its input's transposed cast for the backward (the fp8
// tensor cores take only the "TN" form, so the weight gradient's GEMM reads the input transposed:
// the forward writes it beside the plain copy it casts anyway, and the backward casts the input
// no more). Backend memory the model keeps with the layer's activations: qT rows x cols bytes of
// codes, inv one float (1/s; 16-byte aligned: a cuBLASLt scale pointer). Empty (qT nullptr): none.
// The CPU backend keeps none (it casts again: the same values).
struct Fp8Stash {
    void* qT = nullptr;
    float* inv = nullptr;
};

// Fp8Device::inv's stride: one 16-byte aligned float a tensor (cuBLASLt's scale pointers)
constexpr int kFp8InvStride = 4;

// A model's scaling state in backend memory (the trainer's fp8 converter owns it; Fp8State
// exports to and imports from it): n tensors in Fp8State::index order.
struct Fp8Device {
    int n = 0;
    int history = 0;  // hist floats per tensor (the delayed recipe's amax_history; 0: current)
    int margin = 0;
    bool hybrid = true;  // formats: fp8_format_of(i, hybrid)
    float* amax = nullptr;         // [n] the step's amaxes, recorded by the ops (fp8_abs_bits order)
    float* scale = nullptr;        // [n] the casts' scales (Fp8Cast::scale_at)
    float* inv = nullptr;          // [n * kFp8InvStride] 1 / scale, every kFp8InvStride floats
    float* hist = nullptr;         // [n * history] each tensor's last amaxes, oldest first
    uint32_t* overflows = nullptr; // [n] overflow events since the image was imported
    double* wide = nullptr;        // [n] the amaxes' fp8_abs_bits as doubles, for a reduction over ranks
};

// Tensor i's step of an Fp8Device (Ops::fp8_update_scales; host and device alike): its amax (the
// reduced one in `wide` when from_wide), fp8_update_one, 1/scale beside the scale, and an
// overflow event counted on a non-finite amax (false).
FP8_HD inline bool fp8_device_step(const Fp8Device& d, int i, bool from_wide) {
    const float a = from_wide ? fp8_bits_to_float((uint32_t)d.wide[i]) : d.amax[i];
    const bool ok = fp8_update_one(a, d.scale + i, d.hist + (size_t)i * d.history, d.history,
                                   fp8_format_of(i, d.hybrid), d.margin);
    d.inv[(size_t)i * kFp8InvStride] = 1.0f / d.scale[i];
    if (!ok) d.overflows[i] += 1;
    return ok;
}

// An Fp8Device in one backend block of fp8_device_bytes(n, history): inv first (16-byte aligned
// where the block is), then the image: scale, hist, overflows (fp8_image_floats floats, what an
// upload writes after inv and a checkpoint reads back), then amax, then wide (8-byte aligned).
inline size_t fp8_image_floats(int n, int history) { return size_t(n) * (history + 2); }
size_t fp8_device_bytes(int n, int history);
Fp8Device fp8_device_in(void* block, int n, int history, int margin, bool hybrid);

// ---- host-side scaling state ----

// The scale of one tensor. Delayed: the last `history` step amaxes, oldest first (zeros at
// first); after each step's update, s = fp8_scale_from_amax(max of them), kept when that max is
// 0. A non-finite amax does not enter the history, keeps s and counts as an overflow event.
// Current: the op computes s itself; update() keeps the last good s as the op's fallback.
class Fp8TensorScale {
public:
    Fp8TensorScale() = default;
    Fp8TensorScale(Fp8Format format, Fp8Recipe recipe, int history, int margin);

    float scale() const { return scale_; }
    Fp8Format format() const { return format_; }
    // The cast an op needs for this tensor this step, recording into `amax` (may be nullptr).
    Fp8Cast cast(float* amax) const;
    // End of an optimizer step: the step's amax (max over its micro-steps). Returns false
    // (and counts an overflow event) when amax is not finite.
    bool update(float amax);

    uint64_t overflow_events() const { return overflows_; }
    const std::vector<float>& history() const { return history_; }  // oldest first
    // This tensor's part of the device image (Fp8Device), and back (adding `overflows` events).
    void export_to(float* scale, float* hist) const;
    void import_from(float scale, const float* hist, uint64_t overflows);

    void save(std::vector<uint8_t>& out) const;
    // Reads what save() wrote at `pos` (advancing it); false on a size/shape mismatch.
    bool load(const std::vector<uint8_t>& in, size_t& pos);

private:
    Fp8Format format_ = Fp8Format::E4M3;
    Fp8Recipe recipe_ = Fp8Recipe::Delayed;
    int margin_ = 0;
    float scale_ = 1.0f;
    std::vector<float> history_;  // delayed only; size `history`, oldest first
    uint64_t overflows_ = 0;
};

// The four linear layers of a GPT-2 block and the three cast operands of each.
enum class Fp8Linear : int { Qkv = 0, AttnProj = 1, Fc = 2, FcProj = 3 };
enum class Fp8Operand : int { Input = 0, Weight = 1, GradOutput = 2 };

struct Fp8Options {
    bool hybrid = true;  // true: E5M2 for output gradients; false ("e4m3"): E4M3 everywhere
    Fp8Recipe recipe = Fp8Recipe::Delayed;
    int amax_history = 16;
    int margin = 0;
};
struct Fp8Config;
// From the config's fp8.* keys; throws UserError on a value it does not know.
Fp8Options fp8_options(const Fp8Config& cfg);

// Every scale of a model: n_layer x 4 linears x 3 operands. Index of a tensor:
//   ((layer * 4 + linear) * 3 + operand)  -- also its slot in the backend amax array.
class Fp8State {
public:
    static constexpr int kLinears = 4, kOperands = 3;

    Fp8State(int n_layer, const Fp8Options& opt);

    int n_layer() const { return n_layer_; }
    int size() const { return (int)scales_.size(); }  // floats in the backend amax array
    static int index(int layer, Fp8Linear lin, Fp8Operand op) {
        return (layer * kLinears + (int)lin) * kOperands + (int)op;
    }
    const Fp8TensorScale& scale(int layer, Fp8Linear lin, Fp8Operand op) const {
        return scales_[index(layer, lin, op)];
    }
    // The cast for one operand this step; amax_array = the backend array of size() floats
    // (nullptr: record nothing); scale_array (may be nullptr: this state's own scales) = the
    // device image's scales (Fp8Device::scale), which the op then reads.
    // inv_array (may be nullptr): the image's 1/scale (Fp8Device::inv), given to delayed casts.
    Fp8Cast cast(int layer, Fp8Linear lin, Fp8Operand op, float* amax_array, const float* scale_array = nullptr,
                 const float* inv_array = nullptr) const;
    // Once per optimizer step, with the host copy of the amax array (size() floats).
    // Returns the number of non-finite amaxes (overflow events) in this update.
    int update(const float* amaxes);
    uint64_t overflow_events() const;  // since the start of training (saved in checkpoints)

    // The device image (Fp8Device) in host arrays: scale[size()], hist[size() * history] (history
    // = the delayed recipe's amax_history, else 0); import adds the image's overflow counters.
    int image_history() const { return opt_.recipe == Fp8Recipe::Delayed ? opt_.amax_history : 0; }
    void export_image(float* scale, float* hist) const;
    void import_image(const float* scale, const float* hist, const uint32_t* overflows);

    // Bit-exact serialisation: the options, then every tensor's scale, ring and counter.
    std::vector<uint8_t> save() const;
    // Throws UserError (naming `what`, e.g. the checkpoint file) when the bytes are not an
    // Fp8State or were written with other fp8 settings or another number of layers.
    void load(const std::vector<uint8_t>& bytes, const std::string& what);

private:
    int n_layer_;
    Fp8Options opt_;
    std::vector<Fp8TensorScale> scales_;
};
