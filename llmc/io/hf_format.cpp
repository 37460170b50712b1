#include "llmc/io/hf_format.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/io/model_file.h"
#include "llmc/io/safetensors.h"

namespace {

// One whole tensor: its name in the file, its shape in memory ([rows, cols], vocabulary rows
// padded) and in the file (vocabulary rows unpadded; transposed for hf_transposed), and where
// it starts in the whole-model vector.
struct HfTensor {
    std::string name;
    size_t rows, cols, file_rows, offset;
    bool transposed;
    Role role;
    std::vector<int64_t> file_shape() const {
        if (cols == 1) return {int64_t(file_rows)};
        if (transposed) return {int64_t(cols), int64_t(file_rows)};
        return {int64_t(file_rows), int64_t(cols)};
    }
};

std::vector<HfTensor> hf_tensors(const ModelShape& s) {
    std::vector<HfTensor> out;
    size_t off = 0;
    for (const TensorDecl& d : model_tensors(s)) {
        const size_t file_rows = d.split == TpSplit::Vocab ? size_t(s.vocab_size) : d.rows;
        const std::string& pattern = d.hf_name.empty() ? d.name : d.hf_name;
        LLMC_ASSERT(!d.hf_transposed || d.split != TpSplit::Vocab, "hf_tensors: a vocabulary tensor is not transposed");
        for (const auto& at : decl_instances(s, d)) {
            out.push_back({instance_name(pattern, at.first, at.second), d.rows, d.cols, file_rows, off,
                           d.hf_transposed && d.cols > 1, d.role});
            off += d.rows * d.cols;
        }
    }
    LLMC_ASSERT(off == num_params(s), "hf_tensors: the declarations do not cover the model");
    return out;
}

std::string shape_str(const std::vector<int64_t>& sh) {
    std::string r = "[";
    for (size_t i = 0; i < sh.size(); i++) r += (i ? ", " : "") + std::to_string(sh[i]);
    return r + "]";
}

bool ends_with(const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// Buffers that transformers may save beside the weights and that hold no parameters: Llama's
// rotary inv_freq, GPT-2's causal mask (attn.bias) and its masked_bias constant.
bool is_buffer(const std::string& n) {
    return ends_with(n, "rotary_emb.inv_freq") || ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias");
}

// A non-finite weight named as the file names it (its tensor and element in the file's order),
// where the user can find it.
void check_finite(const std::vector<float>& v, const char* path, const std::string& name) {
    NonFiniteCount c;
    c.add(v.data(), v.size());
    if (c.bad == 0) return;
    throw UserError(strfmt("safetensors file %s: tensor %s: %zu of its %zu elements are not finite (the first at "
                           "element %zu, %g): not a usable model",
                           path, name.c_str(), c.bad, v.size(), c.first, double(c.value)));
}

}  // namespace

namespace {

// The tensors of one safetensors file, or of the shards that a transformers index names
// (model.safetensors.index.json: {"metadata": ..., "weight_map": {tensor: shard file}}, the shards
// beside it, as from_pretrained writes a model past its max_shard_size). The index and the shards
// must agree: every tensor it lists is in its shard, every shard's tensor is listed there.
class HfFiles {
public:
    explicit HfFiles(const std::string& path);
    const std::string& path() const { return path_; }
    bool has(const std::string& n) const { return where_.count(n) != 0; }
    const SafetensorsEntry& entry(const std::string& n) const { return file(n).entry(n); }
    std::vector<float> read(const std::string& n) const { return file(n).read(n); }
    void read_range(const std::string& n, size_t first, size_t k, float* out) const {
        file(n).read_range(n, first, k, out);
    }
    // every tensor's name, in order
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        for (const auto& kv : where_) out.push_back(kv.first);
        return out;
    }

private:
    const SafetensorsReader& file(const std::string& n) const {
        const auto it = where_.find(n);
        if (it == where_.end()) throw UserError(strfmt("safetensors file %s: has no tensor %s", path_.c_str(), n.c_str()));
        return files_[it->second];
    }
    std::string path_;
    std::vector<SafetensorsReader> files_;
    std::map<std::string, size_t> where_;  // tensor -> its file in files_
};

HfFiles::HfFiles(const std::string& path) : path_(path) {
    if (!ends_with(path, ".index.json")) {
        files_.emplace_back(path);
        for (const auto& kv : files_[0].entries()) where_[kv.first] = 0;
        return;
    }
    const char* p = path.c_str();
    std::ifstream in(path);
    if (!in) throw UserError(strfmt("safetensors index %s: cannot open", p));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const std::exception&) {
        throw UserError(strfmt("safetensors index %s: not valid JSON", p));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
        throw UserError(strfmt("safetensors index %s: has no \"weight_map\" of tensor names to shard files (not a "
                               "transformers model.safetensors.index.json?)", p));
    const std::string dir = path.substr(0, path.find_last_of('/') + 1);
    std::map<std::string, size_t> shard;  // a shard's file name -> files_
    for (const auto& kv : j["weight_map"].items()) {
        const nlohmann::json& f = kv.value();
        if (!f.is_string() || f.get<std::string>().empty() || f.get<std::string>().find('/') != std::string::npos)
            throw UserError(strfmt("safetensors index %s: weight_map[\"%s\"] is %s, not the name of a shard file "
                                   "beside the index", p, kv.key().c_str(), f.dump().c_str()));
        auto it = shard.find(f.get<std::string>());
        if (it == shard.end()) {
            files_.emplace_back(dir + f.get<std::string>());  // (its own errors name the shard)
            it = shard.emplace(f.get<std::string>(), files_.size() - 1).first;
        }
        if (!files_[it->second].has(kv.key()))
            throw UserError(strfmt("safetensors index %s: places tensor %s in %s, which has no such tensor", p,
                                   kv.key().c_str(), files_[it->second].path().c_str()));
        where_[kv.key()] = it->second;
    }
    for (size_t i = 0; i < files_.size(); i++)
        for (const auto& kv : files_[i].entries()) {
            const auto w = where_.find(kv.first);
            if (w == where_.end() || w->second != i)
                throw UserError(strfmt("safetensors file %s: holds tensor %s, which the index %s %s",
                                       files_[i].path().c_str(), kv.first.c_str(), p,
                                       w == where_.end() ? "does not list"
                                                         : ("places in " + files_[w->second].path()).c_str()));
        }
}

}  // namespace

