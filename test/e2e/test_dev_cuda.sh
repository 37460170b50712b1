# The kernel experiments in dev/cuda include the backend's kernels (llmc/cuda/*.cuh) and call
# them directly, so a change of a kernel's signature breaks them unseen until a GPU session tries
# to build them (dev/cuda/adamw.cu had stopped compiling when AdamW gained its index base). They
# must compile wherever nvcc is (one architecture, sm_90a with its wgmma, to keep it short); without a CUDA
# toolkit this test has nothing to check and says so.
source "$(dirname "$0")/lib.sh"
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if [ ! -x "$NVCC" ]; then
    echo "SKIP: no nvcc at $NVCC (dev/cuda needs the CUDA toolkit)"
    exit 0
fi
make -C "$ROOT/dev/cuda" -j2 GPU_ARCH=90a NVCC="$NVCC" > "$W/build.log" 2>&1 ||
    die "dev/cuda does not compile: $(grep -m3 -E 'error' "$W/build.log")"
# ptxas serializes every wgmma of a kernel when it cannot prove a wgmma.fence and the wgmma after it
# warpgroup-uniform (a fence in one branch, its wgmma in another): a performance loss it reports only
# as an info line, which would cost the wgmma kernels their overlap unseen until a GPU timed them.
# Every wgmma kernel, both types, compiled here for sm_90a alone (make may have built dev/cuda
# before this test, and its programs instantiate only the kernels they launch; a new wgmma kernel
# belongs in this list); none may spill either
cat > "$W/wgmma_kernels.cu" <<'EOF'
#include "llmc/cuda/attention.cuh"
template <class E> void wgmma_kernels() {
    (void)&flash::flash_forward_wgmma_kernel<E, 64, false, false>;
    (void)&flash::flash_forward_wgmma_kernel<E, 64, true, false>;
    (void)&flash::flash_forward_wgmma_kernel<E, 128, false, false>;
    (void)&flash::flash_forward_wgmma_kernel<E, 128, true, false>;
    (void)&flash::flash_forward_wgmma_kernel<E, 64, false, true>;
    (void)&flash::flash_forward_wgmma_kernel<E, 64, true, true>;
    (void)&flash::flash_forward_wgmma_kernel<E, 128, false, true>;
    (void)&flash::flash_forward_wgmma_kernel<E, 128, true, true>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 64, false, false>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 64, true, false>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 128, false, false>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 64, false, true>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 128, false, true>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 64, true, true>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 128, true, false>;
    (void)&flash::flash_backward_dq_wgmma_kernel<E, 128, true, true>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, false, false, false>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, true, false, false>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, true, true, false>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 128, true, false, false>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, false, false, true>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, true, false, true>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 128, true, false, true>;
    (void)&flash::flash_backward_dkdv_wgmma_kernel<E, 64, true, true, true>;
}
template void wgmma_kernels<__nv_bfloat16>();
template void wgmma_kernels<__half>();
EOF
"$NVCC" -std=c++17 -I"$ROOT" -arch=sm_90a -DLLMC_SM90A --expt-relaxed-constexpr -Xptxas -v -cubin \
    -o "$W/wgmma_kernels.cubin" "$W/wgmma_kernels.cu" > "$W/wgmma.log" 2>&1 ||
    die "the wgmma kernels: $(grep -m3 error "$W/wgmma.log")"
nk=$(grep -c "Compiling entry function '_ZN5flash.*wgmma_kernel" "$W/wgmma.log")
[ "$nk" -eq 48 ] || die "ptxas compiled $nk wgmma kernels, not 48"
# (C7520 for a fence in another branch; C7515 and its kin for other reasons, such as non-wgmma
# instructions writing an accumulator between the fence and the wgmma: every such line ends the same)
if grep -q 'wgmma.mma_async instructions are serialized' "$W/wgmma.log" "$W/build.log"; then
    die "ptxas serializes wgmma: $(grep -h -m1 -o 'C75[0-9][0-9].*function .[A-Za-z0-9_]*' "$W/wgmma.log" "$W/build.log")"
fi
if grep 'spill stores' "$W/wgmma.log" | grep -qv ' 0 bytes spill stores'; then
    die "a wgmma kernel spills: $(grep -E '[1-9][0-9]* bytes spill stores' "$W/wgmma.log" | head -1)"
fi
for t in attention_forward attention_backward layernorm classifier adamw matmul_epilogue fp8_gemm fp8_cast; do
    [ -x "$ROOT/dev/cuda/$t" ] || die "dev/cuda/$t was not built"
done
echo "PASS: dev/cuda compiles (8 kernel experiments, sm_90a); 48 wgmma kernels: no serialized wgmma, no spill"
