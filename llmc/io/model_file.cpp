#include "llmc/io/model_file.h"
#include "llmc/io/piece_file.h"
#include "llmc/precision/bf16.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

static void read_header(const std::string& path, int32_t* h) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw UserError(strfmt("model file %s: cannot open: %s", path.c_str(), std::strerror(errno)));
    size_t got = std::fread(h, sizeof(int32_t), 256, f);
    std::fclose(f);
    if (got != 256) throw UserError(strfmt("model file %s: truncated header", path.c_str()));
    if (h[0] != MODEL_FILE_MAGIC)
        throw UserError(strfmt("model file %s: bad magic %d (expected %d: not an llm.c model checkpoint)",
                               path.c_str(), h[0], MODEL_FILE_MAGIC));
    if (h[1] != 3 && h[1] != 5)
        throw UserError(strfmt("model file %s: unsupported version %d (expected 3 = fp32 or 5 = bf16)", path.c_str(),
                               h[1]));
}

ModelShape model_file_shape(const std::string& path, int* version) {
    int32_t h[256];
    read_header(path, h);
    ModelShape s;
    s.max_seq_len = h[2];
    s.vocab_size = h[3];
    s.n_layer = h[4];
    s.n_head = h[5];
    s.d_model = h[6];
    s.padded_vocab = h[7];
    const int big = 1 << 26;  // config_schema.cpp's kMaxModelDim: keeps the shape arithmetic defined
    if (s.max_seq_len <= 0 || s.vocab_size <= 0 || s.n_layer <= 0 || s.n_head <= 0 || s.d_model <= 0 ||
        s.padded_vocab < s.vocab_size || s.d_model % s.n_head != 0 || s.max_seq_len > big || s.vocab_size > big ||
        s.padded_vocab > big || s.n_layer > big || s.d_model > big)
        throw UserError(strfmt("model file %s: invalid shape in header (max_seq_len %d, vocab_size %d, n_layer %d, "
                               "n_head %d, d_model %d, padded_vocab %d)",
                               path.c_str(), s.max_seq_len, s.vocab_size, s.n_layer, s.n_head, s.d_model,
                               s.padded_vocab));
    if (h[8] == 1) {
        s.arch = Arch::Llama;
        s.n_kv_head = h[9];
        s.ffn_dim = h[10];
        s.tie_embeddings = h[11] != 0;
        std::memcpy(&s.rope_theta, &h[12], 4);
        std::memcpy(&s.norm_eps, &h[13], 4);
        if (s.n_kv_head <= 0 || s.n_head % s.n_kv_head != 0 || s.ffn_dim <= 0 || s.ffn_dim > big || !(s.rope_theta > 0) ||
            !(s.norm_eps > 0))
            throw UserError(strfmt("model file %s: invalid Llama shape in header (n_kv_head %d, ffn_dim %d)",
                                   path.c_str(), s.n_kv_head, s.ffn_dim));
    } else if (h[8] != 0) {
        throw UserError(strfmt("model file %s: unknown model family %d in header slot 8", path.c_str(), h[8]));
    }
    if (h[14] != 0) {
        s.moe.num_experts = h[14];
        s.moe.top_k = h[15];
        s.moe.expert_ffn_dim = h[16];
        s.moe.every = h[17];
        if (h[14] < 2 || h[14] > 4096 || h[15] < 1 || h[15] > h[14] || h[16] <= 0 || h[16] > big || h[17] < 1 ||
            h[17] > s.n_layer)  // (4096: config_schema.cpp's bound on model.moe.num_experts)
            throw UserError(strfmt("model file %s: invalid mixture-of-experts shape in header (num_experts %d, top_k "
                                   "%d, expert_ffn_dim %d, every %d)", path.c_str(), h[14], h[15], h[16], h[17]));
    }
    if (version) *version = h[1];
    return s;
}

