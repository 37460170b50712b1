// The PTX instructions of the tensor-core kernels (llmc/cuda/flash_attention.cuh), one small
// device function each, with the register layout the PTX ISA gives it written beside it.
// On a device (sm_80+) each is one `asm volatile`; under the CUDA emulator (LLMC_CUEMU,
// test/cuemu) each is a CPU twin that follows the documented layout exactly, built from the
// warp primitives the emulator has: it gathers the lanes' registers (a per-warp exchange behind a
// __syncwarp), the first lane past it computes the warp's result, and each lane takes its share.
// test/gpu/cases_ptx.cuh's `ptx` filter checks the twins against a naive per-element product (and
// on a device the instructions themselves).
//
// Notation (a warp's 32 lanes): g = lane / 4 (the "group", 0..7), t = lane % 4 (0..3).
// E, the 16-bit element type of the operands: __nv_bfloat16 (bf16) or __half (fp16); the
// instructions and layouts are the same for both, only the mma's type suffix differs. A register
// of two E holds its lower-column element in the low 16 bits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#if defined(LLMC_CUEMU)
#include <vector>
#endif

namespace ptx {

#if defined(LLMC_CUEMU)
namespace emu {
// The twins' exchange of registers within a warp: each lane writes its own, a __syncwarp, then the
// first lane past it computes the whole warp's results into the exchange (a warp-wide product is
// one small GEMM: cheaper at once than lane by lane) and each lane takes its share. Per OS thread
// is per block under the emulator, as __shared__ is. An exchange has two buffers taken in turn: a
// lane writes exchange n + 2's operands into exchange n's buffer only after exchange n + 1's
// __syncwarp, which every lane reaches after taking its share of exchange n (each instruction is
// warp-wide: every lane makes the same exchanges, so the lanes' turns agree). ldmatrix's rows are
// read by the first lane past its __syncwarp, before any lane goes on (to write them, say), as the
// instruction reads every lane's rows before any lane proceeds.
struct Regs {  // mma_16816 (one n-tile of B) and mma_16816_x2 (two); wgmma's A from registers: a alone
    uint32_t a[32][4], b[32][4];
    float c[32][8];  // the lanes' accumulators: C in, D out
    bool done;       // the first lane past the __syncwarp computed D
};
struct Rows {  // ldmatrix: the lanes' row addresses, then the registers each lane receives
    const char* p[32];
    uint32_t r[32][4];
    bool done;
};
struct WarpExchange {
    Regs mma[2];
    Rows ldm[2];
    unsigned char turn[32], ldm_turn[32];
};
inline WarpExchange& warp_exchange() {
    static thread_local WarpExchange w[32];  // up to 1024 threads a block
    return w[threadIdx.x / 32];
}
inline Regs& mma_regs() {  // this lane's buffer for its next mma
    WarpExchange& x = warp_exchange();
    return x.mma[x.turn[threadIdx.x % 32]++ & 1];
}
inline Rows& ldm_rows() {  // this lane's buffer for its next ldmatrix
    WarpExchange& x = warp_exchange();
    return x.ldm[x.ldm_turn[threadIdx.x % 32]++ & 1];
}
}  // namespace emu
#endif

// Two floats -> one register of two E (round to nearest even), lo in the low half; the floats
// of the low and high halves of a register.
template <class E> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | ((uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16);
}
template <class E> __device__ __forceinline__ float half_of(unsigned short bits);
template <> __device__ __forceinline__ float half_of<__nv_bfloat16>(unsigned short bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
}
template <> __device__ __forceinline__ float half_of<__half>(unsigned short bits) {
    return __half2float(__ushort_as_half(bits));
}
template <class E> __device__ __forceinline__ float lo16(uint32_t r) { return half_of<E>((unsigned short)(r & 0xffffu)); }
template <class E> __device__ __forceinline__ float hi16(uint32_t r) { return half_of<E>((unsigned short)(r >> 16)); }

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: D[16x8] = A[16x16] B[16x8] + C ----
// A (row-major 16x16, 4 registers of 2 E):
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
// B (16x8 "col": k down, n across; 2 registers):
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
// C, D (16x8 fp32, 4 registers):
//   c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
// (So an accumulator pair c[0..1] of two adjacent n-tiles is, rounded to E, exactly an A
// register of the next product: the flash kernels reuse P from registers.)
// acc_to_a: the A registers of that next product from the accumulators of n-tiles c0 (columns
// 0-7 of the 16 k) and c1 (8-15), rounded to E.
template <class E>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack2<E>(c0[0], c0[1]);
    a[1] = pack2<E>(c0[2], c0[3]);
    a[2] = pack2<E>(c1[0], c1[1]);
    a[3] = pack2<E>(c1[2], c1[3]);
}
#if defined(LLMC_CUEMU)
namespace emu {
// The emulator's mma: D = A B + C for NT n-tiles of 8 (one, or mma_16816_x2's two) of the whole
// warp, from the exchange's registers (the layouts above) into its accumulators. Each element of D
// is C, then each k in order, one fmaf each, as the lanes' own sums would be.
template <class E, int NT>
void mma_warp(Regs& w) {
    float A[16][16], B[16][8 * NT], D[16][8 * NT];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, q = l % 4;
        for (int h = 0; h < 2; h++) {  // lane g * 4 + q: A[g + 8h][2q, 2q+1] in a[h], [2q+8, 2q+9] in a[h + 2]
            float* row = A[g + 8 * h];
            row[2 * q] = lo16<E>(w.a[l][h]), row[2 * q + 1] = hi16<E>(w.a[l][h]);
            row[2 * q + 8] = lo16<E>(w.a[l][h + 2]), row[2 * q + 9] = hi16<E>(w.a[l][h + 2]);
        }
        for (int j = 0; j < NT; j++) {
            // lane n * 4 + q: B[2q, 2q+1][n] in b[2j], B[2q+8, 2q+9][n] in b[2j + 1] (n-tile j)
            const int n = 8 * j + g;
            B[2 * q][n] = lo16<E>(w.b[l][2 * j]), B[2 * q + 1][n] = hi16<E>(w.b[l][2 * j]);
            B[2 * q + 8][n] = lo16<E>(w.b[l][2 * j + 1]), B[2 * q + 9][n] = hi16<E>(w.b[l][2 * j + 1]);
            // lane g * 4 + t: C[g][2t, 2t+1] in c[4j], c[4j + 1], C[g + 8][2t, 2t+1] in c[4j + 2], c[4j + 3]
            for (int i = 0; i < 4; i++) D[g + 8 * (i >> 1)][8 * j + 2 * q + (i & 1)] = w.c[l][4 * j + i];
        }
    }
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8 * NT; n++) D[r][n] = fmaf(A[r][k], B[k][n], D[r][n]);
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < NT; j++)
            for (int i = 0; i < 4; i++) w.c[l][4 * j + i] = D[l / 4 + 8 * (i >> 1)][8 * j + 2 * (l % 4) + (i & 1)];
}
// This lane's part of an mma of NT n-tiles: its A registers, its 2 NT B registers, its
// accumulators (acc[j]: n-tile j's C in, D out).
template <class E, int NT>
void mma_twin(float (&acc)[NT][4], const uint32_t (&a)[4], const uint32_t* b) {
    const int lane = (int)(threadIdx.x % 32);
    Regs& w = mma_regs();
    for (int i = 0; i < 4; i++) w.a[lane][i] = a[i];
    for (int i = 0; i < 2 * NT; i++) w.b[lane][i] = b[i];
    for (int j = 0; j < NT; j++)
        for (int i = 0; i < 4; i++) w.c[lane][4 * j + i] = acc[j][i];
    w.done = false;
    __syncwarp();  // every lane's registers are in
    if (!w.done) {
        mma_warp<E, NT>(w);
        w.done = true;
    }
    for (int j = 0; j < NT; j++)
        for (int i = 0; i < 4; i++) acc[j][i] = w.c[lane][4 * j + i];
}
}  // namespace emu
#endif
template <class E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                          const float (&c)[4]) {
    static_assert(std::is_same<E, __nv_bfloat16>::value || std::is_same<E, __half>::value, "bf16 or fp16 operands");
#if defined(LLMC_CUEMU)
    float acc[1][4] = {{c[0], c[1], c[2], c[3]}};
    emu::mma_twin<E, 1>(acc, a, b);
    for (int i = 0; i < 4; i++) d[i] = acc[0][i];
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same<E, __nv_bfloat16>::value)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
#else
    __trap();
