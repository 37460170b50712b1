// CUDA graphs for the training step (train.cuda_graphs; Ops::graph_step_begin). The trainer marks
// where each step's device work begins; the step's first read back (CudaOps::to_host_bytes) ends
// that region. One graph holds a region's work, and later steps launch it instead of queuing their
// kernels one by one:
//  - warm-up: a region runs as always, and is clean when it neither waited for the host (its
//    uploads' waits aside: a graph's uploads make none) nor allocated or freed device memory;
//  - capture: the region after a clean one, with the same key and no allocation between, is captured
//    (cudaStreamBeginCapture on the compute stream); its uploads are copied into a pinned arena
//    whose copies the graph holds; at the region's end the graph is instantiated and launched;
//  - replay: every later region runs the same host code, which queues nothing (queue_work(): the
//    graph holds the work) while its uploads refill the arena, each checked to be the captured
//    step's (destination, size) in order; at the region's end the graph is launched.
// The host's per-step values reach the graph's kernels through uploads (tokens, targets, AdamW's
// learning rate, step and seeds); the trainer's key covers the values its step passes by value (the
// loss scale's seed). A changed key, or any allocation or free since the capture (a grown scratch
// buffer moves a pointer the graph holds), drops the graph and warms up again. After kMaxDirty
// regions in a row that are not clean, graphs are given up for the run (the reason is returned).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/cuda/common.cuh"

class StepGraph {
public:
    static constexpr int kMaxDirty = 3;
    static constexpr size_t kAlign = 256;  // each upload's place in the arena

    ~StepGraph() {
        if (state_ == State::Capturing) {  // an exception left the capture open
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(stream_, &g);
            if (g) cudaGraphDestroy(g);
        }
        g_graph_replay = false;
        if (exec_) cudaGraphExecDestroy(exec_);
        if (arena_) cudaFreeHost(arena_);
    }

    // A region begins. waits: the backend's host waits so far, its uploads' excluded.
    // Returns what the region does: "warm-up", "capture", "replay", or "off: <why>".
    std::string begin(cudaStream_t st, uint64_t key, uint64_t waits) {
        LLMC_ASSERT(!in_region_, "StepGraph: a region began inside another");
        if (state_ == State::Off) return "off: " + why_;
        stream_ = st;
        if (exec_ && (key != key_ || cuda_alloc_count != allocs_)) {  // stale: warm up again
            cudaGraphExecDestroy(exec_);
            exec_ = nullptr;
            clean_ = false;
            state_ = State::Warm;
        }
        in_region_ = true;
        key_ = key;
        waits0_ = waits;
        allocs0_ = cuda_alloc_count;
        if (state_ == State::Ready) {
            g_graph_replay = true;
            next_ = 0;
            return "replay";
        }
        if (clean_ && key == clean_key_ && cuda_alloc_count == clean_allocs_) {
            if (arena_bytes_ < warm_bytes_) {  // the clean region's uploads, in place
                if (arena_) CUDA_CHECK(cudaFreeHost(arena_));
                arena_ = nullptr;
                CUDA_CHECK(cudaMallocHost(&arena_, warm_bytes_));
                arena_bytes_ = warm_bytes_;
            }
            uploads_.clear();
            used_ = 0;
            CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            state_ = State::Capturing;
            g_graph_capturing = true;
            return "capture";
        }
        warm_bytes_ = 0;
        return "warm-up";
    }
    bool in_region() const { return in_region_; }

    // An upload of the region: false when the caller uploads it as always (warm-up; outside a
    // region), true when taken (capture: into the arena and the graph; replay: into the arena).
    bool upload(void* dst, const void* src, size_t bytes) {
        if (!in_region_) return false;
        const size_t span = (bytes + kAlign - 1) / kAlign * kAlign;
        if (state_ == State::Warm) {
            warm_bytes_ += span;
            return false;
        }
        if (state_ == State::Capturing) {
            LLMC_ASSERT(used_ + span <= arena_bytes_, "StepGraph: the captured step uploads more than its warm-up");
            std::memcpy(arena_ + used_, src, bytes);
            CUDA_CHECK(cudaMemcpyAsync(dst, arena_ + used_, bytes, cudaMemcpyHostToDevice, stream_));
            uploads_.push_back({dst, bytes, used_});
            used_ += span;
            return true;
        }
        LLMC_ASSERT(next_ < uploads_.size() && uploads_[next_].dst == dst && uploads_[next_].bytes == bytes,
                    strfmt("CUDA graph replay: upload %zu of the step (%zu bytes) is not the captured step's", next_,
                           bytes));
        std::memcpy(arena_ + uploads_[next_].at, src, bytes);
        next_++;
        return true;
    }

    // The region ends (before the read back that ends it is queued).
    void end(uint64_t waits) {
        in_region_ = false;
        if (state_ == State::Warm) {
            const uint64_t w = waits - waits0_, a = cuda_alloc_count - allocs0_;
            clean_ = w == 0 && a == 0;
            clean_key_ = key_;
            clean_allocs_ = cuda_alloc_count;
            dirty_ = clean_ ? 0 : dirty_ + 1;
            if (dirty_ >= kMaxDirty) {
                state_ = State::Off;
                why_ = strfmt("%d steps in a row waited for the host or allocated device memory (the last: %llu "
                              "waits, %llu allocations or frees)",
                              kMaxDirty, (unsigned long long)w, (unsigned long long)a);
            }
            return;
        }
        if (state_ == State::Capturing) {
            cudaGraph_t g = nullptr;
            state_ = State::Warm;  // (if instantiation fails, the destructor has no capture to close)
            CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
            g_graph_capturing = false;
            CUDA_CHECK(cudaGraphInstantiate(&exec_, g, 0));
            CUDA_CHECK(cudaGraphDestroy(g));
            allocs_ = cuda_alloc_count;
            state_ = State::Ready;
        } else {
            g_graph_replay = false;
            LLMC_ASSERT(next_ == uploads_.size(), strfmt("CUDA graph replay: the step uploaded %zu of the captured "
                                                         "step's %zu inputs", next_, uploads_.size()));
        }
        CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    }

private:
    enum class State { Warm, Capturing, Ready, Off };
    struct Upload {
        void* dst;
        size_t bytes, at;  // at: offset in the arena
    };
    State state_ = State::Warm;
    std::string why_;
    cudaStream_t stream_ = nullptr;
    bool in_region_ = false;
    uint64_t key_ = 0, waits0_ = 0, allocs0_ = 0;
    // the last warm-up region: clean, its key, the allocation count at its end, its uploads' span
    bool clean_ = false;
    uint64_t clean_key_ = 0, clean_allocs_ = 0;
    size_t warm_bytes_ = 0;
    int dirty_ = 0;
    // the graph, the allocation count it was made at, its uploads and their pinned arena
    cudaGraphExec_t exec_ = nullptr;
    uint64_t allocs_ = 0;
    std::vector<Upload> uploads_;
    size_t next_ = 0;
    char* arena_ = nullptr;
    size_t arena_bytes_ = 0, used_ = 0;
};
