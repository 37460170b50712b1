// Model weights in llm.c's checkpoint format: a header of 256 int32
// [20240326, version, max_seq_len, vocab_size, n_layer, n_head, d_model, padded_vocab, 0...]
// then every parameter in llm.c order, fp32 (version 3) or bf16 (version 5).
// Other families (train_gpt's own extension; llm.c reads GPT-2 files only) mark themselves in
// the unused slots: [8] family (0 = GPT-2, 1 = Llama), [9] n_kv_head, [10] ffn_dim,
// [11] tie_embeddings, [12] rope_theta and [13] norm_eps as float32 bit patterns; the
// parameters follow in the family's file order (llmc/model/param_table.h). GPT-2 files keep 0 there.
// Mixture-of-experts models (either family) add [14] num_experts, [15] top_k, [16]
// expert_ffn_dim, [17] every; 0 in [14] = no MoE layers.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/model/model.h"

constexpr int MODEL_FILE_MAGIC = 20240326;

// Reads the header only; throws UserError naming the file when it is not an llm.c model.
ModelShape model_file_shape(const std::string& path, int* version = nullptr);
// Checks a model file without reading its weights: its header, the shape against expect (if given:
// a UserError naming the field that differs) and its size. Returns the shape, and its version.
ModelShape model_file_check(const std::string& path, const ModelShape* expect, int* version = nullptr);
// Reads the weights as fp32 in llm.c order. If expect is given, a shape that differs is a
// UserError naming the field. Checks the file size, and that every weight is finite. bytes, if
// given, sees every byte of the file in order as it is read (a checkpoint's checksum: one pass).
std::vector<float> model_file_read(const std::string& path, const ModelShape* expect,
                                   const std::function<void(const void*, size_t)>& bytes = nullptr);
// Checks a model file as model_file_read does (the shape, the size, every weight finite; bytes sees
// every byte) and keeps nothing: constant memory, whatever the model's size.
void model_file_scan(const std::string& path, const ModelShape* expect,
                     const std::function<void(const void*, size_t)>& bytes = nullptr);
// A model file's weights handed out in pieces (fp32, llm.c order), each read where it lies: what a
// rank reads of a file when it takes its part of the model (Model::from_file_order). Checks first
// what model_file_check checks; not the weights' finiteness (model_file_scan). A read that fails
// or comes short is a UserError naming the file. bytes_read, if given, counts every byte read.
ReadFileOrder model_file_pieces(const std::string& path, const ModelShape* expect,
                                std::shared_ptr<size_t> bytes_read = nullptr);
// Throws UserError naming `file`, the tensor (its file-order name, e.g. "h.1.qkvw") and the element
// when a weight of w (llm.c order, num_params(shape) elements) is NaN or infinite: such a file is
// no model to train from or to resume (model_file_read checks what it reads).
void check_finite_weights(const std::vector<float>& w, const ModelShape& shape, const std::string& file);
// Writes (atomically: temp name, fsync, rename) version 3 (fp32) or 5 (bf16, round to nearest even).
// bytes, if given, sees every byte written, in file order (a checkpoint's checksum, without reading
// the file back).
void model_file_write(const std::string& path, const ModelShape& shape, const float* params_llmc, int version,
                      const std::function<void(const void*, size_t)>& bytes = nullptr);
// The same from the weights handed out in pieces (a checkpoint's gathered pieces: for_each_chunk).
void model_file_write(const std::string& path, const ModelShape& shape, const ReadFileOrder& params, int version,
                      const std::function<void(const void*, size_t)>& bytes = nullptr);

