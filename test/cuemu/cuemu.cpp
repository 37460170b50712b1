// cuemu's scheduler and runtime (see test/cuemu/cuemu.h): each CUDA thread a fiber, one block at a
// time per OS thread, blocks over OpenMP threads; device memory in tracked, tail-guarded host
// allocations; the runtime API synchronous.
#include <omp.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "test/cuemu/cuemu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CUEMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CUEMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CUEMU_POISON(p, n) ((void)(p), (void)(n))
#define CUEMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace ctx = boost::context;

namespace cuemu {
namespace {

constexpr size_t kDefaultSmem = 48 * 1024, kOptinSmem = 232448;  // H100: 227 KiB per block
constexpr size_t kSmemGuard = 4096;       // checked bytes past the launch's dynamic shared memory
constexpr size_t kRedzone = 256;          // checked bytes past each device allocation
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned char kNaN = 0xFF;      // fresh memory: fp32 / bf16 NaN, an unwritten read shows
// Guards past the end hold the signalling NaN 0x7FA1 (bf16) / 0x7FA17FA1 (fp32): a read shows
// as NaN, and a store of any computed value (arithmetic quiets a NaN) differs from it.
inline unsigned char guard_byte(size_t i) { return i % 2 ? 0x7F : 0xA1; }
void fill_guard(void* p, size_t n) {
    for (size_t i = 0; i < n; i++) static_cast<unsigned char*>(p)[i] = guard_byte(i);
}
// the first changed byte of a guard, or n
size_t check_guard(const void* p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (static_cast<const unsigned char*>(p)[i] != guard_byte(i)) return i;
    return n;
}

std::mutex g_mu;  // allocations, attributes, error printing
[[noreturn]] void die(const std::string& msg) {
    std::lock_guard<std::mutex> lk(g_mu);
    std::fprintf(stderr, "cuemu: %s\n", msg.c_str());
    std::fflush(stderr);
    std::abort();
}
template <class... A> std::string fmt(const char* f, A... a) {
    char buf[1024];
    std::snprintf(buf, sizeof(buf), f, a...);
    return buf;
}

// ---- schedule ----
enum class Order { Forward, Reverse, Random };
struct Schedule {
    Order order = Order::Forward;
    bool warp_grain = false;
    uint64_t seed = 1;
};
Schedule parse_schedule() {
    Schedule s;
    const char* e = std::getenv("CUEMU_SCHEDULE");
    std::string v = e ? e : "forward-lockstep";
    const size_t dash = v.find('-');
    std::string o = v.substr(0, dash), g = dash == std::string::npos ? "lockstep" : v.substr(dash + 1);
    if (o == "forward") s.order = Order::Forward;
    else if (o == "reverse") s.order = Order::Reverse;
    else if (o.rfind("random", 0) == 0) {
        s.order = Order::Random;
        if (o.size() > 6) s.seed = std::strtoull(o.c_str() + 6, nullptr, 10);
    } else {
        std::fprintf(stderr, "cuemu: CUEMU_SCHEDULE=%s: order must be forward, reverse or random[SEED]\n", v.c_str());
        std::exit(2);
    }
    if (g == "lockstep") s.warp_grain = false;
    else if (g == "warp") s.warp_grain = true;
    else {
        std::fprintf(stderr, "cuemu: CUEMU_SCHEDULE=%s: grain must be lockstep or warp\n", v.c_str());
        std::exit(2);
    }
    return s;
}
const Schedule& schedule() {
    static const Schedule s = parse_schedule();
    return s;
}
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
};
// 0..n-1 in the schedule's order (a fresh permutation per call for random)
void order_of(std::vector<int>& v, int n, Rng* rng) {
    v.resize(n);
    for (int i = 0; i < n; i++) v[i] = schedule().order == Order::Reverse ? n - 1 - i : i;
    if (schedule().order == Order::Random)
        for (int i = n - 1; i > 0; i--) std::swap(v[i], v[(int)(rng->next() % (uint64_t)(i + 1))]);
}

// ---- fiber stacks: a pool per OS thread, reused block after block ----
struct StackPool {
    std::vector<char*> free;
    ~StackPool() {
        for (char* p : free) std::free(p);
    }
};
thread_local StackPool t_stacks;
struct PoolStack {
    ctx::stack_context allocate() {
        char* p;
        if (t_stacks.free.empty()) {
            p = static_cast<char*>(std::malloc(kStackBytes));
            if (!p) die("out of memory for fiber stacks");
        } else {
            p = t_stacks.free.back();
            t_stacks.free.pop_back();
        }
        ctx::stack_context sc;
        sc.size = kStackBytes;
        sc.sp = p + kStackBytes;
        return sc;
    }
    void deallocate(ctx::stack_context& sc) { t_stacks.free.push_back(static_cast<char*>(sc.sp) - sc.size); }
};

}  // namespace