#endif
}
// Two adjacent n-tiles of one product, B from one ldmatrix.x4 r (r[0..1]: the first n-tile's b
// registers, r[2..3]: the second's): c0 += a b0, c1 += a b1.
template <class E>
__device__ __forceinline__ void mma_16816_x2(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                             const uint32_t (&r)[4]) {
#if defined(LLMC_CUEMU)  // one exchange for both products
    float acc[2][4];
    for (int i = 0; i < 4; i++) acc[0][i] = c0[i], acc[1][i] = c1[i];
    emu::mma_twin<E, 2>(acc, a, r);
    for (int i = 0; i < 4; i++) c0[i] = acc[0][i], c1[i] = acc[1][i];
#else
    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
    mma_16816<E>(c0, a, b0, c0);
    mma_16816<E>(c1, a, b1, c1);
#endif
}

// ---- ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8x8 matrices of 16-bit elements ----
// Lane l gives the shared address of row l % 8 of matrix l / 8 (each row 16 contiguous bytes,
// 16-byte aligned). Lane l receives r[j] = matrix j's elements
//   non-transposed: M_j[g][2t], M_j[g][2t+1]       (row g, two adjacent columns)
//   .trans:         M_j[2t][g], M_j[2t+1][g]       (column g, two adjacent rows)
// Non-transposed, matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
// (rows 8-15, cols 8-15) of a row-major 16x16 tile are the mma's A registers a[0..3]; the rows
// of a [key][d] tile as B = K^T; .trans of a [key][d] tile gives B = V.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
#if defined(LLMC_CUEMU)
    return 0;
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

