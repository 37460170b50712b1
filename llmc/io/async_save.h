// A checkpoint written on a thread of its own while training goes on (checkpoint.async).
//
// The copy of the state is collective and stays in the training loop (every rank copies what it
// holds: PieceServer::snapshot, llmc/train/layout.h); what follows on world rank 0 (the non-finite
// scan, the checksums, the files, fsync, rename, DONE, retention, and the requests for the other
// ranks' parts, which each answers on a thread of its own, also an AsyncSave's) is host work on
// copies nobody else touches, and takes the time of the disk: here (CPU) most of a save.
// One write at a time: the next save, a stop signal, the final save and the end of the run wait
// for the one in flight first. A failure (a full disk: UserError; a non-finite state:
// NonFiniteState) is rethrown by wait(), in the training loop, so that the run ends as a
// synchronous save's failure would, a few steps later; the previous checkpoints are kept either way.
// Like torchtitan's checkpoint.async_mode and Megatron-LM's --async-save.
#pragma once
#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>

class AsyncSave {
public:
    AsyncSave() = default;
    AsyncSave(const AsyncSave&) = delete;
    AsyncSave& operator=(const AsyncSave&) = delete;
    // Waits for a write in flight. A failure, with nothing left to rethrow it to (the run is ending
    // on another error or exception), goes to stderr.
    ~AsyncSave();

    // Runs work (it returns the checkpoint folder it wrote) on its own thread. One at a time: the
    // caller waits for the previous one first.
    void start(std::function<std::string()> work);
    bool pending() const { return thread_.joinable(); }  // started, not yet waited for
    bool finished() const { return finished_.load(std::memory_order_acquire); }  // wait() will not block

    struct Result {
        std::string path;  // the folder written; "" when nothing was in flight
        double seconds = 0.0;  // the write's own time, on its thread
    };
    // Waits for the write in flight (if any) and returns it, or rethrows what it threw.
    Result wait();

private:
    std::thread thread_;
    std::atomic<bool> finished_{false};
    std::string path_;
    double seconds_ = 0.0;
    std::exception_ptr error_;
};