enum class Wait { Run, Sync, Warp, Exited };

struct ThreadState {
    uint3 tid;
    int linear = 0;
    Wait wait = Wait::Run;
    Coll kind = Coll::SyncWarp;
    unsigned mask = 0;
    uint64_t value = 0, result = 0;
    int arg = 0, width = 32;
    const char* file = "";
    int line = 0;
    ctx::fiber fib, sink;
    bool started = false;
};

namespace {

struct Block {
    const char* kernel;
    uint3 bid;
    dim3 bdim, gdim;
    std::vector<ThreadState> th;
    int n = 0, exited = 0;
    void (*body)(void*);
    void* ctx;
    char* smem = nullptr;
    size_t smem_bytes = 0;
    char* view = nullptr;       // the async proxy's view of smem (null: not made yet, the NaN fill)
    bool proxy_fenced = false;  // a thread ran fence_proxy_async since the last barrier
    uint64_t serial = 0;
};
thread_local Block* t_blk = nullptr;
thread_local uint64_t t_serial = 0;  // the blocks run on this OS thread
thread_local ThreadState* t_cur = nullptr;

// dynamic shared memory, one buffer per OS thread (room for the opt-in maximum and the guard),
// 1024-byte aligned as a device's shared memory window (kernels declare it __align__(128))
struct SmemBuffer {
    char* p = nullptr;
    ~SmemBuffer() { std::free(p); }
    char* get() {
        if (!p) p = static_cast<char*>(std::aligned_alloc(1024, kOptinSmem + kSmemGuard));
        if (!p) die("out of memory for shared memory");
        return p;
    }
};
thread_local SmemBuffer t_smem, t_view;

const char* coll_name(Coll k) {
    switch (k) {
        case Coll::Shfl: return "__shfl_sync";
        case Coll::ShflUp: return "__shfl_up_sync";
        case Coll::ShflDown: return "__shfl_down_sync";
        case Coll::ShflXor: return "__shfl_xor_sync";
        case Coll::Ballot: return "__ballot_sync";
        case Coll::SyncWarp: return "__syncwarp";
        case Coll::Wmma: return "wmma";
    }
    return "?";
}
const char* base(const char* f) {
    const char* s = std::strrchr(f, '/');
    return s ? s + 1 : f;
}
std::string where(const ThreadState& t) {
    switch (t.wait) {
        case Wait::Run: return "running";
        case Wait::Exited: return "exited";
        case Wait::Sync: return fmt("at __syncthreads (%s:%d)", base(t.file), t.line);
        case Wait::Warp:
            if (t.kind == Coll::Wmma) return fmt("at wmma::%s, mask 0x%08x", t.file, t.mask);
            return fmt("at %s (%s:%d), mask 0x%08x", coll_name(t.kind), base(t.file), t.line, t.mask);
    }
    return "?";
}
// The threads' states, runs of equal states merged.
[[noreturn]] void fail(Block& b, const std::string& why) {
    std::string s = fmt("kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u x %u x %u threads: ", b.kernel, b.bid.x, b.bid.y,
                        b.bid.z, b.gdim.x, b.gdim.y, b.gdim.z, b.bdim.x, b.bdim.y, b.bdim.z);
    s += why + "\n  threads' states (linear thread index):";
    for (int i = 0; i < b.n;) {
        const std::string w = where(b.th[i]);
        int j = i;
        while (j + 1 < b.n && where(b.th[j + 1]) == w) j++;
        s += fmt("\n    %d-%d: %s", i, j, w.c_str());
        i = j + 1;
    }
    die(s);
}

void resume(Block& b, ThreadState& t) {
    t_cur = &t;
    if (!t.started) {
        t.started = true;
        t.fib = ctx::fiber(std::allocator_arg, PoolStack(), [&t, &b](ctx::fiber&& sink) {
            t.sink = std::move(sink);
            b.body(b.ctx);
            t.wait = Wait::Exited;
            b.exited++;
            return std::move(t.sink);
        });
    }
    t.fib = std::move(t.fib).resume();
    t_cur = nullptr;
}

bool same_site(const ThreadState& a, const ThreadState& b) {
    return a.kind == b.kind && a.mask == b.mask && a.width == b.width && a.line == b.line &&
           (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// Completes every warp collective of warp w whose mask has fully arrived; true if any did. With
// none completable while lanes wait, the lanes can never proceed: aborts naming why.
bool resolve_warp(Block& b, int w) {
    const int first = w * 32, last = std::min(b.n, first + 32);
    bool done = false, waiting = false;
    for (int i = first; i < last; i++) {
        ThreadState& t = b.th[i];
        if (t.wait != Wait::Warp) continue;
        waiting = true;
        bool all = true;
        for (int l = 0; l < 32 && all; l++)
            if (t.mask >> l & 1u) all = first + l < last && b.th[first + l].wait == Wait::Warp && same_site(b.th[first + l], t);
        if (!all) continue;
        // every lane of the mask is here: compute each lane's result
        for (int l = 0; l < 32; l++) {
            if (!(t.mask >> l & 1u)) continue;
            ThreadState& u = b.th[first + l];
            const int wd = u.width, seg = l / wd * wd;
            int src = l;
            switch (u.kind) {
                case Coll::Shfl: src = seg + ((u.arg % wd) + wd) % wd; break;
                case Coll::ShflUp: src = l - u.arg >= seg ? l - u.arg : l; break;
                case Coll::ShflDown: src = l + u.arg < seg + wd ? l + u.arg : l; break;
                case Coll::ShflXor: src = (l ^ u.arg) < seg + wd ? (l ^ u.arg) : l; break;
                default: break;
            }
            if (src < 0 || src >= 32 || !(t.mask >> src & 1u))
                fail(b, fmt("lane %d of warp %d reads lane %d, outside the mask 0x%08x of %s (%s:%d)", l, w, src, t.mask,
                            coll_name(u.kind), base(u.file), u.line));
            if (u.kind == Coll::Ballot) {
                uint64_t bits = 0;
                for (int k = 0; k < 32; k++)
                    if ((t.mask >> k & 1u) && b.th[first + k].value) bits |= 1ull << k;
                u.result = bits;
            } else {
                u.result = b.th[first + src].value;
            }
        }
        for (int l = 0; l < 32; l++)
            if (t.mask >> l & 1u) b.th[first + l].wait = Wait::Run;
        done = true;
    }
    if (done || !waiting) return done;
    // stuck: name the first lane of a waiting lane's mask that is not at the same collective
    for (int i = first; i < last; i++) {
        ThreadState& t = b.th[i];
        if (t.wait != Wait::Warp) continue;
        for (int l = 0; l < 32; l++) {
            if (!(t.mask >> l & 1u)) continue;
            const std::string at = fmt("%s (%s:%d) by lane %d of warp %d with mask 0x%08x", coll_name(t.kind),
                                       t.kind == Coll::Wmma ? t.file : base(t.file), t.line, i - first, w, t.mask);
            if (first + l >= last) fail(b, fmt("%s: lane %d of the mask does not exist (the block ends)", at.c_str(), l));
            const ThreadState& u = b.th[first + l];
            if (u.wait == Wait::Exited) fail(b, fmt("%s: lane %d of the mask has exited", at.c_str(), l));
            if (u.wait == Wait::Sync) fail(b, fmt("%s: lane %d of the mask waits at __syncthreads", at.c_str(), l));
            if (!same_site(u, t))
                fail(b, fmt("%s: lane %d of the mask is %s instead", at.c_str(), l, where(u).c_str()));
        }
    }
    fail(b, "warp collective cannot complete");
}

// All threads blocked or exited, no warp collective pending: release a __syncthreads that every
// thread reached at one place; false when everything has exited.
bool release_barrier(Block& b) {
    if (b.exited == b.n) return false;
    int at = 0;
    const ThreadState* first = nullptr;
    for (ThreadState& t : b.th)
        if (t.wait == Wait::Sync) {
            at++;
            if (!first) first = &t;
            else if (t.line != first->line || std::strcmp(t.file, first->file) != 0)
                fail(b, fmt("threads wait at different __syncthreads (%s:%d and %s:%d)", base(first->file), first->line,
                            base(t.file), t.line));
        }
    if (at != b.n - b.exited) fail(b, "deadlock: no thread can proceed");
    if (b.exited)
        fail(b, fmt("__syncthreads (%s:%d) reached by %d threads while %d have exited", base(first->file), first->line,
                    at, b.exited));
    for (ThreadState& t : b.th) t.wait = Wait::Run;
    if (b.proxy_fenced) {  // the writes before the fences (and any since: leniently) reach the async proxy
        if (!b.view) b.view = t_view.get();
        std::memcpy(b.view, b.smem, b.smem_bytes);
        b.proxy_fenced = false;
    }
    return true;
}

void run_block(Block& b, Rng* rng) {
    std::vector<int> order;
    const int nwarps = (b.n + 31) / 32;
    for (;;) {
        if (schedule().warp_grain) {
            std::vector<int> warps, lanes;
            order_of(warps, nwarps, rng);
            for (int w : warps) {
                const int first = w * 32, cnt = std::min(32, b.n - first);
                do {
                    order_of(lanes, cnt, rng);
                    for (int l : lanes)
                        if (b.th[first + l].wait == Wait::Run) resume(b, b.th[first + l]);
                } while (resolve_warp(b, w));
            }
        } else {
            bool more;
            do {
                order_of(order, b.n, rng);
                for (int i : order)
                    if (b.th[i].wait == Wait::Run) resume(b, b.th[i]);
                more = false;
                for (int w = 0; w < nwarps; w++) more = resolve_warp(b, w) || more;
            } while (more);
        }
        if (!release_barrier(b)) return;
    }
}

// ---- device memory ----
struct Alloc {
    size_t bytes;
    bool pinned;
};
std::map<uintptr_t, Alloc> g_allocs;
std::map<const void*, size_t> g_smem_optin;
cudaError_t g_last = cudaSuccess;
uint64_t g_launches = 0;

bool in_alloc(const void* p, size_t n, bool device_only) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return false;
    --it;
    const uintptr_t u = (uintptr_t)p;
    return (!device_only || !it->second.pinned) && u >= it->first && u + n <= it->first + it->second.bytes;
}
void check_redzones(const char* after) {
#if defined(__SANITIZE_ADDRESS__)
    return;  // the redzones are poisoned: ASan reports the store itself
#endif
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto& [p, a] : g_allocs) {
        if (a.pinned) continue;
        const size_t i = check_guard((const char*)p + a.bytes, kRedzone);
        if (i < kRedzone) {
            std::fprintf(stderr, "cuemu: %s wrote past the end of a device allocation of %zu bytes at %p (byte %zu past it)\n",
                         after, a.bytes, (void*)p, i);
            std::abort();
        }
    }
}
void check_range(const char* what, const void* p, size_t n) {
    if (n && !in_alloc(p, n, true)) die(fmt("%s: %zu bytes at %p are not inside one device allocation", what, n, p));
}

}  // namespace

