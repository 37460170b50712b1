// CudaOps: the Ops interface (llmc/backend/ops.h) on one CUDA device, fp32, bf16 or fp16 tensors.
// Every op runs on the backend's stream; the host-facing copies synchronise it.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#ifndef LLMC_CUEMU
#include <cub/cub.cuh>
#endif

#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/attention_ops.h"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/fp8_ops.h"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/llama.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/moe.cuh"
#include "llmc/cuda/step_graph.cuh"
#include "llmc/backend/ops.h"
#include "llmc/cuda/cuda_ops.h"
#include "llmc/cuda/device_arch.h"

// Key-value radix sort of n (key, position) pairs by the keys' low `bits` bits, stable (cub's
// DeviceRadixSort: a first call with tmp == nullptr sizes its scratch). The emulator of CI
// (test/cuemu) has no cub: its device memory is host memory and its streams are synchronous, so
// a stable sort on the host is the same sort.
static cudaError_t sort_pairs(void* tmp, size_t& tmp_bytes, const uint32_t* keys, uint32_t* skeys, const int32_t* pos,
                              int32_t* spos, int n, int bits, cudaStream_t stream) {
#ifdef LLMC_CUEMU
    (void)bits;
    (void)stream;
    if (!tmp) {
        tmp_bytes = 1;
        return cudaSuccess;
    }
    if (!queue_work()) return cudaSuccess;
    cuemu::enqueue([=] {  // (a stream capture records it)
        std::vector<int> idx(n);
        for (int i = 0; i < n; i++) idx[i] = i;
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return keys[a] < keys[b]; });
        for (int i = 0; i < n; i++) {
            skeys[i] = keys[idx[i]];
            spos[i] = pos[idx[i]];
        }
    });
    return cudaSuccess;
#else
    if (tmp && !queue_work()) return cudaSuccess;
    return cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, skeys, pos, spos, n, 0, bits, stream);
#endif
}
#include "llmc/backend/rope.h"

namespace attn {  // instantiated in llmc/cuda/attention_{f32,bf16,f16}.cu
LLMC_ATTENTION_ENTRY_POINTS(extern, float)
LLMC_ATTENTION_ENTRY_POINTS(extern, bf16)
LLMC_ATTENTION_ENTRY_POINTS(extern, f16)
}  // namespace attn

namespace {

// Calls f(float{}), f(bf16{}) or f(f16{}) according to the dtype (the element type of the kernel).
template <class F>
void dispatch(DType dt, F&& f) {
    switch (dt) {
        case DType::F32: f(float{}); return;
        case DType::BF16: f(bf16{}); return;
        case DType::F16: f(f16{}); return;
        default: LLMC_ASSERT(false, strfmt("CUDA backend: unsupported dtype %s", dtype_name(dt)));
    }
}

template <class T> T* P(const Tensor& t) { return static_cast<T*>(t.ptr); }

void same_dtype(std::initializer_list<const Tensor*> ts) {
    DType d = DType::F32;
    bool first = true;
    for (const Tensor* t : ts) {
        if (!t->ptr) continue;
        if (first) {
            d = t->dtype;
            first = false;
        }
        LLMC_ASSERT(t->dtype == d, "CUDA backend: tensors of one op must share the dtype");
    }
}

// dst[i] = src[i] between fp32 and bf16 or fp16 (round to nearest even)
template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_f32<D>(to_f32(src[i]));
}

inline int blocks_for(long long n, int threads) { return (int)std::max<long long>(1, (n + threads - 1) / threads); }

class CudaOps : public Ops {
public:
    explicit CudaOps(int device) : device_(device) {
        CUDA_CHECK(cudaSetDevice(device));
        CUDA_CHECK(cudaStreamCreate(&stream_));
        lt_.init();
    }
    void set_ways(const KernelWays& w) { ways_ = w; }
    ~CudaOps() override {
        cudaStreamSynchronize(stream_);
        for (cudaStream_t& s : copy_streams_)
            if (s) cudaStreamSynchronize(s), cudaStreamDestroy(s);
        for (cudaEvent_t& e : copy_events_)
            if (e) cudaEventDestroy(e);
        if (queued_) cudaEventDestroy(queued_);
        for (cudaEvent_t e : copy_tails_)
            if (e) cudaEventDestroy(e);
        for (GrowBuffer& b : scratch_) b.release();
        for (GrowBuffer* b :
             {&sumsq_regions_, &sumsq_part_, &adamw_desc_, &adamw_chunks_, &bias_scratch_, &ds_scratch_})
            b->release();
        for (Upload& u : uploads_) {
            if (u.host) cudaFreeHost(u.host);
            if (u.done) cudaEventDestroy(u.done);
        }
        lt_.destroy();
        cudaStreamDestroy(stream_);
    }
    std::string name() const override { return "cuda"; }
    std::string device_name() const override {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
        return prop.name;
    }
    size_t peak_memory_bytes() const override { return peak_used_; }
    void* compute_stream() const override { return stream_; }
    OpsCounters counters() const override {
        OpsCounters c = counters_;
        c.launches += cuda_launch_count;
        c.allocs = cuda_alloc_count;
        return c;
    }