#if defined(LLMC_CUEMU)
namespace emu {
// ldmatrix.x4's twin: this lane's row address in, its four registers out (TRANS: .trans)
template <bool TRANS>
void ldmatrix_twin(uint32_t (&r)[4], const void* row) {
    const int lane = (int)(threadIdx.x % 32);
    Rows& w = ldm_rows();
    w.p[lane] = (const char*)row;
    w.done = false;
    __syncwarp();  // every lane's row address is in
    if (!w.done) {  // every lane's registers, read now
        for (int l = 0; l < 32; l++) {
            const int g = l / 4, t = l % 4;
            for (int j = 0; j < 4; j++) {
                if (!TRANS) {  // row g of matrix j, columns 2t, 2t+1
                    std::memcpy(&w.r[l][j], w.p[j * 8 + g] + 4 * t, 4);
                } else {  // column g of matrix j, rows 2t, 2t+1
                    uint16_t lo, hi;
                    std::memcpy(&lo, w.p[j * 8 + 2 * t] + 2 * g, 2);
                    std::memcpy(&hi, w.p[j * 8 + 2 * t + 1] + 2 * g, 2);
                    w.r[l][j] = (uint32_t)lo | ((uint32_t)hi << 16);
                }
            }
        }
        w.done = true;
    }
    for (int j = 0; j < 4; j++) r[j] = w.r[lane][j];
}
}  // namespace emu
#endif

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(LLMC_CUEMU)
    emu::ldmatrix_twin<false>(r, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
#else
    __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(LLMC_CUEMU)
    emu::ldmatrix_twin<true>(r, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
#else
    __trap();
#endif
}

// ---- ex2.approx.ftz.f32: 2^x, subnormal inputs and results flushed to 0 ----
// What --use_fast_math makes of exp2f, and FlashAttention's exponential. exp2f itself is
// ex2.approx.f32, which ptxas sm_90 wraps in three more instructions for subnormal results (a
// compare and two predicated multiplies: 64 exp2f took 472 instructions, these 280). The softmax
// probabilities it takes away are below 2^-126, nothing to the sums they enter. Not volatile: a
// pure function the compiler may schedule. The emulator's twin: exp2f, subnormal results to 0.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(LLMC_CUEMU)
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;  // (y >= 0 or NaN)
#elif defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// ---- cp.async.cg.shared.global (16 bytes) + commit_group / wait_group ----
// Each thread's copies since its last commit form a group; wait<N> returns when at most N of
// this thread's groups are still in flight (their smem is then written; other threads' copies
// need a __syncthreads as well). Both addresses 16-byte aligned. The emulator's twin lands a copy
// as it is issued under the forward schedules, and under the others (cuemu::async_reads_early)
// at the wait that completes its group, the 16 bytes read at the issue: a buffer overwritten
// while a read of it may still be pending shows under the first, a read before its wait under
// the second, each as results that differ between the schedules (or are wrong).
#if defined(LLMC_CUEMU)
namespace emu {
// this thread's element of a per-thread state array (one array per OS thread, i.e. per block being
// run), fresh in each block: value-initialised, with its member `block` set to cuemu::block_serial
template <class S> S& thread_state(S (&s)[1024]) {
    S& st = s[threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)];
    if (st.block != ::cuemu::block_serial()) {
        st = S{};
        st.block = ::cuemu::block_serial();
    }
    return st;
}
struct CpCopy {
    void* dst;
    unsigned char bytes[16];
    int group;  // the commit that closes it: the thread's commits before the issue
};
struct CpState {
    uint64_t block = 0;  // cuemu::block_serial of the block these are from
    int commits = 0;
    std::vector<CpCopy> pending;  // in issue order
};
inline CpState& cp_state() {  // this thread's, fresh in each block
    static thread_local CpState s[1024];
    return thread_state(s);
}
}  // namespace emu
#endif
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
#if defined(LLMC_CUEMU)
    if (::cuemu::async_reads_early()) {
        emu::CpState& st = emu::cp_state();
        emu::CpCopy c;
        c.dst = smem;
        std::memcpy(c.bytes, gmem, 16);
        c.group = st.commits;
        st.pending.push_back(c);
    } else {
        std::memcpy(smem, gmem, 16);
    }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
