// Token + position embedding over a (possibly vocabulary-sliced) wte, forward and a
// deterministic backward.
#pragma once
#include "llmc/cuda/common.cuh"

// wte holds the vocabulary rows [vocab_begin, vocab_begin + rows).
// out[n, c] = wte[tokens[n] - vocab_begin, c] (0 for tokens outside the slice)
//             + wpe[n % T, c] (when wpe is not null)
template <class T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int T_,
                                       int C, int vocab_begin, int rows) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    int t = n % T_;
    const long long row = (long long)tokens[n] - vocab_begin;
    float v = 0.0f;
    if (row >= 0 && row < rows) v = to_f32(wte[row * C + c]);
    if (wpe) v += to_f32(wpe[(long long)t * C + c]);
    out[idx] = from_f32<T>(v);
}

// dwpe[t, c] += sum_b dout[b, t, c], b in increasing order. One thread per (t, c).
template <class T>
__global__ void encoder_backward_wpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T_ * C) return;
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += to_f32(dout[(long long)b * T_ * C + idx]);
    dwpe[idx] = from_f32<T>(to_f32(dwpe[idx]) + acc);
}

// dwte[row, c] += sum over the positions holding the token of local row `row` (in
// increasing position order) of dout[pos, c]. The positions are bucket-sorted by id on the
// host beforehand (tokens outside the slice dropped): seg_rows[s] is the s-th distinct
// local row, its positions are sorted_pos[seg_start[s] .. seg_start[s+1]).
// grid = (num_segments, ceil(C / blockDim.x)); each thread owns one (row, channel): no two
// threads touch the same element, no atomics.
template <class T>
__global__ void encoder_backward_wte_kernel(T* dwte, const T* dout, const int32_t* seg_rows, const int32_t* seg_start,
                                            const int32_t* sorted_pos, int C) {
    int s = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int begin = seg_start[s], end = seg_start[s + 1];
    float acc = 0.0f;
    for (int i = begin; i < end; i++) acc += to_f32(dout[(long long)sorted_pos[i] * C + c]);
    long long o = (long long)seg_rows[s] * C + c;
    dwte[o] = from_f32<T>(to_f32(dwte[o]) + acc);
}
