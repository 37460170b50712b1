// The converters of llmc/train/converter.h: none (fp32, bf16) and FP8 linears.
#include <cmath>

#include "llmc/train/converter.h"
#include "llmc/precision/fp8.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/layout.h"

namespace {

// fp32 / bf16: the model computes as built.
class NoConverter : public ModelConverter {
public:
    explicit NoConverter(std::string precision) : precision_(std::move(precision)) {}
    std::string describe() const override { return precision_; }
    void apply(Model&) override {}
    void load(const std::vector<uint8_t>& fp8, const std::string& from, Logger& log) override {
        if (!fp8.empty())
            log.print("note: %s holds an fp8 scaling state; precision \"%s\" does not use it\n", from.c_str(),
                      precision_.c_str());
    }

private:
    std::string precision_;
};

// FP8 linears. Every rank holds the whole model's scaling state, on the backend (Fp8Device: the
// amaxes that the block linears of its own layers and shards record into, the scales the casts
// read, the amax histories; Model::set_fp8), and its host image Fp8State for checkpoints. Once per
// optimizer step the amaxes of all ranks are max-reduced over the WORLD: data-parallel replicas
// must cast with identical scales (else their weights drift apart), the TP shards of one tensor
// each see only part of it, and pipeline stages own different layers. Every rank then advances
// the same state on its backend (Ops::fp8_update_scales): no host round trip in a step, so an
// fp8 step waits for the device once, and a CUDA graph can hold it.
class Fp8Converter : public ModelConverter {
public:
    Fp8Converter(const Config& cfg, Ops& ops, int tp, const std::string& device, DType rest)
        : ops_(ops), opt_(fp8_options(cfg.fp8)), state_(cfg.model.n_layer, opt_), device_(device), rest_(rest) {
        std::string why;
        if (!ops.fp8_supported(&why)) throw UserError("precision: fp8 cannot run on this device: " + why);
        const long k = ops.fp8_dim_multiple(), C = cfg.model.d_model, Cl = C / tp;
        auto need = [&](long v, const std::string& what, const char* keys) {
            if (v % k != 0)
                throw UserError(strfmt("precision: fp8 on %s needs every linear layer dimension to be a multiple of "
                                       "%ld, but %s = %ld is not (change %s)",
                                       device.c_str(), k, what.c_str(), v, keys));
        };
        need(long(cfg.train.micro_batch) * cfg.train.seq_len,
             strfmt("train.micro_batch x train.seq_len = %d x %d", cfg.train.micro_batch, cfg.train.seq_len),
             "train.micro_batch or train.seq_len");
        need(C, "model.d_model", "model.d_model");
        // the local widths of the TP shards: the QKV and up projections' outputs, the attention and
        // down projections' inputs
        const ModelShape s = model_shape(cfg.model);
        const long qkv = long(s.n_head + 2 * s.kv_heads()) * s.head_dim() / tp, F = s.ffn() / tp;
        need(qkv, strfmt("(n_head + 2 n_kv_head) x head_dim / parallel.tp = %ld", qkv), "model.d_model or parallel.tp");
        need(Cl, strfmt("model.d_model / parallel.tp = %ld / %d", C, tp), "model.d_model or parallel.tp");
        need(F, strfmt("the MLP width / parallel.tp = %d / %d", s.ffn(), tp), "model.ffn_dim or parallel.tp");
        const int n = state_.size(), H = state_.image_history();
        block_ = ops.alloc(fp8_device_bytes(n, H));
        dev_ = fp8_device_in(block_, n, H, opt_.margin, opt_.hybrid);
        upload(state_);
    }
    ~Fp8Converter() override { ops_.release(block_); }
    Fp8Converter(const Fp8Converter&) = delete;
    Fp8Converter& operator=(const Fp8Converter&) = delete;

    // "fp8: linears fp8 (e4m3/e5m2, delayed, history 16, margin 0), rest fp32 (fp8 emulated exactly on the CPU)"
    std::string describe() const override {
        const bool delayed = opt_.recipe == Fp8Recipe::Delayed;
        return strfmt("fp8: linears fp8 (e4m3/%s, %s%s, margin %d), rest %s%s", opt_.hybrid ? "e5m2" : "e4m3",
                      delayed ? "delayed" : "current", delayed ? strfmt(", history %d", opt_.amax_history).c_str() : "",
                      opt_.margin, dtype_name(rest_), device_ == "cpu" ? " (fp8 emulated exactly on the CPU)" : "");
    }
    void apply(Model& model) override { model.set_fp8(&state_, dev_.amax, dev_.scale, dev_.inv); }
    std::vector<MemoryRow> memory_rows() const override {
        return {{"fp8 scaling", fp8_device_bytes(dev_.n, dev_.history),
                 strfmt("  (%d layers x 4 linears x 3 operands: amaxes, scales%s)", state_.size() / 12,
                        dev_.history ? strfmt(", %d-step amax histories", dev_.history).c_str() : "")}};
    }
    std::string params_note() const override { return "; block linears compute in fp8"; }