const uint3& thread_idx() { return t_cur->tid; }
const uint3& block_idx() { return t_blk->bid; }
const dim3& block_dim() { return t_blk->bdim; }
const dim3& grid_dim() { return t_blk->gdim; }
char* dynamic_smem() { return t_blk->smem; }
uint64_t block_serial() { return t_blk->serial; }
bool async_reads_early() { return schedule().order != Order::Forward; }
void fence_proxy_async() { t_blk->proxy_fenced = true; }
const char* async_view() {
    Block& b = *t_blk;
    if (!b.view) {
        b.view = t_view.get();
        std::memset(b.view, kNaN, b.smem_bytes);
    }
    return b.view;
}
void async_view_stale(size_t offset, const char* what) {
    fail(*t_blk, fmt("%s read byte %zu of shared memory, which differs from the async proxy's view of it (shared "
                     "memory at the last __syncthreads after a fence.proxy.async): written without "
                     "fence.proxy.async and __syncthreads between the write and the %s, or while it was in flight",
                     what, offset, what));
}

uint64_t warp_collective(Coll kind, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
    ThreadState* t = t_cur;
    if (!t) die("warp collective outside a kernel");
    const int lane = t->linear % 32;
    if (!(mask >> lane & 1u))
        fail(*t_blk, fmt("lane %d calls %s (%s:%d) with mask 0x%08x, which leaves it out", lane, coll_name(kind),
                         base(file), line, mask));
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fail(*t_blk, fmt("%s (%s:%d): width %d is not a power of two up to 32", coll_name(kind), base(file), line, width));
    t->wait = Wait::Warp;
    t->kind = kind, t->mask = mask, t->value = value, t->arg = arg, t->width = width, t->file = file, t->line = line;
    t->sink = std::move(t->sink).resume();
    t_cur = t;
    return t->result;
}