#else
    __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(LLMC_CUEMU)
    if (::cuemu::async_reads_early()) emu::cp_state().commits++;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(LLMC_CUEMU)
    if (::cuemu::async_reads_early()) {  // every committed group but the N most recent lands
        emu::CpState& st = emu::cp_state();
        size_t kept = 0;
        for (const emu::CpCopy& c : st.pending)
            if (c.group < st.commits - N) std::memcpy(c.dst, c.bytes, 16);
            else st.pending[kept++] = c;
        st.pending.resize(kept);
    }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---- wgmma (sm_90a): warpgroup-wide D[64xN] (+)= A[64x16] B[16xN], A in registers, B in shared ----
// A warpgroup is 4 consecutive warps (threads 128k .. 128k + 127) executing the instruction
// together; warp q of it (q = warp % 4) owns rows 16q .. 16q + 15 of A and D, in the layouts of
// mma.m16n8k16 above (CUTLASS's SM90 GMMA traits say the same: A 64x16 "RS" and C 64xN):
//   a[0] = A[16q+g][2t, 2t+1]   a[1] = A[16q+g+8][2t, 2t+1]   a[2], a[3]: columns 2t+8, 2t+9
//   d[i][0..1] = D[16q+g][8i+2t, +1]   d[i][2..3] = D[16q+g+8][8i+2t, +1]   (i < N/8)
// So S = Q K^T lands in the registers an mma.sync kernel keeps, and acc_to_a turns it into the A
// of the next product unchanged. B (N x 16, "K-major": each of B's N columns is 16 contiguous k)
// comes from a shared-memory descriptor; the one form used here is the 128-byte swizzle:
//   a tile of rows of 128 bytes (64 16-bit k), row n at n * 128, in atoms of 8 rows (1024
//   bytes, 1024-byte aligned: SBO = 1024); the 16-byte chunk c of row n stored at chunk
//   c ^ (n % 8) (address bits 4-6 ^= bits 7-9). The k-step kc of a row starts kc * 32 bytes
//   in: the descriptor's start address advances by that, and the hardware swizzles the address
//   it forms, so the same XOR finds the chunk (LBO is unused for swizzled K-major layouts).
// TB (imm-trans-b 1, "MN-major"; not used by the kernels yet: test_gpu's ptx.wgmma_mn_major asks
// a GPU whether this reading of the ISA is the hardware's): B[k][n] at (n % 64) * 2 + (n / 64) * LBO
// + (k % 8) * 128 + (k / 8) * SBO bytes from the start, swizzled alike: a row-major [k][64 n] tile
// of 128-byte rows as it lies (CUTLASS's canonical ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))), so V or
// K could be read as they come by cp.async instead of transposed through registers.
// Ordering: wgmma.fence before the first wgmma that reads registers written since (A, D);
// commit_group closes this thread's issued wgmma into a group; wait_group<N> returns with at
// most N groups in flight, and only then may the completed groups' D be read, or their A
// registers change (wgmma_wait's operand fence keeps the compiler from moving reads of D above it,
// wgmma_keep_a the compiler from reusing A's registers before it). Shared memory written by
// threads (st.shared, cp.async) reaches wgmma's reads (the async proxy) only after
// fence.proxy.async (fence_proxy_async) and the barrier that orders the writers before the readers.
// C7520: where ptxas cannot prove a wgmma.fence and the wgmma after it warpgroup-uniform (the fence
// in one branch, its wgmma in another), it serializes every wgmma of the kernel and says so only in
// an information line; so each path of a kernel fences, issues, commits and waits in one branch
// (test_dev_cuda fails on the line).
// The emulator's twin keeps each issued wgmma and its group and computes it at the wait that
// completes that group (wait_group N: all but the N most recent), as late as the hardware may: it
// reads A's registers and B's shared memory then, and writes D then (a kernel that changes A or B,
// or reads D, before its wait sees it go wrong in CI). Under the reverse and random schedules
// (cuemu::async_reads_early) it computes each at its issue instead, as early as the hardware may
// (a kernel that issues before its operands are in shared memory, e.g. above the barrier that
// publishes other threads' copies, goes wrong there). It sums as mma_16816's twin does (k in
// order), decodes B's addresses from the descriptor's bits as the hardware does, and aborts on an
// issue with no wgmma.fence since this thread's last wait (the rule as these kernels keep it), and
// on a read of shared memory the async proxy was not shown (cuemu::async_view: a store or copy with
// no fence_proxy_async and __syncthreads after it, or one made while the wgmma was in flight).
#if defined(LLMC_CUEMU)
namespace emu {
// one issued wgmma: where its accumulators and A registers live, its descriptor and flag, and the
// product (wgmma_run<E, N, TB>)
struct WgOp {
    void (*run)(const WgOp&);
    float* d;
    const uint32_t* a;  // A's registers (nullptr: A from shared memory, desc_a)
    uint64_t desc, desc_a;
    bool accumulate;
};
struct WgState {
    uint64_t block;  // cuemu::block_serial of the block this is from
    bool fenced;
    int issued, groups;  // ops issued and not yet run; committed groups not yet completed
    int group_end[32];   // committed group i holds ops [group_end[i - 1], group_end[i]) (from 0)
    WgOp ops[32];
};
inline WgState& wg_state() {  // this thread's, fresh in each block
    static thread_local WgState s[1024];
    return thread_state(s);
}
}  // namespace emu
#endif

