// The fp8 entry points CudaOps calls (llmc/cuda/fp8.cuh defines CudaFp8 with every kernel it
// launches; llmc/cuda/fp8.cu compiles them). cuda_ops.cu includes this header alone, so the fp8
// kernels compile in their own translation unit beside the rest of the backend, and a change to
// them (a planted bug of test/cuemu among them) rebuilds only that one.
#pragma once
#include <memory>
#include <string>

#include "llmc/core/tensor.h"
#include "llmc/cuda/common.cuh"
#include "llmc/precision/fp8.h"

namespace fp8 {

class CudaFp8;  // the casts' and GEMMs' scratch and cuBLASLt state of one CudaOps
struct CudaFp8Deleter {
    void operator()(CudaFp8* f) const;  // after the owner's stream is gone: cudaFree waits for the device
};
using CudaFp8Ptr = std::unique_ptr<CudaFp8, CudaFp8Deleter>;
CudaFp8Ptr make_cuda_fp8();

// Ops::fp8_supported, matmul_forward_fp8, matmul_backward_fp8, fp8_widen_amaxes and fp8_update_scales
// (llmc/backend/ops.h) on device `device`, stream `stream`
bool supported(CudaFp8& f, int device, std::string* why);
void forward(CudaFp8& f, Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
             bool gelu, const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash, int device, cudaStream_t stream);
void backward(CudaFp8& f, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
              int N, int IC, int OC, const Fp8Cast& cd, const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash,
              int device, cudaStream_t stream);
void widen_amaxes(const Fp8Device& d, cudaStream_t stream);
void update_scales(const Fp8Device& d, bool from_wide, float* step_overflows, cudaStream_t stream);

}  // namespace fp8
