// The fp8 kernels' own translation unit: CudaOps's fp8 entry points (llmc/cuda/fp8_ops.h) with
// CudaFp8 and every kernel it launches (llmc/cuda/fp8.cuh).
#include "llmc/cuda/fp8.cuh"
#include "llmc/cuda/fp8_ops.h"

namespace fp8 {

void CudaFp8Deleter::operator()(CudaFp8* f) const { delete f; }
CudaFp8Ptr make_cuda_fp8() { return CudaFp8Ptr(new CudaFp8()); }

bool supported(CudaFp8& f, int device, std::string* why) { return f.supported(device, why); }

void forward(CudaFp8& f, Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
             bool gelu, const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash, int device, cudaStream_t stream) {
    f.forward(out, pre_gelu, inp, w, bias, N, IC, OC, gelu, ci, cw, stash, device, stream);
}

void backward(CudaFp8& f, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
              int N, int IC, int OC, const Fp8Cast& cd, const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash,
              int device, cudaStream_t stream) {
    f.backward(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC, cd, ci, cw, stash, device, stream);
}

void widen_amaxes(const Fp8Device& d, cudaStream_t stream) {
    if (!d.n) return;
    LLMC_LAUNCH(widen_amaxes_kernel, 1, 256, 0, stream, d);
    CUDA_CHECK_LAUNCH();
}

void update_scales(const Fp8Device& d, bool from_wide, float* step_overflows, cudaStream_t stream) {
    LLMC_LAUNCH(update_scales_kernel, 1, 256, 0, stream, d, from_wide, step_overflows);
    CUDA_CHECK_LAUNCH();
}

}  // namespace fp8
