// cuemu stand-in for <cuda_fp8.h>: the fp32 -> fp8 conversion of the device (satfinite: round to
// nearest even, saturate) through the project's exact CPU emulation (llmc/precision/fp8.h).
#pragma once
#include <cstdio>
#include <cstdlib>

#include "llmc/precision/fp8.h"
#include "test/cuemu/cuemu.h"

typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t t) {
    if (sat != __NV_SATFINITE) {
        std::fprintf(stderr, "cuemu: __nv_cvt_float_to_fp8 without __NV_SATFINITE is not emulated\n");
        std::abort();
    }
    return fp8_encode(x, t == __NV_E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2);
}