void syncthreads(const char* file, int line) {
    ThreadState* t = t_cur;
    if (!t) die("__syncthreads outside a kernel");
    t->wait = Wait::Sync;
    t->file = file, t->line = line;
    t->sink = std::move(t->sink).resume();
    t_cur = t;
}

void check_pointer_arg(const char* kernel, int index, const void* p) {
    if (p && !in_alloc(p, 0, false))
        die(fmt("kernel %s: pointer argument %d (%p) is not inside a device or pinned host allocation", kernel, index, p));
}

cudaError_t run_grid(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, void (*body)(void*),
                     void* c) {
    const uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535 || !nthreads || nthreads > 1024 ||
        block.z > 64) {
        std::fprintf(stderr, "cuemu: kernel %s: invalid launch grid (%u,%u,%u) block (%u,%u,%u)\n", name, grid.x, grid.y,
                     grid.z, block.x, block.y, block.z);
        return g_last = cudaErrorInvalidConfiguration;
    }
    if (smem > kDefaultSmem) {
        size_t optin = 0;
        {
            std::lock_guard<std::mutex> lk(g_mu);
            auto it = g_smem_optin.find(fn);
            if (it != g_smem_optin.end()) optin = it->second;
        }
        if (smem > optin) {
            std::fprintf(stderr, "cuemu: kernel %s: %zu bytes of dynamic shared memory without opting in "
                                 "(cudaFuncAttributeMaxDynamicSharedMemorySize is %zu)\n", name, smem, optin);
            return g_last = cudaErrorInvalidValue;
        }
    }
    const uint64_t launch = ++g_launches;
    const long long nblocks = (long long)grid.x * grid.y * grid.z;
    std::vector<long long> shuffled;  // random: the blocks in a permutation fixed by the seed and the launch
    if (schedule().order == Order::Random) {
        Rng r{schedule().seed ^ launch * 0x9E3779B97F4A7C15ull};
        shuffled.resize(nblocks);
        for (long long i = 0; i < nblocks; i++) shuffled[i] = i;
        for (long long i = nblocks - 1; i > 0; i--) std::swap(shuffled[i], shuffled[r.next() % (uint64_t)(i + 1)]);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (long long i = 0; i < nblocks; i++) {
        const long long bi = schedule().order == Order::Reverse ? nblocks - 1 - i
                             : shuffled.empty()                ? i
                                                               : shuffled[i];
        Rng rng{schedule().seed * 0x2545F4914F6CDD1Dull ^ (launch << 32) ^ (uint64_t)bi};
        Block b;
        b.kernel = name;
        b.bid = uint3{(unsigned)(bi % grid.x), (unsigned)(bi / grid.x % grid.y), (unsigned)(bi / grid.x / grid.y)};
        b.bdim = block;
        b.gdim = grid;
        b.n = (int)nthreads;
        b.body = body;
        b.ctx = c;
        b.smem = t_smem.get();
        b.smem_bytes = smem;
        b.serial = ++t_serial;
        CUEMU_UNPOISON(b.smem, kOptinSmem + kSmemGuard);
        std::memset(b.smem, kNaN, smem);
        fill_guard(b.smem + smem, kSmemGuard);
        CUEMU_POISON(b.smem + smem, kOptinSmem + kSmemGuard - smem);
        b.th = std::vector<ThreadState>(nthreads);
        for (int t = 0; t < b.n; t++) {
            b.th[t].linear = t;
            b.th[t].tid = uint3{t % block.x, t / block.x % block.y, t / block.x / block.y};
        }
        t_blk = &b;
        run_block(b, &rng);
        t_blk = nullptr;
        CUEMU_UNPOISON(b.smem, kOptinSmem + kSmemGuard);
        const size_t k = check_guard(b.smem + smem, kSmemGuard);
        if (k < kSmemGuard)
            fail(b, fmt("wrote past the %zu bytes of dynamic shared memory of the launch (byte %zu past the end)", smem, k));
    }
    check_redzones(fmt("kernel %s", name).c_str());
    return cudaSuccess;
}

}  // namespace cuemu

