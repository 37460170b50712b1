// The model's split over the process grid (which chunks of layers and which tensor-parallel
// slice a rank holds), and the whole model assembled from the ranks' pieces: what makes
// checkpoints and final weights independent of the layout that trained them.
//
// The model-parallel group ("mp") of a rank is every rank with its DP coordinate: tp x pp ranks
// that together hold one copy of the model, ordered by world rank, i.e. member i has
// tp_rank = i % tp and pp_rank = i / tp (llmc/parallel/process_grid.h). Under expert parallelism it is
// every rank with its expert-dp coordinate, tp x ep x pp ranks: member i has tp_rank = i % tp,
// ep_rank = i / tp % ep and pp_rank = i / (tp ep).
#pragma once
#include <functional>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/model/model.h"

// The model's shape from its config keys (the family's defaults filled in; padded vocabulary).
ModelShape model_shape(const ModelConfig& m);

// Throws UserError naming model.n_layer and model.d_model when the whole model's fp32 weights
// exceed this machine's physical memory: world rank 0 gathers its model-parallel group's pieces
// (the whole model, with its moments) for every checkpoint and for the final weights. (A resume and
// model.init read pieces: no rank holds the whole model for them.)
void check_fits_host_memory(const ModelShape& shape);

// The part of the model the rank at (tp_rank, pp_rank, ep_rank) holds under this parallel config.
ModelLayout model_layout(const ModelShape& shape, const ParallelConfig& pc, int tp_rank, int pp_rank, int ep_rank = 0);

// Where each element of the whole model (llm.c order) lies in the mp group's buffers (each member's
// ParamLayout::padded_params elements, built with pad_multiple): runs of primary copies only
// (replicas of TP-replicated tensors and the tied head copy are skipped), ascending, joined where
// contiguous in one member's buffer too, tiling [0, num_params).
struct FileOrderMap {
    struct Run {
        size_t file, n;  // whole-model elements [file, file + n) ...
        int member;      // ... are member's [at, at + n)
        size_t at;
    };
    std::vector<Run> runs;
    std::vector<size_t> counts;  // each member's buffer
    // Elements [first, first + n) of the whole model into out, from the members' buffers.
    void read(const std::vector<const float*>& members, size_t first, size_t n, float* out) const;
    // The same from readers of the members' buffers (n elements from at into out): the live
    // state of a one-process save, read where it lies (a device's memory).
    using MemberRead = std::function<void(size_t at, size_t n, float* out)>;
    void read(const std::vector<MemberRead>& members, size_t first, size_t n, float* out) const;

private:
    template <class F>
    void for_runs(size_t first, size_t n, float* out, size_t members, F copy) const;
};
FileOrderMap file_order_map(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple);
// Collective over the mp group: member 0 gets the other members' local buffers one after another
// into others (its memory is reused) and returns every member's buffer for FileOrderMap::read (its
// own: local, not a copy); the others leave others empty and get an empty vector.
std::vector<const float*> gather_pieces(const FileOrderMap& map, const std::vector<float>& local, Comm& mp,
                                        std::vector<float>& others);

// Collective over the mp group (pp x ep x tp ranks, ProcessGrid::model_groups): every member passes its host copy of a model-sized buffer in its
// own memory order (ParamLayout::padded_params elements, built with pad_multiple); member 0 gets the whole
// model in llm.c order (num_params elements), the others an empty vector. Only primary
// copies are taken (replicas of TP-replicated tensors and the tied head copy are skipped).
// Into whole: its memory is reused. (The gradient dump's; a checkpoint reads the gathered pieces
// through a FileOrderMap instead.)
void assemble_whole(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple,
                    const std::vector<float>& local, Comm& mp, std::vector<float>& whole);
std::vector<float> assemble_whole(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple,
                                  const std::vector<float>& local, Comm& mp);
