// The attention entry points CudaOps calls (llmc/cuda/attention.cuh defines them with every kernel
// they launch; llmc/cuda/attention_f32.cu, _bf16.cu and _f16.cu instantiate them, a type each).
// cuda_ops.cu includes this header alone and declares the instantiations extern, so the attention
// kernels compile in their own translation units beside the rest of the backend, and a change to
// them (a planted bug of test/cuemu among them) rebuilds only those.
#pragma once
#include "llmc/backend/positions.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/kernel_ways.h"

namespace attn {

// ways: the flash kernels' ways (KernelWays: CudaOps's; dev/cuda's versions set their own)
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int HS, cudaStream_t st,
                       const KernelWays& ways);
// Tq query rows of qkv_q against Tk key rows of qkv_kv (the whole attention: qkv_q == qkv_kv,
// Tq == Tk, default positions)
template <class T>
void attention_block_forward(T* out, float* lse, const T* qkv_q, const T* qkv_kv, int B, int Tq, int Tk, int NH,
                             int NKV, int HS, SeqPositions qp, SeqPositions kp, cudaStream_t st,
                             const KernelWays& ways);
template <class T>
void attention_merge(T* out, float* lse, const T* blk_out, const float* blk_lse, int B, int T_, int NH, int HS,
                     cudaStream_t st);
// D: scratch of B*NH*Tq floats. accumulate: += into dq_dst's q heads and dkv's k, v heads (else =).
// ds_scratch: where the flash backward keeps dS or its dQ accumulators when ways.bwd_dq asks; nullptr:
// it recomputes.
template <class T>
void attention_block_backward(T* dq_dst, T* dkv, const T* dout, const T* qkv_q, const T* qkv_kv, const T* out,
                              const float* lse, float* D, int B, int Tq, int Tk, int NH, int NKV, int HS,
                              SeqPositions qp, SeqPositions kp, bool accumulate, cudaStream_t st,
                              const KernelWays& ways, GrowBuffer* ds_scratch = nullptr);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* D, int B,
                        int T_, int NH, int NKV, int HS, cudaStream_t st, const KernelWays& ways,
                        GrowBuffer* ds_scratch = nullptr);

// The instantiations for element type T: attention_<T>.cu defines them
// (LLMC_ATTENTION_ENTRY_POINTS(, T)), cuda_ops.cu declares them (LLMC_ATTENTION_ENTRY_POINTS(extern, T)).
#define LLMC_ATTENTION_ENTRY_POINTS(EXTERN, T)                                                                     \
    EXTERN template void attention_forward<T>(T*, float*, const T*, int, int, int, int, int, cudaStream_t,       \
                                              const KernelWays&);                                                 \
    EXTERN template void attention_block_forward<T>(T*, float*, const T*, const T*, int, int, int, int, int, int, \
                                                    SeqPositions, SeqPositions, cudaStream_t, const KernelWays&); \
    EXTERN template void attention_merge<T>(T*, float*, const T*, const float*, int, int, int, int, cudaStream_t); \
    EXTERN template void attention_block_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const float*, \
                                                     float*, int, int, int, int, int, int, SeqPositions,          \
                                                     SeqPositions, bool, cudaStream_t, const KernelWays&,         \
                                                     GrowBuffer*);                                                \
    EXTERN template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, float*, int, int, \
                                               int, int, int, cudaStream_t, const KernelWays&, GrowBuffer*);

}  // namespace attn