namespace {

// Non-finite weights counted over a file read in pieces
struct NonFinite : NonFiniteCount {
    // UserError naming the file, the count and the first's tensor (its file-order name) and element
    void check(const ModelShape& shape, size_t n, const std::string& file) const {
        if (bad == 0) return;
        std::string tensor = "?";
        size_t offset = 0;
        for (const TensorDecl& d : model_tensors(shape)) {
            const bool per_layer = d.part == ModelPart::Layer;
            const size_t size = d.rows * d.cols, count = per_layer ? size_t(shape.n_layer) : 1;
            if (first < offset + size * count) {
                const size_t k = (first - offset) / size;
                tensor = (per_layer ? strfmt(d.name.c_str(), int(k)) : d.name) +
                         strfmt(" element %zu", first - offset - k * size);
                break;
            }
            offset += size * count;
        }
        throw UserError(strfmt("model file %s: %zu of %zu parameters are not finite (the first in tensor %s, %g): "
                               "not a usable model",
                               file.c_str(), bad, n, tensor.c_str(), double(value)));
    }
};

}  // namespace

void check_finite_weights(const std::vector<float>& w, const ModelShape& shape, const std::string& file) {
    NonFinite nf;
    nf.add(w.data(), w.size(), 0);
    nf.check(shape, w.size(), file);
}

ModelShape model_file_check(const std::string& path, const ModelShape* expect, int* version_out) {
    int version = 0;
    ModelShape s = model_file_shape(path, &version);
    if (expect) {
        const struct { const char* key; int file, cfg; } fields[] = {
            {"model.n_layer", s.n_layer, expect->n_layer},       {"model.n_head", s.n_head, expect->n_head},
            {"model.d_model", s.d_model, expect->d_model},       {"model.vocab_size", s.vocab_size, expect->vocab_size},
            {"model.max_seq_len", s.max_seq_len, expect->max_seq_len},
            {"padded vocab", s.padded_vocab, expect->padded_vocab},
            {"model.arch (0 = gpt2, 1 = llama)", int(s.arch), int(expect->arch)},
            {"model.n_kv_head", s.kv_heads(), expect->kv_heads()},
            {"model.ffn_dim", s.ffn(), expect->ffn()},
            {"model.tie_embeddings", int(s.tie_embeddings), int(expect->tie_embeddings)},
            {"model.moe.num_experts", s.moe.num_experts, expect->moe.num_experts},
            {"model.moe.top_k", s.moe.top_k, expect->moe.top_k},
            {"model.moe.expert_ffn_dim", s.moe.expert_ffn_dim, expect->moe.expert_ffn_dim},
            {"model.moe.every", s.moe.every, expect->moe.every}};
        for (const auto& f : fields)
            if (f.file != f.cfg)
                throw UserError(strfmt("model file %s: %s is %d in the file but %d in the config", path.c_str(), f.key,
                                       f.file, f.cfg));
        if (s.rope_theta != expect->rope_theta || s.norm_eps != expect->norm_eps)
            throw UserError(strfmt("model file %s: model.rope_theta / model.norm_eps are %g / %g in the file but %g / "
                                   "%g in the config", path.c_str(), s.rope_theta, s.norm_eps, expect->rope_theta,
                                   expect->norm_eps));
    }
    const size_t elem = version == 3 ? 4 : 2;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) throw UserError(strfmt("model file %s: cannot stat", path.c_str()));
    if (1024.0 + num_params_double(s) * double(elem) != double(st.st_size))  // before a count that could wrap
        throw UserError(strfmt("model file %s: %lld bytes, but its header describes %.6g parameters (truncated or "
                               "corrupt)",
                               path.c_str(), (long long)st.st_size, num_params_double(s)));
    const size_t n = num_params(s);
    const size_t want = 1024 + n * elem;
    if (size_t(st.st_size) != want)
        throw UserError(strfmt("model file %s: %lld bytes, but its header describes %zu parameters = %zu bytes "
                               "(truncated or corrupt)",
                               path.c_str(), (long long)st.st_size, n, want));
    if (version_out) *version_out = version;
    return s;
}

