// Model FLOPs utilisation: achieved model FLOP/s over the GPU's dense peak.
//
// FLOPs per token = 6*N + 12*L*C*T  (PaLM appendix B): N = parameters with the tied
// embedding counted once and without the vocabulary padding, L layers, C = d_model,
// T = sequence length (the attention scores and their use, forward and backward).
#pragma once
#include <string>

#include "llmc/model/model.h"

double flops_per_token(const ModelShape& s, int seq_len);
// Dense peak FLOP/s of a GPU by its reported name for "bf16", "fp8", "tf32" or "fp32"
// (fp32 without tensor cores); 0 when the GPU is not in the table.
double gpu_peak_flops(const std::string& gpu_name, const std::string& precision);
