#include "llmc/hf_format.h"

#include <nlohmann/json.hpp>

#include "llmc/common.h"
#include "llmc/model_file.h"
#include "llmc/safetensors.h"

namespace {

// One whole tensor: its name, its shape in the file (vocabulary rows unpadded), and where its
// padded rows start in the whole-model vector.
struct HfTensor {
    std::string name;
    size_t rows, cols, file_rows, offset;
};

std::vector<HfTensor> hf_tensors(const ModelShape& s) {
    std::vector<HfTensor> out;
    size_t off = 0;
    for (const TensorDecl& d : model_tensors(s)) {
        const int n = d.part == ModelPart::Layer ? s.n_layer : 1;
        const size_t file_rows = d.split == TpSplit::Vocab ? size_t(s.vocab_size) : d.rows;
        for (int l = 0; l < n; l++, off += d.rows * d.cols)
            out.push_back({d.part == ModelPart::Layer ? strfmt(d.name.c_str(), l) : d.name, d.rows, d.cols, file_rows, off});
    }
    LLMC_ASSERT(off == num_params(s), "hf_tensors: the declarations do not cover the model");
    return out;
}

std::string shape_str(const std::vector<int64_t>& sh) {
    std::string r = "[";
    for (size_t i = 0; i < sh.size(); i++) r += (i ? ", " : "") + std::to_string(sh[i]);
    return r + "]";
}

}  // namespace

bool is_safetensors(const std::string& path) {
    const std::string ext = ".safetensors";
    return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

std::vector<float> hf_read_weights(const std::string& path, const ModelShape& shape) {
    const SafetensorsReader r(path);
    const char* p = path.c_str();
    std::vector<float> whole(num_params(shape), 0.0f);
    const auto tensors = hf_tensors(shape);
    size_t used = 0;
    for (const HfTensor& t : tensors) {
        if (!r.has(t.name)) throw UserError(strfmt("safetensors file %s: has no tensor %s (model.arch \"%s\")", p,
                                                   t.name.c_str(), arch_name(shape.arch)));
        const SafetensorsEntry& e = r.entry(t.name);
        std::vector<int64_t> want = {int64_t(t.file_rows), int64_t(t.cols)};
        if (t.cols == 1) want.pop_back();
        if (e.shape != want)
            throw UserError(strfmt("safetensors file %s: tensor %s has shape %s, but the config's model needs %s", p,
                                   t.name.c_str(), shape_str(e.shape).c_str(), shape_str(want).c_str()));
        const std::vector<float> v = r.read(t.name);
        std::copy(v.begin(), v.end(), whole.begin() + long(t.offset));
        used++;
    }
    for (const auto& kv : r.entries()) {
        const std::string& n = kv.first;
        bool known = false;
        for (const HfTensor& t : tensors) known = known || t.name == n;
        if (known || n.find("rotary_emb.inv_freq") != std::string::npos) continue;
        if (n == "lm_head.weight")
            throw UserError(strfmt("safetensors file %s: has lm_head.weight, but model.tie_embeddings is true (the "
                                   "head would be ignored); set model.tie_embeddings: false", p));
        throw UserError(strfmt("safetensors file %s: tensor %s is not part of a %s model of this shape", p, n.c_str(),
                               arch_name(shape.arch)));
    }
    (void)used;
    return whole;
}

void hf_write_weights(const std::string& path, const ModelShape& shape, const std::vector<float>& whole) {
    LLMC_ASSERT(whole.size() == num_params(shape), "hf_write_weights: whole model size");
    SafetensorsWriter w;
    for (const HfTensor& t : hf_tensors(shape)) {
        std::vector<int64_t> sh = {int64_t(t.file_rows), int64_t(t.cols)};
        if (t.cols == 1) sh.pop_back();
        w.add(t.name, sh, whole.data() + t.offset);
    }
    w.set_metadata("format", "pt");
    w.write(path);
}

void hf_write_config(const std::string& path, const ModelShape& s) {
    LLMC_ASSERT(s.arch == Arch::Llama, "hf_write_config: Llama only");
    const nlohmann::json j = {
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
    const std::string text = j.dump(2) + "\n";
    write_file_atomic(path, {{text.data(), text.size()}});
}