bool is_safetensors(const std::string& path) {
    const std::string ext = ".safetensors";  // (after a name: the extension alone names no file of ours)
    return path.size() > ext.size() && (ends_with(path, ext) || ends_with(path, ext + ".index.json"));
}

namespace {

// shape's declared tensors as the file r names them (without the base model's prefix in a file of
// transformers' base model: GPT2Model, LlamaModel; the Hub's gpt2 is one), each checked present
// and of its shape: UserError naming the file and the tensor.
std::vector<HfTensor> file_tensors(const HfFiles& r, const ModelShape& shape) {
    const char* p = r.path().c_str();
    std::vector<HfTensor> tensors = hf_tensors(shape);
    // the base model's prefix: the first component of the token embedding's name
    const std::string& emb = tensors[0].name;
    LLMC_ASSERT(tensors[0].role == TokEmb, "hf_read_weights: the token embedding comes first");
    const std::string prefix = emb.substr(0, emb.find('.') + 1);
    if (!prefix.empty() && !r.has(emb) && r.has(emb.substr(prefix.size())))
        for (HfTensor& t : tensors)
            if (t.name.compare(0, prefix.size(), prefix) == 0) t.name.erase(0, prefix.size());
    for (const HfTensor& t : tensors) {
        if (!r.has(t.name)) throw UserError(strfmt("safetensors file %s: has no tensor %s (model.arch \"%s\")", p,
                                                   t.name.c_str(), arch_name(shape.arch)));
        const std::vector<int64_t> want = t.file_shape();
        if (r.entry(t.name).shape != want)
            throw UserError(strfmt("safetensors file %s: tensor %s has shape %s, but the config's model needs %s", p,
                                   t.name.c_str(), shape_str(r.entry(t.name).shape).c_str(), shape_str(want).c_str()));
    }
    return tensors;
}

// hf_read_weights into *whole (zero-filled, num_params), or (null) its checks alone, a tensor at a time
void read_weights(const std::string& path, const ModelShape& shape, std::vector<float>* whole) {
    const HfFiles r(path);
    const char* p = path.c_str();
    const std::vector<HfTensor> tensors = file_tensors(r, shape);
    const HfTensor* tok_emb = nullptr;
    for (const HfTensor& t : tensors) {
        const std::vector<float> v = r.read(t.name);
        check_finite(v, p, t.name);
        if (t.role == TokEmb) tok_emb = &t;
        if (!whole) continue;
        float* dst = whole->data() + t.offset;
        if (!t.transposed) {
            std::copy(v.begin(), v.end(), dst);
        } else {  // the file's [cols, rows] element (c, i) is our (i, c)
            for (size_t c = 0; c < t.cols; c++)
                for (size_t i = 0; i < t.rows; i++) dst[i * t.cols + c] = v[c * t.rows + i];
        }
    }
    for (const std::string& n : r.names()) {
        bool known = false;
        for (const HfTensor& t : tensors) known = known || t.name == n;
        if (known || is_buffer(n)) continue;
        if (n == "lm_head.weight" && shape.tie_embeddings) {
            // a tied head saved beside the embedding (transformers may write both) must equal it
            LLMC_ASSERT(tok_emb != nullptr, "hf_read_weights: no token embedding declared");
            if (r.entry(n).shape == tok_emb->file_shape() && r.read(n) == r.read(tok_emb->name)) continue;
            throw UserError(strfmt("safetensors file %s: has an lm_head.weight that differs from %s, but the model's "
                                   "head is tied to the embedding (the head would be ignored)%s",
                                   p, tok_emb->name.c_str(),
                                   shape.arch == Arch::Llama ? "; set model.tie_embeddings: false" : ""));
        }
        throw UserError(strfmt("safetensors file %s: tensor %s is not part of a %s model of this shape", p, n.c_str(),
                               arch_name(shape.arch)));
    }
}

}  // namespace

