// Hugging Face's format of the model families (GPT-2: transformers' GPT2LMHeadModel; Llama:
// LlamaForCausalLM): weights as safetensors under each declaration's hf_name (llmc/model/param_table.h;
// the declared name where it has none), transposed where the declaration says hf_transposed, and
// transformers' config.json. Whole-model vectors are in the file order of llmc/model/param_table.h
// (vocabulary padded to shape.padded_vocab with zero rows); files hold the real vocabulary.
#pragma once
#include <string>
#include <vector>

#include "llmc/model/param_table.h"

// True if path names a safetensors file, or the index of a sharded one
// (".safetensors.index.json", transformers' model.safetensors.index.json), by its name.
bool is_safetensors(const std::string& path);
// Reads every declared tensor of shape's family (F32, BF16 or F16) into the whole-model file
// order. Throws UserError naming the file and tensor for a missing tensor, a wrong shape, or
// (tied embeddings) an lm_head.weight that differs from the token embedding (an equal one, as
// transformers may save, is accepted). Unknown extra tensors are refused too, except buffers
// that hold no parameters (rotary inv_freq, GPT-2's attn.bias and attn.masked_bias). A non-finite
// element is refused naming the file's tensor and the element in its order. A file of
// transformers' base model (names without "transformer." / "model.", as the Hub's gpt2) is read too,
// and a model sharded over several files through its index (path: the .safetensors.index.json;
// each tensor read from the shard its "weight_map" names, which must hold it and no tensor the
// index places elsewhere or does not list).
std::vector<float> hf_read_weights(const std::string& path, const ModelShape& shape);
// The same checks, a tensor at a time, keeping nothing: what world rank 0 checks before every rank
// reads its part (hf_weights_pieces).
void hf_check_weights(const std::string& path, const ModelShape& shape);
// The file's weights in the whole-model file order, handed out in pieces (padded vocabulary rows:
// zero), each read where it lies: what a rank reads when it takes its part of the model. Checks
// first that every declared tensor is there with its shape; not the values (hf_check_weights).
ReadFileOrder hf_weights_pieces(const std::string& path, const ModelShape& shape);
// Writes the whole model (file order) as fp32 safetensors, unpadded vocabulary; atomic. Read a
// tensor at a time (a transposed one through one copy of its size): the model is not held whole.
void hf_write_weights(const std::string& path, const ModelShape& shape, const ReadFileOrder& whole);
void hf_write_weights(const std::string& path, const ModelShape& shape, const std::vector<float>& whole);
// Writes transformers' config.json for shape (GPT2LMHeadModel or LlamaForCausalLM); atomic.
void hf_write_config(const std::string& path, const ModelShape& shape);
