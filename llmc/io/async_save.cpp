#include "llmc/io/async_save.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "llmc/core/common.h"

void AsyncSave::start(std::function<std::string()> work) {
    LLMC_ASSERT(!pending(), "AsyncSave::start: a write is still in flight (wait for it first)");
    finished_.store(false, std::memory_order_relaxed);
    path_.clear();
    seconds_ = 0.0;
    error_ = nullptr;
    thread_ = std::thread([this, work = std::move(work)] {
        const auto t0 = std::chrono::steady_clock::now();
        try {
            path_ = work();
        } catch (...) {
            error_ = std::current_exception();
        }
        seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        finished_.store(true, std::memory_order_release);
    });
}

AsyncSave::Result AsyncSave::wait() {
    if (!pending()) return {};
    thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return {std::exchange(path_, std::string()), seconds_};
}

AsyncSave::~AsyncSave() {
    try {
        wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%serror: the checkpoint written in the background failed: %s\n", rank_prefix().c_str(),
                     e.what());
    }
}