    // ---- memory ----
    void* alloc(size_t bytes) override {
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        cudaError_t err = device_malloc(&p, bytes);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            throw UserError(strfmt("CUDA out of memory: allocating %zu bytes (%.2f GiB free of %.2f GiB)", bytes,
                                   fr / 1073741824.0, tot / 1073741824.0));
        }
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        note_memory_in_use();
        return p;
    }
    void release(void* p) override {
        if (!p) return;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(device_free(p));
    }
    void zero(Tensor t) override {
        if (!t.n) return;
        ++counters_.launches;
        if (queue_work()) CUDA_CHECK(cudaMemsetAsync(t.ptr, 0, t.bytes(), stream_));
    }
    void copy(Tensor dst, Tensor src) override {
        LLMC_ASSERT(dst.n == src.n, "copy: size mismatch");
        if (!dst.n) return;
        if (dst.dtype == src.dtype) {
            ++counters_.launches;
            if (queue_work())
                CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, src.bytes(), cudaMemcpyDeviceToDevice, stream_));
            return;
        }
        const int threads = 256;
        dispatch(dst.dtype, [&](auto d) {
            using D = decltype(d);
            dispatch(src.dtype, [&](auto s) {
                using S = decltype(s);
                auto kernel = convert_kernel<D, S>;  // one name for the launch macro
                LLMC_LAUNCH(kernel, blocks_for((long long)dst.n, threads), threads, 0, stream_, P<D>(dst), P<S>(src),
                            dst.n);
            });
        });
        CUDA_CHECK(cudaGetLastError());
    }
    void to_host_f32(float* dst, Tensor src) override {
        if (!src.n) return;
        if (src.dtype == DType::F32) {
            to_host_bytes(dst, src.ptr, src.bytes());
            return;
        }
        LLMC_ASSERT(src.dtype == DType::BF16 || src.dtype == DType::F16, "to_host_f32: unsupported dtype");
        // in slices of up to kHalfSlice elements through one buffer: a bf16 model's weights read back
        // whole (a checkpoint's) took a second, fresh copy of them (3 GB at 1.5B parameters)
        const size_t slice = std::min(src.n, kHalfSlice);
        std::unique_ptr<uint16_t[]> tmp(new uint16_t[slice]);
        const bool f16 = src.dtype == DType::F16;
        for (size_t at = 0; at < src.n; at += slice) {
            const long k = long(std::min(slice, src.n - at));
            to_host_bytes(tmp.get(), static_cast<const uint16_t*>(src.ptr) + at, size_t(k) * sizeof(uint16_t));
            float* out = dst + at;
#pragma omp parallel for schedule(static) if (k >= (1 << 22))
            for (long i = 0; i < k; i++) out[i] = f16 ? f16_bits_to_f32(tmp[i]) : bf16_bits_to_f32(tmp[i]);
        }
    }
    void from_host_f32(Tensor dst, const float* src) override {
        if (!dst.n) return;
        if (dst.dtype == DType::F32) {
            from_host_bytes(dst.ptr, src, dst.bytes());
            return;
        }
        LLMC_ASSERT(dst.dtype == DType::BF16 || dst.dtype == DType::F16, "from_host_f32: unsupported dtype");
        // in slices through one buffer, as to_host_f32 (each upload of a slice waits for its copy)
        const size_t slice = std::min(dst.n, kHalfSlice);
        std::unique_ptr<uint16_t[]> tmp(new uint16_t[slice]);
        const bool f16 = dst.dtype == DType::F16;
        for (size_t at = 0; at < dst.n; at += slice) {
            const long k = long(std::min(slice, dst.n - at));
            const float* in = src + at;
#pragma omp parallel for schedule(static) if (k >= (1 << 22))
            for (long i = 0; i < k; i++) tmp[i] = f16 ? f32_to_f16_bits(in[i]) : f32_to_bf16_bits(in[i]);
            from_host_bytes(static_cast<uint16_t*>(dst.ptr) + at, tmp.get(), size_t(k) * sizeof(uint16_t));
        }
    }
    static constexpr size_t kHalfSlice = size_t(1) << 26;  // 64M elements: 128 MB of bf16
    std::string graph_step_begin(uint64_t key) override {
        return graph_.begin(stream_, key, counters_.host_syncs - upload_waits_);
    }
    void to_host_bytes(void* dst, const void* src, size_t bytes) override {
        if (graph_.in_region()) graph_.end(counters_.host_syncs - upload_waits_);
        if (!bytes) return;
        counters_.d2h_bytes += bytes;
        ++counters_.host_syncs;
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    // Small uploads (tokens, targets, tables) go through a ring of pinned slots, so that the host
    // does not wait for the stream (it waits only for a slot whose previous copy is still queued);
    // a larger one waits for its copy. In a CUDA graph's capture or replay every upload goes
    // through the graph's pinned arena instead, without either wait (StepGraph::upload).
    void from_host_bytes(void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        counters_.h2d_bytes += bytes;
        if (graph_.upload(dst, src, bytes)) return;
        if (bytes <= kUploadNoSync) {
            Upload& u = uploads_[next_upload_++ % kUploadSlots];
            if (!u.host) {
                CUDA_CHECK(cudaMallocHost(&u.host, kUploadNoSync));
                CUDA_CHECK(cudaEventCreateWithFlags(&u.done, cudaEventDisableTiming));
            } else {
                const cudaError_t q = cudaEventQuery(u.done);
                if (q == cudaErrorNotReady) {
                    ++counters_.host_syncs;
                    ++upload_waits_;
                    CUDA_CHECK(cudaEventSynchronize(u.done));
                } else {
                    CUDA_CHECK(q);
                }
            }
            std::memcpy(u.host, src, bytes);
            CUDA_CHECK(cudaMemcpyAsync(dst, u.host, bytes, cudaMemcpyHostToDevice, stream_));
            CUDA_CHECK(cudaEventRecord(u.done, stream_));
            return;
        }
        ++counters_.host_syncs;
        upload_waits_ += graph_.in_region();  // (a warm-up's: the graph's upload will not wait)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may go away after return
    }
    void synchronize() override {
        ++counters_.host_syncs;
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        note_memory_in_use();
    }

    // ---- pinned host memory, copies on two copy streams (one per direction) ----
    void* alloc_host(size_t bytes) override {
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        if (cudaMallocHost(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            throw UserError(strfmt("out of pinned host memory allocating %zu bytes", bytes));
        }
        std::memset(p, 0, bytes);
        return p;
    }
    void release_host(void* p) override {
        if (!p) return;
        for (cudaStream_t s : copy_streams_)
            if (s) CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaFreeHost(p));
    }
    uint64_t copy_to_host_async(void* dst, const void* src, size_t bytes) override {
        counters_.d2h_bytes += bytes;
        return copy_async(0, dst, src, bytes, cudaMemcpyDeviceToHost);
    }
    uint64_t copy_from_host_async(void* dst, const void* src, size_t bytes) override {
        counters_.h2d_bytes += bytes;
        return copy_async(1, dst, src, bytes, cudaMemcpyHostToDevice);
    }
    void wait_copy(uint64_t id) override {
        if (id == 0) return;
        ++counters_.host_syncs;
        if (id + kCopyEvents <= copies_) {  // its event was recorded again since: wait for everything
            for (cudaStream_t s : copy_streams_)
                if (s) CUDA_CHECK(cudaStreamSynchronize(s));
            return;
        }
        CUDA_CHECK(cudaEventSynchronize(copy_events_[id % kCopyEvents]));
    }
    // a wait of the compute stream on the copy's event (no host wait, no launch)
    void order_after_copy(uint64_t id) override {
        if (id == 0) return;
        if (id + kCopyEvents <= copies_) {  // its event was recorded again since: after every copy queued so far
            for (int dir = 0; dir < 2; dir++) {
                if (!copy_streams_[dir]) continue;
                if (!copy_tails_[dir]) CUDA_CHECK(cudaEventCreateWithFlags(&copy_tails_[dir], cudaEventDisableTiming));
                CUDA_CHECK(cudaEventRecord(copy_tails_[dir], copy_streams_[dir]));
                CUDA_CHECK(cudaStreamWaitEvent(stream_, copy_tails_[dir], 0));
            }
            return;
        }
        CUDA_CHECK(cudaStreamWaitEvent(stream_, copy_events_[id % kCopyEvents], 0));
    }

    // ---- embedding ----
    void encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                         int vocab_begin) override {
        same_dtype({&out, &wte, &wpe});
        const int rows = slice_rows(wte, C, vocab_begin, "encoder_forward");
        LLMC_ASSERT(!wpe.n || wpe.n >= (size_t)T * C, "encoder_forward: wpe too small");
        const long long n = (long long)B * T * C;
        if (!n) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(encoder_forward_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(out), tokens, P<T_>(wte),
                        wpe.n ? P<T_>(wpe) : nullptr, B * T, T, C, vocab_begin, rows);
        });
        CUDA_CHECK_LAUNCH();
    }
    void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                          int vocab_begin) override {
        same_dtype({&dwte, &dwpe, &dout});
        const int rows = slice_rows(dwte, C, vocab_begin, "encoder_backward");
        LLMC_ASSERT(!dwpe.n || dwpe.n >= (size_t)T * C, "encoder_backward: dwpe too small");
        const int N = B * T;
        if (!N || !C) return;
        // the positions sorted by their token's row on the device (stable: positions ascending
        // within a row), no read back; tokens of other slices sort last and are skipped
        int bits = 1;
        while (bits < 31 && (1LL << bits) <= rows) bits++;  // keys in [0, rows]
        uint32_t* keys = static_cast<uint32_t*>(scratch(0, (size_t)4 * N * sizeof(int32_t)));
        uint32_t* skeys = keys + N;
        int32_t *pos = reinterpret_cast<int32_t*>(keys + 2 * N), *spos = pos + N;
        size_t temp = 0;
        CUDA_CHECK(sort_pairs(nullptr, temp, keys, skeys, pos, spos, N, bits, stream_));
        void* tmp = scratch(1, std::max<size_t>(temp, 1));
        LLMC_LAUNCH(encoder_backward_keys_kernel, blocks_for(N, 256), 256, 0, stream_, keys, pos, tokens, N,
                    vocab_begin, rows);
        CUDA_CHECK_LAUNCH();
        ++counters_.launches;  // (cub's sort: counted as one)
        CUDA_CHECK(sort_pairs(tmp, temp, keys, skeys, pos, spos, N, bits, stream_));
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            if (dwpe.n) {
                LLMC_LAUNCH(encoder_backward_wpe_kernel<T_>, blocks_for((long long)T * C, 256), 256, 0, stream_,
                            P<T_>(dwpe), P<T_>(dout), B, T, C);
                CUDA_CHECK_LAUNCH();
            }
            if (rows > 0) {
                dim3 grid(N, ceil_div(C, 128));
                LLMC_LAUNCH(encoder_backward_wte_kernel<T_>, grid, 128, 0, stream_, P<T_>(dwte), P<T_>(dout), skeys,
                            spos, N, rows, C);
                CUDA_CHECK_LAUNCH();
            }
        });
    }

    // ---- layernorm (llmc/cuda/layernorm.cuh) ----
    void layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N,
                           int C) override {
        same_dtype({&out, &inp, &w, &b});
        if (!N) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_layernorm_forward<T_>(stream_, P<T_>(out), mean, rstd, nullptr, P<T_>(inp), nullptr, nullptr,
                                         P<T_>(w), P<T_>(b), N, C);
        });
        CUDA_CHECK_LAUNCH();
    }
    void fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a, Tensor b,
                                          Tensor w, Tensor bias, int N, int C) override {
        same_dtype({&residual, &out, &a, &b, &w, &bias});
        if (!N) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_layernorm_forward<T_>(stream_, P<T_>(out), mean, rstd, P<T_>(residual), nullptr, P<T_>(a),
                                         P<T_>(b), P<T_>(w), P<T_>(bias), N, C);
        });
        CUDA_CHECK_LAUNCH();
    }
    void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, const float* mean,
                            const float* rstd, int N, int C) override {
        same_dtype({&dinp, &dw, &db, &dout, &inp, &w});
        if (!N) return;
        float* partial = static_cast<float*>(scratch(1, layernorm_backward_partial_floats(N, C) * sizeof(float)));
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_norm_backward<T_>(stream_, P<T_>(dinp), P<T_>(dw), P<T_>(db), partial, P<T_>(dout), P<T_>(inp),
                                     P<T_>(w), mean, rstd, N, C, ways_.ln_bwd_registers);
        });
        CUDA_CHECK_LAUNCH();
    }
    void residual_forward(Tensor out, Tensor a, Tensor b) override {
        same_dtype({&out, &a, &b});
        LLMC_ASSERT(a.n == out.n && b.n == out.n, "residual_forward: size mismatch");
        if (!out.n) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_residual_forward<T_>(stream_, P<T_>(out), P<T_>(a), P<T_>(b), (long long)out.n);
        });
        CUDA_CHECK_LAUNCH();
    }

    // ---- matmul ----
    // One cuBLASLt GEMM whose epilogue adds the bias and, with gelu, applies the GELU and writes
    // the pre-activation as its aux output (GELU_AUX_BIAS). Where it cannot (a bias not 16-byte
    // aligned, OC not a multiple of 8 for the aux leading dimension, no algorithm accepted for the
    // problem), the GEMM writes the pre-activation with the bias epilogue (or an add_bias_kernel)
    // and gelu_forward_kernel follows. The way is chosen once per problem (LtAlgoCache), so a
    // layer run again (recomputation) runs it alike, bit for bit.
    void matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                        bool gelu) override {
        same_dtype({&out, &pre_gelu, &inp, &w, &bias});
        if (!N || !OC) return;
        LLMC_ASSERT(!gelu || pre_gelu.ptr, "matmul_forward: gelu needs pre_gelu");
        const bool bias_epi = bias.ptr && aligned16(bias.ptr);
        // column-major view: dst^T[OC, N] = w^T-as-stored[IC, OC]^T * inp^T[IC, N]
        LtGemm g{gelu ? pre_gelu.ptr : out.ptr, w.ptr, inp.ptr, OC, N, IC, true, false, IC, IC, OC, 0.0f,
                 lt_type(out.dtype)};
        g.bias = bias_epi ? bias.ptr : nullptr;
        if (gelu && (bias_epi || !bias.ptr) && OC % 8 == 0) {
            LtGemm fused = g;
            fused.D = out.ptr, fused.gelu_aux = pre_gelu.ptr, fused.aux_ld = OC;
            if (lt_.run(fused, stream_)) return;
        }
        lt_.matmul(g, stream_);
        const long long n = (long long)N * OC;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            if (bias.ptr && !bias_epi) {
                LLMC_LAUNCH(add_bias_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(gelu ? pre_gelu : out),
                            P<T_>(bias), N, OC);
                CUDA_CHECK_LAUNCH();
            }
            if (gelu) {
                LLMC_LAUNCH(gelu_forward_kernel<T_>, elementwise_blocks(n, sizeof(T_)), 256, 0, stream_, P<T_>(out),
                            P<T_>(pre_gelu), n);
                CUDA_CHECK_LAUNCH();
            }
        });
    }
    // dout *= gelu'(pre_gelu) and dbias in one pass (launch_gelu_bias_grad); dinp: one GEMM, with
    // dinp_gelu cuBLASLt's DGELU epilogue (else the GEMM, then gelu_backward_inplace_kernel; the
    // way fixed per problem); dw: one GEMM. Not cuBLASLt's BGRADB epilogue on the dw GEMM: on an
    // H200 (2026-11-27, dev/cuda/matmul_epilogue v6, GPT-2 124M's fc at B 8) the GEMM with BGRADB
    // and the add into dbias took 0.0864 ms, the plain GEMM and launch_bias_grad 0.0748 ms.
    void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
                         int N, int IC, int OC, Tensor dinp_gelu) override {
        same_dtype({&dinp, &dw, &dbias, &dout, &inp, &w, &pre_gelu, &dinp_gelu});
        LLMC_ASSERT(!dinp_gelu.ptr || dinp.ptr, "matmul_backward: dinp_gelu without dinp");
        if (!N || !OC) return;
        const cudaDataType_t lt = lt_type(dout.dtype);
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            float* part = dbias.ptr ? static_cast<float*>(bias_scratch_.get(
                                          std::max<size_t>(1, bias_grad_partial_floats(N, OC)) * sizeof(float), stream_))
                                    : nullptr;
            launch_gelu_bias_grad(P<T_>(dbias), P<T_>(dout), P<T_>(pre_gelu), N, OC, part, stream_);
        });
        // dinp^T[IC, N] = w(as stored: IC x OC col-major) * dout^T[OC, N]
        if (dinp.ptr) {
            const LtGemm g{dinp.ptr, w.ptr, dout.ptr, IC, N, OC, false, false, IC, OC, IC, 0.0f, lt};
            LtGemm fused = g;
            fused.dgelu_aux = dinp_gelu.ptr, fused.aux_ld = IC;  // dinp_gelu^T[IC, N], as dinp
            if (!dinp_gelu.ptr || IC % 8 != 0 || !lt_.run(fused, stream_)) {
                lt_.matmul(g, stream_);
                dispatch(dout.dtype, [&](auto tag) {  // (no dbias: the GELU's backward alone, if any)
                    using T_ = decltype(tag);
                    launch_gelu_bias_grad((T_*)nullptr, P<T_>(dinp), P<T_>(dinp_gelu), N, IC, nullptr, stream_);
                });
            }
        }
        // dw(as stored: IC x OC col-major) += inp^T[IC, N] * (dout^T[OC, N])^T
        LtGemm g{dw.ptr, inp.ptr, dout.ptr, IC, OC, N, false, true, IC, OC, IC, 1.0f, lt};
        lt_.matmul(g, stream_);
    }

    // ---- attention ----
    void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) override {
        same_dtype({&out, &qkv});
        check_hs(HS);
        check_heads(NH, NKV, "attention_forward");
        if (!B || !T) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            attn::attention_forward<T_>(P<T_>(out), lse, P<T_>(qkv), B, T, NH, NKV, HS, stream_, ways_);
        });
    }
    void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T, int NH,
                            int NKV, int HS) override {
        same_dtype({&dqkv, &dout, &qkv, &out});
        check_hs(HS);
        check_heads(NH, NKV, "attention_backward");
        if (!B || !T) return;
        float* D = static_cast<float*>(scratch(2, (size_t)B * NH * T * sizeof(float)));
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            attn::attention_backward<T_>(P<T_>(dqkv), P<T_>(dout), P<T_>(qkv), P<T_>(out), lse, D, B, T, NH, NKV, HS,
                                         stream_, ways_, &ds_scratch_);
        });
    }

    // context parallelism's ring: the block form of the same kernels (llmc/cuda/attention.cuh)
    void attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk, int NH,
                                 int NKV, int HS, SeqPositions qp, SeqPositions kp) override {
        same_dtype({&out, &qkv_q, &qkv_kv});
        check_hs(HS);
        check_heads(NH, NKV, "attention_block_forward");
        if (!B || !Tq) return;
        LLMC_ASSERT(Tk >= 1, "attention_block_forward: an empty key block");
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            attn::attention_block_forward<T_>(P<T_>(out), lse, P<T_>(qkv_q), P<T_>(qkv_kv), B, Tq, Tk, NH, NKV, HS, qp,
                                              kp, stream_, ways_);
        });
    }
    void attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                         int HS) override {
        same_dtype({&out, &blk_out});
        if (!B || !T) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            attn::attention_merge<T_>(P<T_>(out), lse, P<T_>(blk_out), blk_lse, B, T, NH, HS, stream_);
        });
    }
    void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                  const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS, SeqPositions qp,
                                  SeqPositions kp) override {
        same_dtype({&dq, &dkv, &dout, &qkv_q, &qkv_kv, &out});
        check_hs(HS);
        check_heads(NH, NKV, "attention_block_backward");
        if (!B || !Tq || !Tk) return;
        float* D = static_cast<float*>(scratch(2, (size_t)B * NH * Tq * sizeof(float)));
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            attn::attention_block_backward<T_>(P<T_>(dq), P<T_>(dkv), P<T_>(dout), P<T_>(qkv_q), P<T_>(qkv_kv),
                                               P<T_>(out), lse, D, B, Tq, Tk, NH, NKV, HS, qp, kp, true, stream_,
                                               ways_, &ds_scratch_);
        });
    }

    // ---- Llama ops (llmc/cuda/llama.cuh) ----
    void rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) override {
        same_dtype({&out, &inp, &w});
        if (!N) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_rmsnorm_forward<T_>(stream_, P<T_>(out), rstd, P<T_>(inp), P<T_>(w), N, C, eps);  // layernorm.cuh
        });
        CUDA_CHECK_LAUNCH();
    }
    void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                          int C) override {
        same_dtype({&dinp, &dw, &dout, &inp, &w});
        if (!N) return;
        // LayerNorm's backward kernels with mean 0 and no bias (layernorm.cuh)
        float* partial = static_cast<float*>(scratch(1, layernorm_backward_partial_floats(N, C) * sizeof(float)));
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_norm_backward<T_>(stream_, P<T_>(dinp), P<T_>(dw), (T_*)nullptr, partial, P<T_>(dout), P<T_>(inp),
                                     P<T_>(w), nullptr, rstd, N, C, ways_.ln_bwd_registers);
        });
        CUDA_CHECK_LAUNCH();
    }
    void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override {
        rope(qkv, B, T, NH, NKV, HS, theta, pos, 1.0f, "rope_forward");
    }
    void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override {
        rope(dqkv, B, T, NH, NKV, HS, theta, pos, -1.0f, "rope_backward");
    }
    void swiglu_forward(Tensor out, Tensor inp, int N, int F) override {
        same_dtype({&out, &inp});
        const long long n = (long long)N * F;
        LLMC_ASSERT(out.n >= (size_t)n && inp.n >= 2 * (size_t)n, "swiglu_forward: tensor too small");
        if (!n) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            with_pack_width<T_>(pack_width<T_>(F, {out.ptr, inp.ptr}), [&](auto k) {
                auto kernel = swiglu_forward_kernel<T_, decltype(k)::value>;  // one name for the launch macro
                LLMC_LAUNCH(kernel, blocks_for(n / k, 256), 256, 0, stream_, P<T_>(out), P<T_>(inp), F, n);
            });
        });
        CUDA_CHECK_LAUNCH();
    }
    void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) override {
        same_dtype({&dinp, &dout, &inp});
        const long long n = (long long)N * F;
        LLMC_ASSERT(dout.n >= (size_t)n && inp.n >= 2 * (size_t)n && dinp.n >= 2 * (size_t)n,
                    "swiglu_backward: tensor too small");
        if (!n) return;
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            with_pack_width<T_>(pack_width<T_>(F, {dinp.ptr, dout.ptr, inp.ptr}), [&](auto k) {
                auto kernel = swiglu_backward_kernel<T_, decltype(k)::value>;
                LLMC_LAUNCH(kernel, blocks_for(n / k, 256), 256, 0, stream_, P<T_>(dinp), P<T_>(dout), P<T_>(inp), F,
                            n);
            });
        });
        CUDA_CHECK_LAUNCH();
    }

    // ---- mixture of experts (llmc/cuda/moe.cuh) ----
    void moe_router_forward(float* probs, int32_t* expert, float* gate, Tensor logits, int N, int E, int K) override {
        LLMC_ASSERT(K >= 1 && K <= E && logits.n >= (size_t)N * E, "moe_router_forward: bad shape");
        if (!N) return;
        dispatch(logits.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_router_forward_kernel<T_>, blocks_for(N, 128), 128, 0, stream_, probs, expert, gate,
                        P<T_>(logits), N, E, K);
        });
        CUDA_CHECK_LAUNCH();
    }
    void moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                             const int32_t* expert, const float* gate, int N, int E, int K) override {
        LLMC_ASSERT(dlogits.n >= (size_t)N * E, "moe_router_backward: dlogits too small");
        if (!N) return;
        dispatch(dlogits.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_router_backward_kernel<T_>, blocks_for(N, 128), 128, 0, stream_, P<T_>(dlogits), dgate,
                        daux, probs, expert, gate, N, E, K);
        });
        CUDA_CHECK_LAUNCH();
    }
    void moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) override {
        same_dtype({&out, &inp});
        const long long n = (long long)N * K * C;
        LLMC_ASSERT(inp.n >= (size_t)N * C, "moe_permute: inp too small");
        if (!n) return;
        dispatch(inp.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_permute_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(out), P<T_>(inp), row_of, K,
                        C, n);
        });
        CUDA_CHECK_LAUNCH();
    }
    void moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) override {
        same_dtype({&dinp, &dout});
        const long long n = (long long)N * C;
        LLMC_ASSERT(dinp.n >= (size_t)n, "moe_permute_backward: dinp too small");
        if (!n) return;
        dispatch(dinp.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_permute_backward_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(dinp), P<T_>(dout),
                        row_of, K, C, n);
        });
        CUDA_CHECK_LAUNCH();
    }
    void moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) override {
        same_dtype({&out, &y});
        const long long n = (long long)N * C;
        LLMC_ASSERT(out.n >= (size_t)n, "moe_combine: out too small");
        if (!n) return;
        dispatch(out.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_combine_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(out), P<T_>(y), gate, row_of,
                        K, C, n);
        });
        CUDA_CHECK_LAUNCH();
    }
    void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate, const int32_t* row_of,
                              int N, int K, int C) override {
        same_dtype({&dy, &dout, &y});
        const long long pairs = (long long)N * K, n = pairs * C;
        LLMC_ASSERT(dout.n >= (size_t)N * C, "moe_combine_backward: dout too small");
        if (!n) return;
        dispatch(dout.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(moe_combine_backward_dy_kernel<T_>, blocks_for(n, 256), 256, 0, stream_, P<T_>(dy), P<T_>(dout),
                        gate, row_of, K, C, n);
            LLMC_LAUNCH(moe_combine_backward_dgate_kernel<T_>, blocks_for(pairs, 128), 128, 0, stream_, dgate,
                        P<T_>(dout), P<T_>(y), row_of, K, C, pairs);
        });
        CUDA_CHECK_LAUNCH();
    }

    // ---- classifier (llmc/cuda/classifier.cuh) ----
    void cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                       float dloss) override {
        if (!N) return;
        LLMC_ASSERT(V <= Vp, "cross_entropy: V > Vp");
        dispatch(logits.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_cross_entropy<T_>(stream_, P<T_>(logits), losses, targets, N, V, Vp, dloss, ways_.ce_row_in_smem);
        });
        CUDA_CHECK_LAUNCH();
    }
    void cross_entropy_partial(float* stats, Tensor logits, const int32_t* targets, int N, int Vl, int vocab_begin,
                               int V) override {
        check_vocab_slice(logits, N, Vl, vocab_begin, V, "cross_entropy_partial");
        if (!N) return;
        const int nreal = ce_slice_real_cols(Vl, vocab_begin, V);
        dispatch(logits.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_cross_entropy_partial<T_>(stream_, stats, P<T_>(logits), targets, N, Vl, nreal, vocab_begin);
        });
        CUDA_CHECK_LAUNCH();
    }
    void cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets, int N, int Vl,
                              int vocab_begin, int V, float dloss) override {
        check_vocab_slice(logits, N, Vl, vocab_begin, V, "cross_entropy_finish");
        if (!N) return;
        const int nreal = ce_slice_real_cols(Vl, vocab_begin, V);
        dispatch(logits.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            launch_cross_entropy_finish<T_>(stream_, P<T_>(logits), losses, stats, targets, N, Vl, nreal, vocab_begin,
                                            dloss);
        });
        CUDA_CHECK_LAUNCH();
    }

    void cross_entropy_stats(int phase, float* stats, float* mx, float* rest, size_t rows) override {
        if (!rows) return;
        LLMC_LAUNCH(cross_entropy_stats_kernel, blocks_for((long long)rows, 256), 256, 0, stream_, phase, stats, mx,
                                                                                                    rest, (long long)rows);
        CUDA_CHECK_LAUNCH();
    }

    // ---- optimizer ----
    double sum_squares(Tensor g) override {
        if (!g.n) return 0.0;
        const int G = sum_squares_blocks((long long)g.n);
        double* partial = static_cast<double*>(scratch(3, (size_t)G * sizeof(double)));
        dispatch(g.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(sum_squares_kernel<T_>, G, kSumSqThreads, 0, stream_, partial, P<T_>(g), (long long)g.n);
        });
        CUDA_CHECK_LAUNCH();
        std::vector<double> h(G);
        to_host_bytes(h.data(), partial, (size_t)G * sizeof(double));
        double s = 0.0;
        for (int i = 0; i < G; i++) s += h[i];
        return s;
    }
    void sum_squares_multi(double* out, const std::vector<Tensor>& regions) override {
        std::vector<SumSqRegion> tab;
        int blocks = 0;
        for (const Tensor& g : regions) {
            same_dtype({&g, &regions[0]});
            if (!g.n) continue;
            const int G = sum_squares_blocks((long long)g.n);
            tab.push_back({g.ptr, (long long)g.n, blocks, G});
            blocks += G;
        }
        if (tab.empty()) {
            ++counters_.launches;
            if (queue_work()) CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream_));
            return;
        }
        SumSqRegion* dtab = static_cast<SumSqRegion*>(sumsq_regions_.get(tab.size() * sizeof(SumSqRegion), stream_));
        double* part = static_cast<double*>(sumsq_part_.get((blocks + tab.size()) * sizeof(double), stream_));
        from_host_bytes(dtab, tab.data(), tab.size() * sizeof(SumSqRegion));  // (small: no wait)
        dispatch(regions[0].dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(sum_squares_multi_kernel<T_>, blocks, kSumSqThreads, 0, stream_, part, dtab, (int)tab.size());
        });
        CUDA_CHECK_LAUNCH();
        LLMC_LAUNCH(sum_squares_finish_kernel, 1, 256, 0, stream_, out, part + blocks, part, dtab, (int)tab.size());
        CUDA_CHECK_LAUNCH();
    }
    void step_control(float* ctl, const double* ss, double clip, double loss_scale) override {
        LLMC_LAUNCH(step_control_kernel, 1, 1, 0, stream_, ctl, ss, clip, loss_scale);
        CUDA_CHECK_LAUNCH();
    }
    void adamw_multi(const std::vector<AdamWPiece>& pieces, const float* ctl, float lr, float beta1, float beta2,
                     float eps, int t) override {
        LLMC_ASSERT(t >= 1, "adamw: step t is 1-based");
        std::vector<AdamWDesc> desc;
        std::vector<AdamWChunk> chunks;
        for (const AdamWPiece& p : pieces) {
            same_dtype({&p.params, &p.grads, &pieces[0].params});
            LLMC_ASSERT(p.params.n == p.grads.n, "adamw_multi: size mismatch");
            if (!p.params.n) continue;
            for (long long b = 0; b < (long long)p.params.n; b += kAdamWChunk) chunks.push_back({(int)desc.size(), 0, b});
            desc.push_back({p.params.ptr, p.master, p.grads.ptr, p.m, p.v, (long long)p.params.n, p.weight_decay,
                            p.seed, p.index_base});
        }
        if (desc.empty()) return;
        // the descriptors, then the step's lr, step size and 1 / sqrt(bias correction 2) (read by the
        // kernel from device memory: a CUDA graph's step takes them as it takes the seeds)
        const AdamWScales sc = adamw_scales(lr, beta1, beta2, t);
        const float hyper[3] = {lr, sc.step, sc.inv_sqrt_bc2};
        const size_t dbytes = desc.size() * sizeof(AdamWDesc);
        std::vector<char> up(dbytes + sizeof(hyper));
        std::memcpy(up.data(), desc.data(), dbytes);
        std::memcpy(up.data() + dbytes, hyper, sizeof(hyper));
        AdamWDesc* ddesc = static_cast<AdamWDesc*>(adamw_desc_.get(up.size(), stream_));
        AdamWChunk* dchunks = static_cast<AdamWChunk*>(adamw_chunks_.get(chunks.size() * sizeof(AdamWChunk), stream_));
        // the seeds and the learning rate change every step, the layout never: the chunk table goes up once
        from_host_bytes(ddesc, up.data(), up.size());
        std::string key((const char*)chunks.data(), chunks.size() * sizeof(AdamWChunk));
        if (key != adamw_key_ || dchunks != adamw_chunks_at_) {
            from_host_bytes(dchunks, chunks.data(), chunks.size() * sizeof(AdamWChunk));
            adamw_key_ = std::move(key);
            adamw_chunks_at_ = dchunks;
        }
        const float* dhyper = reinterpret_cast<const float*>(reinterpret_cast<const char*>(ddesc) + dbytes);
        dispatch(pieces[0].params.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(adamw_multi_kernel<T_>, (int)chunks.size(), 256, 0, stream_, ddesc, dchunks, ctl, dhyper,
                        beta1, beta2, eps);
        });
        CUDA_CHECK_LAUNCH();
    }
    void adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1, float beta2,
               float eps, float weight_decay, float grad_scale, int t, uint32_t seed, uint32_t index_base = 0) override {
        same_dtype({&params, &grads});
        LLMC_ASSERT(params.n == grads.n, "adamw: size mismatch");
        if (!params.n) return;
        const AdamWScales sc = adamw_scales(lr, beta1, beta2, t);
        dispatch(params.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(adamw_kernel<T_>, blocks_for(params.n, 256), 256, 0, stream_, P<T_>(params), master,
                        P<T_>(grads), m, v, (long long)params.n, lr, beta1, beta2, sc.step, sc.inv_sqrt_bc2, eps, weight_decay,
                        grad_scale, seed, index_base);
        });
        CUDA_CHECK_LAUNCH();
    }

    // ---- fp8 (llmc/cuda/fp8_ops.h; the kernels in fp8.cu) ----
    bool fp8_supported(std::string* why) const override { return fp8::supported(*fp8_, device_, why); }
    void fp8_widen_amaxes(const Fp8Device& d) override { fp8::widen_amaxes(d, stream_); }
    void fp8_update_scales(const Fp8Device& d, bool from_wide, float* step_overflows) override {
        fp8::update_scales(d, from_wide, step_overflows, stream_);
    }
    int fp8_dim_multiple() const override { return 16; }
    void matmul_forward_fp8(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                            bool gelu, const Fp8Cast& inp_cast, const Fp8Cast& w_cast,
                            const Fp8Stash& stash = Fp8Stash()) override {
        fp8::forward(*fp8_, out, pre_gelu, inp, w, bias, N, IC, OC, gelu, inp_cast, w_cast, stash, device_, stream_);
    }
    void matmul_backward_fp8(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
                             int N, int IC, int OC, const Fp8Cast& dout_cast, const Fp8Cast& inp_cast,
                             const Fp8Cast& w_cast, const Fp8Stash& stash = Fp8Stash()) override {
        fp8::backward(*fp8_, dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC, dout_cast, inp_cast, w_cast, stash,
                      device_, stream_);
    }

