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
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/model/model.h"

// The model's shape from its config keys (the family's defaults filled in; padded vocabulary).
ModelShape model_shape(const ModelConfig& m);

// Throws UserError naming model.n_layer and model.d_model when the whole model's fp32 weights
// exceed this machine's physical memory. Where one host holds them: the CPU backend (and the CUDA
// emulator, whose device memory is host memory); a save that gathers them to world rank 0
// (checkpoint.async). Stricter than it needs to be for a GPU run under model parallelism saving
// synchronously, which holds no other rank's piece (PieceServer); a resume and model.init read
// pieces.
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
    // The runs that hold [first, first + n), in file order: f(member, at, k, done) for each k
    // elements at member's at, done elements of the range before them.
    template <class F>
    void for_runs(size_t first, size_t n, F f) const;
};
template <class F>
void FileOrderMap::for_runs(size_t first, size_t n, F f) const {
    const size_t total = runs.empty() ? 0 : runs.back().file + runs.back().n;
    LLMC_ASSERT(first <= total && n <= total - first, "a read past the end of the model");
    // the run holding first: the last one that starts at or before it
    auto it = std::upper_bound(runs.begin(), runs.end(), first, [](size_t f, const Run& r) { return f < r.file; }) - 1;
    for (size_t done = 0; done < n; ++it) {
        const size_t skip = first + done - it->file, k = std::min(n - done, it->n - skip);
        f(it->member, it->at + skip, k, done);
        done += k;
    }
}

FileOrderMap file_order_map(const ModelShape& shape, const ParallelConfig& pc, size_t pad_multiple);
// A save (any save but one process's synchronous one): world rank 0 reads the whole model's arrays
// from the ranks that hold them as it writes them, each rank sending only the elements asked for,
// when asked (a gather would first copy every member's piece to world rank 0: for a model split
// over tp x pp x ep ranks, the whole model and its moments in one host's memory at every save).
// The ranks that hold world rank 0's mp group's state: each member i of that group and the other
// ranks of its ZeRO shard group (DataParallel's DP group), shard rank d of S. An array is held
//   whole: by shard rank 0 (a ZeRO-0 optimizer's, ZeRO-1/2's weights, a copy gathered over DP);
//   sharded: shard rank d holds [d c / S, (d + 1) c / S) of member i's c = map->counts[i] (ZeRO).
// Used so, every rank with the same map: every rank that serves() adds the same arrays in the same
// order (a rank of shard rank > 0 may stop early: the arrays it leaves out are held whole by shard
// rank 0, as the copies gathered over DP of local SGD's and PowerSGD's state), each with a read of what it holds (read(at, n, out): n elements of the piece from
// position at, within what it holds; never called on a rank that holds none of the array); world
// rank 0 reads them through reader(k), then calls finish(); every other rank calls serve(), which
// answers the requests until then. Requests and pieces travel over world, which must be the world
// on MPI, untimed (ProcessGroups' save group: a save may take longer than parallel.timeout_s), or
// a group of one. checkpoint.async: every rank takes a snapshot() of what it holds, and the reads
// and serve() run on threads of their own, over a communicator of their own (async_save).
class PieceServer {
public:
    // map: the mp group's (file_order_map); mp: this rank's mp group; shard: its ZeRO shard group.
    // Collective over world.
    PieceServer(std::shared_ptr<const FileOrderMap> map, const Comm& mp, const Comm& shard, Comm& world);
    bool serves() const { return member_ >= 0; }  // this rank holds part of world rank 0's mp group's state
    // The next array (returns its index for reader()): null where the run keeps no such array (on
    // every rank); whole or sharded as above. What read reads must stay as it is until finish() /
    // serve() returns.
    int add(FileOrderMap::MemberRead read, bool sharded);
    // The same from a copy of the piece held whole on shard rank 0 (map->counts[i] elements; empty
    // on the other shard ranks, or on every rank for an array the run does not keep).
    int add(const std::vector<float>* local);
    // Copies what this rank holds of each array added with a read into keep (its memory reused;
    // one vector an array), and serves from there: checkpoint.async's snapshot, which training
    // cannot change under the write. (A copy added as a vector is already one.)
    void snapshot(std::vector<std::vector<float>>& keep);
    // World rank 0: array k in file order, from every rank that holds part of it; null where the
    // array is not kept.
    ReadFileOrder reader(int k);
    void serve();   // every rank but world rank 0
    void finish();  // world rank 0, when its reads are done: serve() returns on every other rank

private:
    struct Array {
        FileOrderMap::MemberRead read;
        bool sharded;
        bool copy = false;  // added as a vector
    };
    std::shared_ptr<const FileOrderMap> map_;
    Comm& world_;
    int member_ = -1, shard_rank_ = 0;  // this rank's place: member of world rank 0's mp group, shard rank
    int shards_ = 1;                    // S
    std::vector<int> servers_;          // world rank 0: the world rank of (member i, shard rank d) at i S + d
    std::vector<Array> arrays_;
    std::vector<float> buf_;  // the elements in flight: each server's of a request, in file order
    // What shard rank d holds of array a of member m's piece: [lo, hi) of it
    std::pair<size_t, size_t> held(const Array& a, int m, int d) const;
    // f(m, d, at, c, done) for each part of [first, first + n) that one rank holds (member m's
    // elements [at, at + c), on its shard rank d), in file order
    template <class F>
    void for_parts(const Array& a, size_t first, size_t n, F f) const;
    // This rank's parts of [first, first + n) into out in file order, a span of its memory at a
    // time (one read where runs are short, as under tp); returns their count (out null: only that)
    size_t pack(const Array& a, size_t first, size_t n, float* out) const;
};

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