// The descriptor of a 128-byte-swizzled K-major tile at `tile` (shared memory, 1024-byte aligned),
// advanced `bytes` into its rows (a multiple of 16: the k-step's 32 bytes).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* tile, int bytes) {
#if defined(LLMC_CUEMU)
    const uint32_t addr = (uint32_t)((const char*)tile - ::cuemu::dynamic_smem());
#else
    const uint32_t addr = smem_addr(tile);
#endif
    const uint64_t start = ((addr + (uint32_t)bytes) >> 4) & 0x3fffu, lbo = 1, sbo = 1024 >> 4;
    return start | (lbo << 16) | (sbo << 32) | (uint64_t(1) << 62);
}
// ... of an MN-major tile (TB): 8-row groups of k 1024 bytes apart (SBO), 64-column blocks of n
// `lbo` bytes apart
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(const void* tile, int bytes, int lbo) {
    return (wgmma_desc_sw128(tile, bytes) & ~(uint64_t(0x3fff) << 16)) | (uint64_t((lbo >> 4) & 0x3fff) << 16);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(LLMC_CUEMU)
    emu::wg_state().fenced = true;
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(LLMC_CUEMU)
    emu::WgState& w = emu::wg_state();
    if (w.groups == 32) {
        std::fprintf(stderr, "cuemu: wgmma: 32 groups committed and not waited for\n");
        std::abort();
    }
    w.group_end[w.groups++] = w.issued;  // (an empty group is a group, as wait_group counts them)
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// wait_group N: returns with at most the N most recent committed groups in flight; then the
// compiler fence over d (NT x 4 floats), the accumulators of the groups completed (reads of d stay
// below it)
template <int N, int NT> __device__ __forceinline__ void wgmma_wait(float (&d)[NT][4]) {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group's immediate");
#if defined(LLMC_CUEMU)
    emu::WgState& w = emu::wg_state();  // the oldest groups' products, in issue order
    const int done = w.groups - N;
    if (done > 0) {
        const int upto = w.group_end[done - 1];
        for (int i = 0; i < upto; i++) w.ops[i].run(w.ops[i]);
        for (int i = upto; i < w.issued; i++) w.ops[i - upto] = w.ops[i];
        for (int g = done; g < w.groups; g++) w.group_end[g - done] = w.group_end[g] - upto;
        w.issued -= upto, w.groups -= done;
    }
    w.fenced = false;
    (void)d;
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
    for (int i = 0; i < NT; i++)
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
#else
    __trap();
#endif
}
template <int NT> __device__ __forceinline__ void wgmma_wait0(float (&d)[NT][4]) { wgmma_wait<0>(d); }
// After the wait that completes a wgmma whose A came from registers a: keeps a's registers holding
// their values until here (the compiler may otherwise give them to other values once the issue has
// read them, while the tensor cores still may)
__device__ __forceinline__ void wgmma_keep_a(const uint32_t (&a)[4][4]) {
#if !defined(LLMC_CUEMU) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    for (int i = 0; i < 4; i++)
        for (int e = 0; e < 4; e++) asm volatile("" ::"r"(a[i][e]) : "memory");
#else
    (void)a;
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#if defined(LLMC_CUEMU)
    ::cuemu::fence_proxy_async();  // the next barrier shows shared memory to the twin's reads
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#if defined(LLMC_CUEMU)
namespace emu {
// the twin's product of one wgmma (WgOp), at its wait: every lane of the warp runs its ops in the
// same order, so the register exchange lines up as the mma's does
template <class E, int N, bool TB> void wgmma_run(const WgOp& op) {
    const uint32_t* a = op.a;  // (nullptr: A from shared memory)
    const uint64_t desc_b = op.desc;
    const bool accumulate = op.accumulate;
    float (*d)[4] = reinterpret_cast<float (*)[4]>(op.d);
    const int lane = (int)(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    const char* smem = ::cuemu::dynamic_smem();
    // byte `off` of a 128-byte-swizzled tile (A's or B's), the address the descriptor forms, where
    // the swizzle puts it (whole 16-byte chunks move); the half there
    auto swizzled = [](uint32_t off) { return off ^ (((off >> 7) & 7u) << 4); };
    auto half_at = [&](uint32_t off) {
        unsigned short bits;
        std::memcpy(&bits, smem + swizzled(off), 2);
        return half_of<E>(bits);
    };
    auto eight_at = [&](uint32_t off, float* x) {  // the 8 halves of the 16-byte chunk at off
        unsigned short bits[8];
        std::memcpy(bits, smem + swizzled(off), 16);
        for (int e = 0; e < 8; e++) x[e] = half_of<E>(bits[e]);
    };
    // the byte of row r's element k of a K-major tile (start and SBO from `desc`); of B[k][n]
    auto kmajor_off = [](uint64_t desc, uint32_t r, uint32_t k) {
        const uint32_t start = uint32_t(desc & 0x3fffu) << 4, sbo = uint32_t((desc >> 32) & 0x3fffu) << 4;
        return start + (r / 8) * sbo + (r % 8) * 128 + k * 2;
    };
    const uint32_t start = uint32_t(desc_b & 0x3fffu) << 4, sbo = uint32_t((desc_b >> 32) & 0x3fffu) << 4;
    const uint32_t lbo = uint32_t((desc_b >> 16) & 0x3fffu) << 4;
    auto b_off = [&](int n, int k) {
        return TB ? start + uint32_t(n % 64) * 2 + uint32_t(n / 64) * lbo + uint32_t(k % 8) * 128 +
                        uint32_t(k / 8) * sbo
                  : kmajor_off(desc_b, uint32_t(n), uint32_t(k));
    };
    // The async proxy's view (cuemu::async_view): every 16-byte chunk this op reads, once a warp,
    // must hold what it was shown; B's chunks hold 8 n (MN-major) or 8 k (K-major), A's (from
    // shared memory) 8 k
    if (lane == 0) {
        const char* view = ::cuemu::async_view();
        auto seen = [&](uint32_t off) {
            off = swizzled(off);
            if (std::memcmp(smem + off, view + off, 16) != 0) ::cuemu::async_view_stale(off, "wgmma");
        };
        for (int n = 0; n < N; n += TB ? 8 : 1)
            for (int k = 0; k < 16; k += TB ? 1 : 8) seen(b_off(n, k));
        if (!a)
            for (uint32_t m = 0; m < 64; m++)
                for (uint32_t k = 0; k < 16; k += 8) seen(kmajor_off(op.desc_a, m, k));
    }
    float av[2][16];  // rows g, g + 8 of this warp's A
    if (a) {          // from the warp's registers, as mma_16816's twin exchanges them
        Regs& w = mma_regs();
        for (int i = 0; i < 4; i++) w.a[lane][i] = a[i];
        __syncwarp();
        for (int q = 0; q < 4; q++)
            for (int h = 0; h < 2; h++) {
                const uint32_t* ra = w.a[g * 4 + q];
                av[h][2 * q] = lo16<E>(ra[h]), av[h][2 * q + 1] = hi16<E>(ra[h]);
                av[h][2 * q + 8] = lo16<E>(ra[h + 2]), av[h][2 * q + 9] = hi16<E>(ra[h + 2]);
            }
    } else {  // from shared memory: row m = 16 (warp % 4) + g + 8 h of the warpgroup's 64 (k 0-7, 8-15)
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k += 8)
                eight_at(kmajor_off(op.desc_a, 16 * ((threadIdx.x / 32) % 4) + g + 8 * h, uint32_t(k)), &av[h][k]);
    }
    for (int i = 0; i < N / 8; i++) {
        float bv[2][16];  // B[k][n] of columns n = 8i + 2t + h (K-major: k 0-7 and 8-15 a chunk each)
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k += TB ? 1 : 8) {
                if (TB) bv[h][k] = half_at(b_off(8 * i + 2 * t + h, k));
                else eight_at(b_off(8 * i + 2 * t + h, k), &bv[h][k]);
            }
        float s0 = accumulate ? d[i][0] : 0.0f, s1 = accumulate ? d[i][1] : 0.0f;
        float s2 = accumulate ? d[i][2] : 0.0f, s3 = accumulate ? d[i][3] : 0.0f;
        for (int k = 0; k < 16; k++) {
            s0 = fmaf(av[0][k], bv[0][k], s0);
            s1 = fmaf(av[0][k], bv[1][k], s1);
            s2 = fmaf(av[1][k], bv[0][k], s2);
            s3 = fmaf(av[1][k], bv[1][k], s3);
        }
        d[i][0] = s0, d[i][1] = s1, d[i][2] = s2, d[i][3] = s3;
    }
}
// the twin's issue: the ordering and the forms it checks, then the op kept for its wait
inline void wg_issue(const WgOp& op) {
    WgState& st = wg_state();
    const char* why = !st.fenced              ? "issued with no wgmma.fence since this thread's last wait"
                      : st.issued == 32       ? "32 issued and not waited for"
                      : (op.desc >> 62) != 1 ? "the twin reads 128-byte-swizzled B only"
                      : !op.a && (op.desc_a >> 62) != 1 ? "the twin reads 128-byte-swizzled A only"
                                                        : nullptr;
    if (why) {
        std::fprintf(stderr, "cuemu: wgmma %s\n", why);
        std::abort();
    }
    if (::cuemu::async_reads_early()) op.run(op);  // computed now (its group then counts no ops)
    else st.ops[st.issued++] = op;
}
}  // namespace emu
#endif
// The 32 accumulators of an m64n64 wgmma's D (operands 0-31) in its asm, and the register list
#define LLMC_WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define LLMC_WG_D64 \
    LLMC_WG_D(0), LLMC_WG_D(1), LLMC_WG_D(2), LLMC_WG_D(3), LLMC_WG_D(4), LLMC_WG_D(5), LLMC_WG_D(6), LLMC_WG_D(7)
#define LLMC_WG_R64                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
    "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}, N = 64 or 128:
// d = a b (+ d if accumulate); TB: B MN-major (imm-trans-b 1)
template <class E, int N, bool TB = false>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                             bool accumulate) {
    static_assert(std::is_same<E, __nv_bfloat16>::value || std::is_same<E, __half>::value, "bf16 or fp16 operands");
    static_assert(N == 64 || N == 128, "the shapes the flash forward uses");
#if defined(LLMC_CUEMU)
    emu::wg_issue(emu::WgOp{&emu::wgmma_run<E, N, TB>, &d[0][0], a, desc_b, 0, accumulate});
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // the operands: N / 2 accumulators, a's four registers, the accumulate flag, the descriptor, TB
#define LLMC_WG_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"((int)accumulate), "l"(desc_b), "n"((int)TB)
    constexpr bool bf = std::is_same<E, __nv_bfloat16>::value;
    if constexpr (N == 64) {
#define LLMC_WG_64(T)                                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " LLMC_WG_R64 ", "              \
                 "{%32, %33, %34, %35}, %37, p, 1, 1, %38;\n}\n"                                         \
                 : LLMC_WG_D64                                                                           \
                 : LLMC_WG_IN)
        if constexpr (bf) LLMC_WG_64("bf16");
        else LLMC_WG_64("f16");
#undef LLMC_WG_64
    } else {
#define LLMC_WG_128(T)                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " "                              \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "      \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "      \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "     \
                 "{%64, %65, %66, %67}, %69, p, 1, 1, %70;\n}\n"                                         \
                 : LLMC_WG_D(0), LLMC_WG_D(1), LLMC_WG_D(2), LLMC_WG_D(3), LLMC_WG_D(4),                 \
                   LLMC_WG_D(5), LLMC_WG_D(6), LLMC_WG_D(7), LLMC_WG_D(8), LLMC_WG_D(9),                 \
                   LLMC_WG_D(10), LLMC_WG_D(11), LLMC_WG_D(12), LLMC_WG_D(13), LLMC_WG_D(14),            \
                   LLMC_WG_D(15)                                                                         \
                 : LLMC_WG_IN)
        if constexpr (bf) LLMC_WG_128("bf16");
        else LLMC_WG_128("f16");
