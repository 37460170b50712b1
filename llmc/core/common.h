// Errors and assertions shared by every part of train_gpt.
//
// Two kinds of failure, kept apart on purpose:
//  - UserError: the user's input (config, command line, shard, checkpoint) is wrong.
//    The message names the key, file or value; main() prints it and exits with code 2.
//  - LLMC_ASSERT: an invariant inside the program is broken. It prints file and line
//    and aborts: that is a bug, not bad input. (A test harness that must go on to its next
//    case may set checks_throw(): the failure then throws CheckFailure after printing.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

struct UserError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Rank of this process for message prefixes; set once by the runtime (-1 = not distributed).
int& log_rank();
// "[rank 3] " or "" when not distributed.
std::string rank_prefix();

// A failed LLMC_ASSERT or CUDA/cuBLASLt check while checks_throw() is set (test_gpu only:
// a failed case is reported and the next case runs). Off by default: the trainer aborts.
struct CheckFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// (inline, as is check_failed: dev/cuda's kernel benches use the CUDA checks without libllmc)
inline bool& checks_throw() {
    static bool on = false;
    return on;
}
// After the message is printed: throw CheckFailure(what) when checks_throw() is set and no
// exception is already in flight, else abort.
[[noreturn]] inline void check_failed(const std::string& what) {
    if (checks_throw() && std::uncaught_exceptions() == 0) throw CheckFailure(what);
    std::abort();
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

#define LLMC_ASSERT(cond, msg)                                              \
    do {                                                                    \
        if (!(cond)) assert_fail(#cond, __FILE__, __LINE__, (msg));         \
    } while (0)

// Sorted list of files matching a glob pattern (empty when none match).
std::vector<std::string> glob_files(const std::string& pattern);

// A file written in pieces under path.tmp, then made path by commit() (fsync, rename, the folder's
// fsync). A failure is a UserError naming the file; until commit() returns, an existing file at path
// is left as it was, and one not committed (an exception on the way) is unlinked when destroyed.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const void* p, size_t n);  // after the bytes written so far
    void write_at(uint64_t offset, const void* p, size_t n);  // over bytes written (a header's checksum)
    void commit();

private:
    [[noreturn]] void fail(const char* what);
    std::string path_, tmp_;
    int fd_ = -1;
};

// Writes bytes to path via path.tmp + fsync + rename (AtomicFile); throws UserError naming the file
// on failure, in which case an existing file at path is left as it was.
void write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts);

// mkdir -p. Throws UserError("<what>: cannot create folder ...") on failure.
void make_dirs(const std::string& path, const char* what);

// FNV-1a 64-bit hash of bytes, chainable through h (checksums, replica comparison).
constexpr uint64_t FNV1A_INIT = 1469598103934665603ull;
uint64_t fnv1a(const void* data, size_t n, uint64_t h = FNV1A_INIT);

// Large host buffers with their pages first touched by all OpenMP threads at once: one thread's
// page faults and copies made the model's initialisation a matter of tens of seconds at GPT-2 1.5B
// (the first touch of a 6 GB buffer alone). zeroed_floats: n zero floats; parallel_copy: memcpy
// in slices, one a thread (both plain memset/memcpy under 16 MiB).
std::unique_ptr<float[]> zeroed_floats(size_t n);
void parallel_copy(void* dst, const void* src, size_t bytes);

// printf-style std::string
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string human_bytes(double bytes);  // e.g. 1.5 MiB

// Non-finite values (NaN, infinite) counted over data seen in pieces: how many, and the first's
// index and value. The checks that refuse to save or load them (checkpoints, model files,
// safetensors) each name what they found in their own terms.
struct NonFiniteCount {
    size_t bad = 0, first = 0;
    float value = 0.0f;
    // x[0 .. k): elements at .. at + k of the whole
    void add(const float* x, size_t k, size_t at = 0);
};