// model_file_read and model_file_scan: the file in pieces of 256K elements, each handed to bytes
// while it is in the cache, widened to fp32 into *whole (or, null, into a piece's buffer: nothing
// kept), and checked finite.
static void read_weights(const std::string& path, const ModelShape* expect,
                         const std::function<void(const void*, size_t)>& bytes, std::vector<float>* whole) {
    int version = 0;
    const ModelShape s = model_file_check(path, expect, &version);
    const size_t n = num_params(s), elem = version == 3 ? 4 : 2;
    if (whole) whole->resize(n);
    float* out = whole ? whole->data() : nullptr;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw UserError(strfmt("model file %s: cannot open", path.c_str()));
    char header[1024];
    bool ok = std::fread(header, 1, sizeof(header), f) == sizeof(header);
    if (ok && bytes) bytes(header, sizeof(header));
    const size_t piece = size_t(1) << 18;
    std::vector<uint16_t> tmp(version == 3 ? 0 : std::min(n, piece));
    std::vector<float> scratch(out ? 0 : std::min(n, piece));
    NonFinite nf;
    for (size_t at = 0; ok && at < n; at += piece) {
        const size_t k = std::min(piece, n - at);
        float* x = out ? out + at : scratch.data();
        void* dst = version == 3 ? static_cast<void*>(x) : static_cast<void*>(tmp.data());
        ok = std::fread(dst, elem, k, f) == k;
        if (!ok) break;
        if (bytes) bytes(dst, k * elem);
        if (version != 3)
            for (size_t i = 0; i < k; i++) x[i] = bf16_bits_to_f32(tmp[i]);
        nf.add(x, k, at);
    }
    std::fclose(f);
    if (!ok) throw UserError(strfmt("model file %s: read failed", path.c_str()));
    nf.check(s, n, path);
}

std::vector<float> model_file_read(const std::string& path, const ModelShape* expect,
                                   const std::function<void(const void*, size_t)>& bytes) {
    std::vector<float> out;
    read_weights(path, expect, bytes, &out);
    return out;
}

void model_file_scan(const std::string& path, const ModelShape* expect,
                     const std::function<void(const void*, size_t)>& bytes) {
    read_weights(path, expect, bytes, nullptr);
}

ReadFileOrder model_file_pieces(const std::string& path, const ModelShape* expect, std::shared_ptr<size_t> bytes_read) {
    int version = 0;
    const size_t n = num_params(model_file_check(path, expect, &version)), elem = version == 3 ? 4 : 2;
    return piece_array(
        std::make_shared<PieceFile>(path, "model file", bytes_read ? bytes_read : std::make_shared<size_t>(0)), 1024, n,
        elem);
}

void model_file_write(const std::string& path, const ModelShape& s, const ReadFileOrder& params, int version,
                      const std::function<void(const void*, size_t)>& bytes) {
    LLMC_ASSERT(version == 3 || version == 5, "model file version must be 3 or 5");
    int32_t h[256] = {0};
    h[0] = MODEL_FILE_MAGIC;
    h[1] = version;
    h[2] = s.max_seq_len;
    h[3] = s.vocab_size;
    h[4] = s.n_layer;
    h[5] = s.n_head;
    h[6] = s.d_model;
    h[7] = s.padded_vocab;
    if (s.arch == Arch::Llama) {
        h[8] = 1;
        h[9] = s.kv_heads();
        h[10] = s.ffn();
        h[11] = s.tie_embeddings ? 1 : 0;
        std::memcpy(&h[12], &s.rope_theta, 4);
        std::memcpy(&h[13], &s.norm_eps, 4);
    }
    if (s.moe.enabled()) {
        h[14] = s.moe.num_experts;
        h[15] = s.moe.top_k;
        h[16] = s.moe.expert_ffn_dim;
        h[17] = s.moe.every;
    }
    AtomicFile f(path);
    auto put = [&](const void* p, size_t n) {
        f.write(p, n);
        if (bytes) bytes(p, n);
    };
    put(h, sizeof(h));
    std::vector<uint16_t> half;
    for_each_chunk(params, num_params(s), [&](size_t, const float* x, size_t k) {
        if (version == 3) return put(x, k * sizeof(float));
        half.resize(k);
        for (size_t i = 0; i < k; i++) half[i] = f32_to_bf16_bits(x[i]);
        put(half.data(), k * sizeof(uint16_t));
    });
    f.commit();
}

void model_file_write(const std::string& path, const ModelShape& s, const float* params, int version,
                      const std::function<void(const void*, size_t)>& bytes) {
    model_file_write(path, s, [params](size_t first, size_t n, float* out) {
        std::memcpy(out, params + first, n * sizeof(float));
    }, version, bytes);
}
