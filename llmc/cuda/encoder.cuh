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

// The backward's sort on the device: key[i] = the local row of position i's token (rows for a
// token outside the slice: sorted last, skipped), pos[i] = i. A stable radix sort by key then
// lists each row's positions in increasing order.
__global__ void encoder_backward_keys_kernel(uint32_t* key, int32_t* pos, const int32_t* tokens, int N, int vocab_begin,
                                             int rows) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const long long row = (long long)tokens[i] - vocab_begin;
    key[i] = (uint32_t)(row >= 0 && row < rows ? row : rows);
    pos[i] = i;
}

// dwte[row, c] += sum over the positions holding the token of local row `row` (in increasing
// position order) of dout[pos, c], from the sorted (key, pos): block k of grid (N, ceil(C /
// blockDim.x)) owns the row starting at sorted index k (the others return), each thread one
// (row, channel): no two threads touch the same element, no atomics.
template <class T>
__global__ void encoder_backward_wte_kernel(T* dwte, const T* dout, const uint32_t* key, const int32_t* pos, int N,
                                            int rows, int C) {
    const int k = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const uint32_t row = key[k];
    if (row >= (uint32_t)rows || (k > 0 && key[k - 1] == row)) return;
    float acc = 0.0f;
    for (int i = k; i < N && key[i] == row; i++) acc += to_f32(dout[(long long)pos[i] * C + c]);
    const long long o = (long long)row * C + c;
    dwte[o] = from_f32<T>(to_f32(dwte[o]) + acc);
}