private:
    // rows of a vocabulary slice [vocab_begin, vocab_begin + rows) of an embedding table
    static int slice_rows(const Tensor& wte, int C, int vocab_begin, const char* what) {
        LLMC_ASSERT(C > 0, strfmt("%s: need C > 0", what));
        LLMC_ASSERT(vocab_begin >= 0, strfmt("%s: negative vocab_begin %d", what, vocab_begin));
        LLMC_ASSERT(wte.n % (size_t)C == 0, strfmt("%s: wte size is not a multiple of C", what));
        LLMC_ASSERT(wte.n / (size_t)C <= (size_t)INT32_MAX, strfmt("%s: too many wte rows", what));
        return (int)(wte.n / (size_t)C);
    }
    static void check_vocab_slice(const Tensor& logits, int N, int Vl, int vocab_begin, int V, const char* what) {
        LLMC_ASSERT(N >= 0 && Vl >= 0 && vocab_begin >= 0 && V > 0,
                    strfmt("%s: need N >= 0, Vl >= 0, vocab_begin >= 0, V > 0", what));
        LLMC_ASSERT(logits.n >= (size_t)N * Vl, strfmt("%s: logits too small", what));
    }
    // attention takes any head size (llmc/cuda/attention.cuh pads it to a multiple of 16)
    static void check_hs(int HS) { LLMC_ASSERT(HS > 0, strfmt("attention: head size %d", HS)); }
    static void check_heads(int NH, int NKV, const char* what) {
        LLMC_ASSERT(NH > 0 && NKV > 0 && NH % NKV == 0,
                    strfmt("%s: n_head %d is not a positive multiple of n_kv_head %d", what, NH, NKV));
    }
    // rotary embedding of the query and key heads of qkv [B, T, NH + 2*NKV, HS]; sign +1 forward, -1 backward
    void rope(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos, float sign,
              const char* what) {
        if (HS <= 0 || HS % 2 != 0 || HS / 2 > kRopeMaxHalf)
            throw UserError(strfmt("%s: rotary embedding needs an even head size up to %d (d_model / n_head = %d)", what,
                                   2 * kRopeMaxHalf, HS));
        check_heads(NH, NKV, what);
        const long long pairs = (long long)B * T * (NH + NKV) * (HS / 2);
        LLMC_ASSERT(qkv.n >= (size_t)B * T * (NH + 2 * NKV) * HS, strfmt("%s: qkv too small", what));
        if (!pairs) return;
        RopeFreqs f{};
        for (int i = 0; i < HS / 2; i++) f.inv_freq[i] = rope_inv_freq(i, HS, theta);
        dispatch(qkv.dtype, [&](auto tag) {
            using T_ = decltype(tag);
            LLMC_LAUNCH(rope_kernel<T_>, blocks_for(pairs, 256), 256, 0, stream_, P<T_>(qkv), T, NH + 2 * NKV, NH + NKV,
                        HS, f, pos, sign, pairs);
        });
        CUDA_CHECK_LAUNCH();
    }
    // grow-only scratch buffers, one per slot (0 encoder, 1 layernorm / rmsnorm, 2 attention, 3 sum_squares)
    void* scratch(int slot, size_t bytes) { return scratch_[slot].get(bytes, stream_); }

    int device_;
    size_t peak_used_ = 0;
    // device memory in use (by this process and anything else on the GPU), sampled after
    // allocations and at synchronisation points: a peak measured from the driver's view
    void note_memory_in_use() {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) peak_used_ = std::max(peak_used_, tot - fr);
    }
    cudaStream_t stream_ = nullptr;
    // asynchronous copies (copy_*_async): stream 0 device to host, 1 host to device; each waits
    // for the ops queued on stream_ so far (the event queued_); copy id i records copy_events_[i % n]
    static constexpr uint64_t kCopyEvents = 64;
    cudaStream_t copy_streams_[2] = {nullptr, nullptr};
    cudaEvent_t copy_events_[kCopyEvents] = {};
    cudaEvent_t queued_ = nullptr;
    cudaEvent_t copy_tails_[2] = {nullptr, nullptr};  // order_after_copy of an id whose event was recorded again
    uint64_t copies_ = 0;  // ids handed out (ids start at 1; 0 means no copy)
    uint64_t copy_async(int dir, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
        if (!copy_streams_[dir]) CUDA_CHECK(cudaStreamCreateWithFlags(&copy_streams_[dir], cudaStreamNonBlocking));
        if (!queued_) CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(queued_, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(copy_streams_[dir], queued_, 0));
        if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copy_streams_[dir]));
        const uint64_t id = ++copies_;
        cudaEvent_t& e = copy_events_[id % kCopyEvents];
        if (!e) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(e, copy_streams_[dir]));
        return id;
    }
    LtMatmul lt_;
    GrowBuffer scratch_[4];
    GrowBuffer bias_scratch_;  // matmul_backward: launch_bias_grad's partial sums
    GrowBuffer ds_scratch_;    // the flash backward's dS^T or fp32 dQ where ways_.bwd_dq asks
    KernelWays ways_;          // the kernels' ways (set_cuda_kernel_ways)
    // the upload ring (from_host_bytes)
    struct Upload {
        void* host = nullptr;  // pinned, kUploadNoSync bytes
        cudaEvent_t done = nullptr;
    };
    static constexpr size_t kUploadSlots = 8;
    Upload uploads_[kUploadSlots];
    size_t next_upload_ = 0;
    uint64_t upload_waits_ = 0;  // uploads' host waits that a graph's uploads do not make (ring
                                 // slots; a large upload's in a graph's warm-up region)
    StepGraph graph_;          // train.cuda_graphs (graph_step_begin)
    // the multi-tensor ops' tables, and what was uploaded last
    GrowBuffer sumsq_regions_, sumsq_part_, adamw_desc_, adamw_chunks_;
    std::string adamw_key_;
    const void* adamw_chunks_at_ = nullptr;
    // fp8 casts, GEMMs and their scratch (fp8_supported caches its answer there)
    fp8::CudaFp8Ptr fp8_ = fp8::make_cuda_fp8();
};

}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

bool cuda_device_available() {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky-free error state
        return false;
    }
    return n > 0;
}

void set_cuda_kernel_ways(Ops& ops, const KernelWays& ways) {
    if (CudaOps* c = dynamic_cast<CudaOps*>(&ops)) c->set_ways(ways);
}

std::unique_ptr<Ops> make_cuda_ops(int device_index) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw UserError(strfmt("device=cuda: no usable CUDA device (%s)", cudaGetErrorString(err)));
    }
    if (n == 0) throw UserError("device=cuda: no CUDA device found");
    if (device_index < 0 || device_index >= n)
        throw UserError(strfmt("device=cuda: device index %d out of range (%d devices)", device_index, n));
#if defined(LLMC_GPU_ARCHS)  // (the Makefile's GPU_ARCH; not under the emulator)
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
    const std::string why = arch_mismatch(LLMC_GPU_ARCHS, prop.name, prop.major, prop.minor);
    if (!why.empty()) throw UserError(why);
#endif
    return std::make_unique<CudaOps>(device_index);
}
