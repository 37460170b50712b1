// The committed PyTorch reference for GPT-2 (dev/reference/gpt2_reference.py, float64, Debian's
// python3-torch), read by the CPU parity test (test/test_parity.cpp) and the GPU tests
// (test/gpu/cases_model.cuh). Two files:
//   test/data/ref_model.bin  tiny GPT-2 weights, llm.c checkpoint format (version 3, fp32)
//   test/data/ref_state.bin  the debug state:
//     int32 header[256]: [0] magic 20241121 [1] version 1 [2] B [3] T [4] V [5] Vp
//       [6] n_layer [7] n_head [8] d_model [9] max_seq_len [10] num_params [11] n_steps;
//       slots 16..21 are float32 bit patterns: lr, beta1, beta2, eps, weight_decay, grad_clip
//     int32 x[B*T], int32 y[B*T], fp32 logits[B*T*V] (real vocab), fp32 loss,
//     fp32 grads[num_params] (llm.c order, d mean-loss / d params),
//     fp32 losses[n_steps] (loss before each AdamW update, same batch every step),
//     fp32 grad_norms[n_steps] (global norm before clipping).
// Regenerate with: /usr/bin/python3 dev/reference/gpt2_reference.py
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/model/param_table.h"

struct RefData {
    ModelShape shape;
    int B = 0, T = 0, n_steps = 0;
    size_t num_params = 0;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
    std::vector<float> weights;  // llm.c order
    std::vector<int32_t> x, y;
    std::vector<float> logits;  // [B*T, V]
    float loss = 0;
    std::vector<float> grads;  // llm.c order
    std::vector<float> losses, grad_norms;
};

// Reads the two files into r; returns "" or what is wrong with them (a short read, a header
// that disagrees with the model file, bytes past the end).
inline std::string load_ref_data(const std::string& model_path, const std::string& state_path, RefData& r) {
    struct Closer {
        void operator()(FILE* f) const { std::fclose(f); }
    };
    std::unique_ptr<FILE, Closer> fm(std::fopen(model_path.c_str(), "rb")), fs(std::fopen(state_path.c_str(), "rb"));
    if (!fm) return "cannot open " + model_path;
    if (!fs) return "cannot open " + state_path;
    auto read = [](FILE* f, void* dst, size_t size, size_t count) { return std::fread(dst, size, count, f) == count; };
    int32_t mh[256], sh[256];
    if (!read(fm.get(), mh, 4, 256)) return "short read of the model header";
    if (mh[0] != 20240326 || mh[1] != 3) return "model header: not an llm.c version 3 checkpoint";
    r.shape.max_seq_len = mh[2];
    r.shape.vocab_size = mh[3];
    r.shape.n_layer = mh[4];
    r.shape.n_head = mh[5];
    r.shape.d_model = mh[6];
    r.shape.padded_vocab = mh[7];
    r.num_params = num_params(r.shape);
    r.weights.resize(r.num_params);
    if (!read(fm.get(), r.weights.data(), 4, r.num_params)) return "short read of the model weights";
    if (std::fgetc(fm.get()) != EOF) return "bytes past the model weights";

    if (!read(fs.get(), sh, 4, 256)) return "short read of the state header";
    if (sh[0] != 20241121 || sh[1] != 1) return "state header: bad magic or version";
    r.B = sh[2];
    r.T = sh[3];
    if (sh[4] != r.shape.vocab_size || sh[5] != r.shape.padded_vocab || sh[6] != r.shape.n_layer ||
        sh[7] != r.shape.n_head || sh[8] != r.shape.d_model || sh[9] != r.shape.max_seq_len ||
        static_cast<size_t>(sh[10]) != r.num_params)
        return "state header: the shape disagrees with the model file";
    r.n_steps = sh[11];
    float hyper[6];
    std::memcpy(hyper, &sh[16], sizeof hyper);
    r.lr = hyper[0], r.beta1 = hyper[1], r.beta2 = hyper[2], r.eps = hyper[3], r.weight_decay = hyper[4];
    r.grad_clip = hyper[5];
    const size_t N = static_cast<size_t>(r.B) * r.T;
    r.x.resize(N);
    r.y.resize(N);
    r.logits.resize(N * r.shape.vocab_size);
    r.grads.resize(r.num_params);
    r.losses.resize(r.n_steps);
    r.grad_norms.resize(r.n_steps);
    if (!read(fs.get(), r.x.data(), 4, N) || !read(fs.get(), r.y.data(), 4, N) ||
        !read(fs.get(), r.logits.data(), 4, r.logits.size()) || !read(fs.get(), &r.loss, 4, 1) ||
        !read(fs.get(), r.grads.data(), 4, r.num_params) || !read(fs.get(), r.losses.data(), 4, r.losses.size()) ||
        !read(fs.get(), r.grad_norms.data(), 4, r.grad_norms.size()))
        return "short read of the debug state";
    if (std::fgetc(fs.get()) != EOF) return "bytes past the debug state";
    return "";
}