#undef LLMC_WG_128
    }
#undef LLMC_WG_IN
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}

// wgmma.mma_async.sync.aligned.m64n64k16.f32.{bf16,f16}.{bf16,f16} with A from shared memory too
// ("SS"): d = a b (+ d if accumulate), A (64 x 16, K-major: row m's 16 k contiguous) by a
// descriptor of the same form as B's (wgmma_desc_sw128: row m of the warpgroup's 64 at (m / 8) SBO
// + (m % 8) 128 bytes from the start, swizzled), warp q of the warpgroup getting rows 16q .. 16q + 15
// of D as with A from registers. No register of A to keep: only D's wait matters.
template <class E>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
    static_assert(std::is_same<E, __nv_bfloat16>::value || std::is_same<E, __half>::value, "bf16 or fp16 operands");
#if defined(LLMC_CUEMU)
    emu::wg_issue(emu::WgOp{&emu::wgmma_run<E, 64, false>, &d[0][0], nullptr, desc_b, desc_a, accumulate});
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_WG_SS(T)                                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " LLMC_WG_R64 ", "              \
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                         \
                 : LLMC_WG_D64                                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"((int)accumulate))
    if constexpr (std::is_same<E, __nv_bfloat16>::value) LLMC_WG_SS("bf16");
    else LLMC_WG_SS("f16");
#undef LLMC_WG_SS
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
    __trap();
#endif
}
#undef LLMC_WG_D
#undef LLMC_WG_D64
#undef LLMC_WG_R64

}  // namespace ptx
