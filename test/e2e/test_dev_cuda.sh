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
# as an info line, which would cost the wgmma kernels their overlap unseen until a GPU timed them
if grep -q 'C7520' "$W/build.log"; then
    die "ptxas serializes wgmma: $(grep -m1 -o 'C7520.*function .[A-Za-z0-9_]*' "$W/build.log")"
fi
for t in attention_forward attention_backward layernorm classifier adamw matmul_epilogue fp8_gemm fp8_cast; do
    [ -x "$ROOT/dev/cuda/$t" ] || die "dev/cuda/$t was not built"
done
echo "PASS: dev/cuda compiles (8 kernel experiments, sm_90a)"