    // Forget the amaxes of the last step (and of evaluation passes).
    void begin_step() override { ops_.zero(Tensor(dev_.amax, size_t(dev_.n), DType::F32)); }

    // The amaxes of all ranks, max-reduced, advance the scales on the backend. The reduction runs
    // on the float bit patterns, as integers held exactly in doubles: non-negative floats order as
    // their bits do, with inf above every finite value and NaN above inf (fp8_abs_bits, the order
    // the ops record in), so the maximum is exact, independent of the reduction order, and a NaN
    // or inf amax on any rank stays non-finite. A float MAX would not promise that: MPI_MAX
    // compares with NaN false both ways and may drop it.
    void end_step(Comm& world, float* word) override {
        const bool reduce = world.size() > 1;
        if (reduce) {
            ops_.fp8_widen_amaxes(dev_);
            reduce_backend_doubles(ops_, world, dev_.wide, size_t(dev_.n), ReduceOp::Max);
        }
        ops_.fp8_update_scales(dev_, reduce, word);
    }
    // Overflow events (non-finite amaxes, whose scales are kept) are reported.
    void log_step(float word, nlohmann::json& record, std::string& line) override {
        const int overflows = int(word);
        record["fp8_overflows"] = overflows;
        line += overflows ? strfmt(" | fp8 linears: %d overflow event%s (non-finite amax, scale kept)", overflows,
                                   overflows == 1 ? "" : "s")
                          : std::string(" | fp8 linears");
    }

    // The host state advanced by the backend's overflow counts, scales and histories (a read back:
    // checkpoints only)
    void save(std::vector<uint8_t>& fp8) const override {
        std::vector<float> img(fp8_image_floats(dev_.n, dev_.history));
        ops_.to_host_bytes(img.data(), dev_.scale, img.size() * sizeof(float));
        Fp8State now = state_;
        const size_t n = size_t(dev_.n);  // the image: scale[n], hist[n H], overflows[n] (fp8_device_in)
        now.import_image(img.data(), img.data() + n,
                         reinterpret_cast<const uint32_t*>(img.data() + n * (dev_.history + 1)));
        fp8 = now.save();
    }
    // The scaling state resumes with the weights (bit-exact). A checkpoint of another precision
    // continues with a fresh state, with a note; other fp8.* settings than the checkpoint's are
    // an error (Fp8State::load).
    void load(const std::vector<uint8_t>& fp8, const std::string& from, Logger& log) override {
        if (!fp8.empty()) {
            state_.load(fp8, from + "/state.bin");
            upload(state_);
        } else {
            log.print("note: %s holds no fp8 scaling state (saved with another precision): fp8 starts with fresh "
                      "scales\n", from.c_str());
        }
    }

private:
    // the backend's image := s's scales and histories (and 1/scale), its overflow counters 0 (s keeps
    // the count so far)
    void upload(const Fp8State& s) {
        const size_t n = size_t(dev_.n);
        std::vector<float> img(n * kFp8InvStride + fp8_image_floats(dev_.n, dev_.history), 0.0f);
        float* im = img.data() + n * kFp8InvStride;  // (the image follows inv: fp8_device_in)
        s.export_image(im, im + n);
        for (size_t i = 0; i < n; i++) img[i * kFp8InvStride] = 1.0f / im[i];  // as fp8_update_scales writes it
        ops_.from_host_bytes(dev_.inv, img.data(), img.size() * sizeof(float));
    }
    Ops& ops_;
    Fp8Options opt_;
    Fp8State state_;  // the host image: what checkpoints hold up to the overflows counted since
    std::string device_;
    DType rest_;
    void* block_ = nullptr;  // dev_'s (fp8_device_in)
    Fp8Device dev_;
};

}  // namespace

std::unique_ptr<ModelConverter> make_model_converter(const Config& cfg, Ops& ops, int tp, const std::string& device,
                                                     DType dtype) {
    if (cfg.precision == "fp8") return std::unique_ptr<ModelConverter>(new Fp8Converter(cfg, ops, tp, device, dtype));
    return std::unique_ptr<ModelConverter>(new NoConverter(cfg.precision));
}