std::vector<float> hf_read_weights(const std::string& path, const ModelShape& shape) {
    std::vector<float> whole(num_params(shape), 0.0f);
    read_weights(path, shape, &whole);
    return whole;
}

void hf_check_weights(const std::string& path, const ModelShape& shape) { read_weights(path, shape, nullptr); }

ReadFileOrder hf_weights_pieces(const std::string& path, const ModelShape& shape) {
    auto r = std::make_shared<const HfFiles>(path);
    auto tensors = std::make_shared<const std::vector<HfTensor>>(file_tensors(*r, shape));
    const size_t total = num_params(shape);
    return [r, tensors, total](size_t first, size_t n, float* out) {
        LLMC_ASSERT(first <= total && n <= total - first, "a read past the end of a safetensors file's weights");
        // the tensors lie in file order, each from its offset: the last that starts at or before first
        auto it = std::upper_bound(tensors->begin(), tensors->end(), first,
                                   [](size_t x, const HfTensor& t) { return x < t.offset; });
        std::vector<float> cols;
        for (size_t done = 0; done < n; ++it) {
            LLMC_ASSERT(it != tensors->begin(), "hf_weights_pieces: no tensor at the window");
            const HfTensor& t = *(it - 1);
            const size_t at = first + done - t.offset;  // in the tensor, our [rows, cols] order
            const size_t k = std::min(n - done, t.rows * t.cols - at);
            float* o = out + done;
            if (!t.transposed) {  // the same order; rows past the file's (the padded vocabulary): zero
                const size_t in_file = t.file_rows * t.cols, real = at < in_file ? std::min(k, in_file - at) : 0;
                if (real > 0) r->read_range(t.name, at, real, o);
                std::fill(o + real, o + k, 0.0f);
            } else {  // our (i, c) is the file's (c, i): the window's rows i0 .. i1 of every column c
                const size_t i0 = at / t.cols, span = (at + k - 1) / t.cols + 1 - i0;
                cols.resize(span * t.cols);
                for (size_t c = 0; c < t.cols; c++) r->read_range(t.name, c * t.rows + i0, span, &cols[c * span]);
                for (size_t j = 0; j < k; j++) {
                    const size_t e = at + j;
                    o[j] = cols[(e % t.cols) * span + (e / t.cols - i0)];
                }
            }
            done += k;
        }
    };
}

