// What the training loop does beside the step (train_gpt.cu): the next micro-batch of a rank, the
// validation loss and the sample, each collective over the ranks as its comment says.
#pragma once
#include <cstdint>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/data/dataloader.h"
#include "llmc/model/model.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/tensor_parallel.h"
#include "llmc/train/data_parallel.h"

// The next micro-batch of this rank: the loader reads its DP rank's B sequences of T = t * cp
// tokens (x and y hold B*T); with context parallelism x and y then begin with this CP rank's
// B*t rows of them (llmc/parallel/context_parallel.h), inputs and targets alike.
void next_batch(DataLoader& loader, const ContextParallel& cp, int B, int t, std::vector<int32_t>& x,
                std::vector<int32_t>& y);

// Mean loss over `batches` micro-batches of the validation set, from its start, averaged over
// the DP (x CP) ranks. A stop signal (llmc/run/preempt.h) is agreed over the world before every
// micro-batch, so that a long evaluation stops at once on every rank alike: *sig is then set and
// the result is meaningless.
double evaluate(PipelineEngine& pipeline, DataLoader& val, const ContextParallel& cp, int batches, int B, int t,
                std::vector<int32_t>& x, std::vector<int32_t>& y, DataParallel& dp, Comm& world, int* sig);

// Samples n tokens after <|endoftext|> at temperature 1, seeded: the same step gives the same text.
// Collective over the model-parallel and CP groups: the last stage's TP ranks of the CP rank
// holding the last position gather the logits row and draw alike; the CP group, then the
// pipeline group, hand the token to the others. A stop signal is agreed over the world before
// every token (the ranks that do not sample agree as often: sample_wait), and sets *sig: the
// sample is then cut short.
std::vector<int> sample(PipelineEngine& pipeline, Model& model, TensorParallel& tp, ContextParallel& cp, int eot,
                        int n, uint64_t seed, Comm& world, int* sig);

// A rank that does not sample: the agreements of sample()'s n tokens, in step with it.
void sample_wait(int n, Comm& world, int* sig);