// ---------------------------------------------------------------- the runtime API
using cuemu::g_allocs;
using cuemu::g_last;
using cuemu::g_mu;

static cudaError_t set_err(cudaError_t e) { return e == cudaSuccess ? e : (g_last = e); }

// ---- stream capture and graphs ----
namespace cuemu {
static bool g_capturing = false, g_capture_invalid = false;
static std::vector<std::function<void()>> g_captured;
bool capturing() { return g_capturing; }
void enqueue_grid(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, void (*body)(void*),
                  std::shared_ptr<void> ctx) {
    enqueue([=] { run_grid(name, fn, grid, block, smem, body, ctx.get()); });
}
void enqueue(std::function<void()> f) {
    if (g_capturing)
        g_captured.push_back(std::move(f));
    else
        f();
}
}  // namespace cuemu
struct CUgraph_st {
    std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> nodes;
};
// what a capture may not hold: fails and invalidates the capture (cudaSuccess outside one)
static cudaError_t capture_forbids() {
    if (!cuemu::g_capturing) return cudaSuccess;
    cuemu::g_capture_invalid = true;
    return set_err(cudaErrorStreamCaptureUnsupported);
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (cuemu::g_capturing) return set_err(cudaErrorStreamCaptureUnsupported);
    cuemu::g_capturing = true;
    cuemu::g_capture_invalid = false;
    cuemu::g_captured.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
    *g = nullptr;
    if (!cuemu::g_capturing) return set_err(cudaErrorInvalidValue);
    cuemu::g_capturing = false;
    std::vector<std::function<void()>> nodes;
    nodes.swap(cuemu::g_captured);
    if (cuemu::g_capture_invalid) return set_err(cudaErrorStreamCaptureInvalidated);
    *g = new CUgraph_st{std::move(nodes)};
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
    if (!g) return set_err(cudaErrorInvalidValue);
    *e = new CUgraphExec_st{g->nodes};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    if (!e) return set_err(cudaErrorInvalidValue);
    if (cuemu::g_capturing) return capture_forbids();  // (a device allows it as a child graph; the project does not)
    for (auto& f : e->nodes) f();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) { return delete g, cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { return delete e, cudaSuccess; }

static size_t bytes_in_use() {
    std::lock_guard<std::mutex> lk(g_mu);
    size_t n = 0;
    for (auto& [p, a] : g_allocs) n += a.pinned ? 0 : a.bytes;
    return n;
}
constexpr size_t kTotalMem = 80ull << 30;

cudaError_t cudaGetDeviceCount(int* n) { return *n = 1, cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return set_err(d == 0 ? cudaSuccess : cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* d) { return *d = 0, cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return set_err(cudaErrorInvalidDevice);
    std::memset(p, 0, sizeof(*p));
    std::snprintf(p->name, sizeof(p->name), "cuemu (CUDA emulated on the CPU)");
    p->major = 9, p->minor = 0, p->multiProcessorCount = 132, p->totalGlobalMem = kTotalMem;
    p->sharedMemPerBlock = cuemu::kDefaultSmem, p->sharedMemPerBlockOptin = cuemu::kOptinSmem;
    p->maxThreadsPerBlock = 1024, p->warpSize = 32;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
    if (d != 0) return set_err(cudaErrorInvalidDevice);
    if (a == cudaDevAttrMaxSharedMemoryPerBlockOptin) *v = (int)cuemu::kOptinSmem;
    else if (a == cudaDevAttrMultiProcessorCount) *v = 132;
    else return set_err(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* fn, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || (size_t)v > cuemu::kOptinSmem)
        return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    cuemu::g_smem_optin[fn] = (size_t)v;
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return g_last; }
const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    }
    return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaDeviceSynchronize() { return capture_forbids(); }

static cudaError_t alloc(void** p, size_t bytes, bool pinned) {
    *p = nullptr;
    if (cuemu::g_capturing) return capture_forbids();
    const size_t total = (bytes + cuemu::kRedzone + 255) / 256 * 256;
    void* q = std::aligned_alloc(256, total);
    if (!q) return set_err(cudaErrorMemoryAllocation);
    std::memset(q, cuemu::kNaN, bytes);  // device memory starts as garbage: NaN
    cuemu::fill_guard((char*)q + bytes, total - bytes);
    if (!pinned) CUEMU_POISON((char*)q + bytes, total - bytes);
    std::lock_guard<std::mutex> lk(g_mu);
    g_allocs[(uintptr_t)q] = cuemu::Alloc{bytes, pinned};
    *p = q;
    return cudaSuccess;
}
static cudaError_t release(void* p, bool pinned) {
    if (cuemu::g_capturing) return capture_forbids();
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_allocs.find((uintptr_t)p);
        if (it == g_allocs.end() || it->second.pinned != pinned) {
            std::fprintf(stderr, "cuemu: %s(%p): not an allocation of %s\n", pinned ? "cudaFreeHost" : "cudaFree", p,
                         pinned ? "cudaMallocHost" : "cudaMalloc");
            std::abort();
        }
        const size_t bytes = it->second.bytes;
        CUEMU_UNPOISON((char*)p + bytes, cuemu::kRedzone);
        g_allocs.erase(it);
    }
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) { return alloc(p, bytes, false); }
cudaError_t cudaFree(void* p) { return release(p, false); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return alloc(p, bytes, true); }
cudaError_t cudaFreeHost(void* p) { return release(p, true); }
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
    *total_b = kTotalMem;
    *free_b = kTotalMem - bytes_in_use();
    return cudaSuccess;
}
// a copy's device side(s) must lie inside one device allocation (`fn` names the call)
static void check_copy(const char* fn, void* dst, const void* src, size_t bytes, cudaMemcpyKind k) {
    if (k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice)
        cuemu::check_range((std::string(fn) + " destination").c_str(), dst, bytes);
    if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice)
        cuemu::check_range((std::string(fn) + " source").c_str(), src, bytes);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind k) {
    if (cuemu::g_capturing) return capture_forbids();
    check_copy("cudaMemcpy", dst, src, bytes, k);
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind k, cudaStream_t) {
    if (!cuemu::g_capturing) return cudaMemcpy(dst, src, bytes, k);
    // a captured copy's host side must be pinned; its source is read when the graph runs
    if (((k == cudaMemcpyHostToDevice) && bytes && !cuemu::in_alloc(src, bytes, false)) ||
        ((k == cudaMemcpyDeviceToHost) && bytes && !cuemu::in_alloc(dst, bytes, false)))
        return capture_forbids();
    check_copy("cudaMemcpyAsync", dst, src, bytes, k);
    cuemu::enqueue([=] { cudaMemcpy(dst, src, bytes, k); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
    if (cuemu::g_capturing) return capture_forbids();
    cuemu::check_range("cudaMemset", p, bytes);
    if (bytes) std::memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) {
    if (!cuemu::g_capturing) return cudaMemset(p, v, bytes);
    cuemu::check_range("cudaMemsetAsync", p, bytes);
    cuemu::enqueue([=] { cudaMemset(p, v, bytes); });
    return cudaSuccess;
}

// streams and events: distinct non-null handles, nothing behind them
static char g_handles;
cudaError_t cudaStreamCreate(cudaStream_t* s) { return *s = (cudaStream_t)&g_handles, cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return capture_forbids(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) { return *e = (cudaEvent_t)&g_handles, cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return capture_forbids(); }
cudaError_t cudaEventQuery(cudaEvent_t) { return capture_forbids(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { return *ms = 0.0f, cudaSuccess; }