void hf_write_weights(const std::string& path, const ModelShape& shape, const ReadFileOrder& whole) {
    SafetensorsWriter w;
    for (const HfTensor& t : hf_tensors(shape)) {
        w.add(t.name, t.file_shape(), [&whole, t](float* out) {
            // the file's rows (the real vocabulary, not the padded one), transposed where declared
            const size_t n = t.file_rows * t.cols;
            if (!t.transposed) return whole(t.offset, n, out);
            std::vector<float> ours(n);
            whole(t.offset, n, ours.data());
            for (size_t i = 0; i < t.rows; i++)
                for (size_t c = 0; c < t.cols; c++) out[c * t.rows + i] = ours[i * t.cols + c];
        });
    }
    w.set_metadata("format", "pt");
    w.write(path);
}

void hf_write_weights(const std::string& path, const ModelShape& shape, const std::vector<float>& whole) {
    LLMC_ASSERT(whole.size() == num_params(shape), "hf_write_weights: whole model size");
    hf_write_weights(path, shape, [&whole](size_t first, size_t n, float* out) {
        std::copy(whole.begin() + long(first), whole.begin() + long(first + n), out);
    });
}

void hf_write_config(const std::string& path, const ModelShape& s) {
    nlohmann::json j;
    if (s.arch == Arch::GPT2) {
        j = {
            {"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", s.vocab_size},
            {"n_positions", s.max_seq_len},
            {"n_embd", s.d_model},
            {"n_layer", s.n_layer},
            {"n_head", s.n_head},
            {"n_inner", nullptr},  // 4 * n_embd
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"initializer_range", 0.02},
            // this model trains without dropout
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"},
        };
        if (s.vocab_size > 50256) j["bos_token_id"] = j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
    } else {
        j = {
            {"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", s.vocab_size},
            {"hidden_size", s.d_model},
            {"intermediate_size", s.ffn()},
            {"num_hidden_layers", s.n_layer},
            {"num_attention_heads", s.n_head},
            {"num_key_value_heads", s.kv_heads()},
            {"head_dim", s.head_dim()},
            {"max_position_embeddings", s.max_seq_len},
            {"rms_norm_eps", std::stod(strfmt("%g", double(s.norm_eps)))},
            {"rope_theta", std::stod(strfmt("%g", double(s.rope_theta)))},
            {"tie_word_embeddings", s.tie_embeddings},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", "float32"},
        };
    }
    const MoeShape& m = s.moe;
    if (m.enabled() && s.arch == Arch::Llama && m.every == 1) {
        // every layer MoE: transformers' MixtralForCausalLM (the tensor names are its own). Its
        // router_aux_loss_coef weighs another normalisation of the same loss (top_k times ours,
        // over all layers' tokens at once; llmc/model/moe.h), so it is written as the config's value only.
        j["architectures"] = {"MixtralForCausalLM"};
        j["model_type"] = "mixtral";
        j["intermediate_size"] = m.expert_ffn_dim;
        j["num_local_experts"] = m.num_experts;
        j["num_experts_per_tok"] = m.top_k;
        j["router_aux_loss_coef"] = std::stod(strfmt("%g", double(m.aux_loss_coef)));
        j["sliding_window"] = nullptr;
        j.erase("mlp_bias");
    } else if (m.enabled()) {
        // no transformers class has these layers: the shape is recorded for train_gpt (model.moe)
        j["train_gpt_moe"] = {{"num_experts", m.num_experts}, {"top_k", m.top_k},
                              {"expert_ffn_dim", m.expert_ffn_dim}, {"every", m.every}};
    }
    const std::string text = j.dump(2) + "\n";
    write_file_atomic(path, {{text.data(), text.size()}});
}
