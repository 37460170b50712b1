// AsyncSave (llmc/io/async_save.h): the write runs on its own thread, wait() returns what it wrote
// or rethrows what it threw, and destruction waits for a write in flight.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "llmc/core/common.h"
#include "llmc/io/async_save.h"

TEST_CASE("AsyncSave runs the write on its own thread and returns its folder", "[checkpoint]") {
    AsyncSave save;
    CHECK_FALSE(save.pending());
    CHECK(save.wait().path.empty());  // nothing in flight
    std::atomic<bool> go{false};
    const std::thread::id caller = std::this_thread::get_id();
    std::thread::id writer;
    save.start([&] {
        writer = std::this_thread::get_id();
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return std::string("ckpt/step_00000003");
    });
    CHECK(save.pending());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(save.finished());  // the caller goes on while the write waits
    go = true;
    const AsyncSave::Result r = save.wait();
    CHECK(r.path == "ckpt/step_00000003");
    CHECK(r.seconds >= 0.02);
    CHECK(writer != caller);
    CHECK_FALSE(save.pending());
    CHECK(save.wait().path.empty());
}

TEST_CASE("AsyncSave rethrows the write's failure, then takes the next write", "[checkpoint]") {
    AsyncSave save;
    save.start([]() -> std::string { throw UserError("checkpoint.dir: cannot save checkpoint x: disk full"); });
    while (!save.finished()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(save.pending());
    CHECK_THROWS_WITH(save.wait(), "checkpoint.dir: cannot save checkpoint x: disk full");
    CHECK_FALSE(save.pending());
    save.start([] { return std::string("y"); });
    CHECK(save.wait().path == "y");
}

TEST_CASE("AsyncSave's destruction waits for the write in flight", "[checkpoint]") {
    std::atomic<bool> written{false};
    {
        AsyncSave save;
        save.start([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            written = true;
            return std::string("z");
        });
    }
    CHECK(written.load());
    {
        AsyncSave failing;  // a failure with nobody to rethrow it to goes to stderr, not std::terminate
        failing.start([]() -> std::string { throw UserError("disk full"); });
    }
}
