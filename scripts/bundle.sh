#!/usr/bin/env bash
# Builds dist/: a relocatable folder that runs train_gpt on a machine without OpenMPI (issue 12).
#   CUDA=1 GPU_ARCH="80 90a" JOBS=1 DIST=dist scripts/bundle.sh      (or: make bundle)
# It holds train_gpt, build/test_cpu (not in the kit), build/test_gpu (CUDA=1), the data tools, scripts/gpu_check.sh,
# and this machine's OpenMPI runtime under dist/mpi/ in the layout of its install prefix (/usr),
# so that OPAL_PREFIX relocates it: mpirun/orterun/orted, the MCA plugins, the help files,
# /etc/openmpi, PMIx, and every library they and the binaries load that a base system lacks
# (found with ldd). libc, libm, libstdc++, libgcc_s, libpthread, libdl, librt, the loader and the
# CUDA libraries come from the target. Source dist/env.sh there.
# The binaries are built with portable CPU flags (CPU_ARCH, default -march=x86-64-v2) into
# build-dist/, leaving the usual build alone. REUSE_BUILD=1 packages this checkout's usual build
# instead (built already; not portable): what test/e2e/test_bundle.sh does, in seconds.
# --kit (make gpu-kit, issue 26): the folder a GPU window needs, built here so that nothing compiles
# on the device: CUDA, GPU_ARCH 90a and CPU_ARCH -march=x86-64-v3 unless set, DIST gpu-kit, and also
# the test data test_gpu's whole-model reference reads (test/data/ref_*.bin), dev/cuda's attention,
# classifier and LayerNorm binaries and the attention's PyTorch peer; at most 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=0
[ "${1:-}" = --kit ] && KIT=1
if [ $KIT = 1 ]; then
    CUDA=1; GPU_ARCH=${GPU_ARCH:-90a}; CPU_ARCH=${CPU_ARCH:--march=x86-64-v3}; DIST=${DIST:-gpu-kit}
fi
CUDA=${CUDA:-1}
GPU_ARCH=${GPU_ARCH:-80 90a}
CPU_ARCH=${CPU_ARCH:--march=x86-64-v2}
JOBS=${JOBS:-1}
DIST=${DIST:-dist}
B=build-dist

if [ "${REUSE_BUILD:-0}" = 1 ]; then
    # package what `make` already built in this checkout (for tests on this machine: its CPU
    # flags are this machine's, not portable); test_gpu when it was built
    EXE=train_gpt; TOOLS_DIR=dev/data; TESTS_DIR=build
    [ -x build/test_gpu ] || CUDA=0
else
    bins=("$B/train_gpt" "$B/dev/data/synth_shards" "$B/dev/data/prepare_text")
    [ $KIT = 1 ] || bins+=("$B/test_cpu")
    [ "$CUDA" = 0 ] || bins+=("$B/test_gpu")
    make -j"$JOBS" CUDA="$CUDA" GPU_ARCH="$GPU_ARCH" CPU_ARCH="$CPU_ARCH" BUILD=$B BIN=$B/ "${bins[@]}"
    EXE=$B/train_gpt; TOOLS_DIR=$B/dev/data; TESTS_DIR=$B
fi

# OpenMPI's own paths, from ompi_info: everything below is placed relative to its prefix
path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1:\(.*\)/\1/p"; }
PREFIX=$(path prefix); BINDIR=$(path bindir); LIBDIR=$(path libdir); PKGLIBDIR=$(path pkglibdir)
PKGDATADIR=$(path pkgdatadir); SYSCONFDIR=$(path sysconfdir)
for d in "$BINDIR" "$LIBDIR" "$PKGLIBDIR" "$PKGDATADIR"; do
    case "$d" in "$PREFIX"/*) ;; *) echo "bundle: $d is not under OpenMPI's prefix $PREFIX" >&2; exit 1 ;; esac
done
rel() { echo "${1#"$PREFIX"/}"; }

rm -rf "$DIST"
M="$DIST/mpi"
mkdir -p "$DIST/build" "$DIST/dev/data" "$DIST/dev/bench" "$DIST/dev/reference" "$DIST/scripts" "$M/$(rel "$BINDIR")" \
    "$M/$(rel "$LIBDIR")" "$M/etc"
cp "$EXE" "$DIST/"
cp "$TOOLS_DIR/synth_shards" "$TOOLS_DIR/prepare_text" "$DIST/dev/data/"
# (the kit leaves out the CPU unit tests: nothing a GPU window runs reads them, and its 60 MiB go
# to the kernels)
[ $KIT = 1 ] || cp "$TESTS_DIR/test_cpu" "$DIST/build/"
[ "$CUDA" = 0 ] || cp "$TESTS_DIR/test_gpu" "$DIST/build/"
cp scripts/gpu_check.sh scripts/gpu_quick.sh scripts/gpu_window.sh "$DIST/scripts/"
# the helpers gpu_check's stages run besides the binaries: the PyTorch peer, the overlap table,
# the Hugging Face export check
cp dev/bench/torch_gpt2.py dev/bench/overlap_bench.sh "$DIST/dev/bench/"
cp dev/reference/check_export.py "$DIST/dev/reference/"
# the commit it was built from, for gpu_check.sh's tables (the bundle is no git checkout)
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo ' (+local changes)')" > "$DIST/COMMIT"

# the launcher (mpirun and orterun are the same program), the daemon, plugins, help files, config
for p in orterun orted; do cp "$BINDIR/$p" "$M/$(rel "$BINDIR")/"; done
ln -s orterun "$M/$(rel "$BINDIR")/mpirun"
for d in "$PKGLIBDIR" "$PKGDATADIR"; do
    mkdir -p "$(dirname "$M/$(rel "$d")")" && cp -r "$d" "$M/$(rel "$d")"
done
cp -r "$SYSCONFDIR"/. "$M/etc/"
# PMIx (Debian's OpenMPI uses an external one): its plugins and help files, relocated by PMIX_INSTALL_PREFIX
PMIX=$(dirname "$(dirname "$(readlink -f "$(ldd "$PKGLIBDIR"/mca_pmix_ext3x.so | awk '/libpmix/ {print $3}')")")")
PMIX_REL=$(rel "$PMIX")
mkdir -p "$M/$PMIX_REL/lib"
cp -r "$PMIX/share" "$M/$PMIX_REL/"
[ -d "$PMIX/lib/pmix" ] && cp -r "$PMIX/lib/pmix" "$M/$PMIX_REL/lib/"

# libraries: everything the binaries and plugins load, except what the target provides
is_target_lib() {
    case "$(basename "$1")" in
        libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|linux-vdso*) return 0 ;;
        libcuda.so*|libcudart.so*|libcublas*|libnccl*|libcudnn*|libnvidia*|libnvrtc*) return 0 ;;
    esac
    return 1
}
LIBS="$M/$(rel "$LIBDIR")"
objs=("$DIST/train_gpt" "$DIST"/dev/data/* "$DIST"/build/* "$M/$(rel "$BINDIR")"/orterun "$M/$(rel "$BINDIR")"/orted)
objs+=($(find "$M" -name '*.so*' -type f))
while read -r lib; do
    is_target_lib "$lib" && continue
    cp -L "$lib" "$LIBS/"
done < <(ldd "${objs[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
# the copied libraries' own needs (libfabric, UCX, ...): until nothing new appears
while :; do
    new=0
    while read -r lib; do
        is_target_lib "$lib" && continue
        [ -e "$LIBS/$(basename "$lib")" ] && continue
        cp -L "$lib" "$LIBS/"; new=1
    done < <(ldd "$LIBS"/*.so* 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
    [ $new = 1 ] || break
done

cat > "$DIST/env.sh" <<ENV
# Source this (bash): the bundle's OpenMPI and libraries, wherever this folder lies.
D=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="\$D/mpi"
export OPAL_SYSCONFDIR="\$D/mpi/etc"
export PMIX_INSTALL_PREFIX="\$D/mpi/$PMIX_REL"
export PATH="\$D/mpi/$(rel "$BINDIR"):\$D:\$PATH"
export LD_LIBRARY_PATH="\$D/mpi/$(rel "$LIBDIR")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
unset D
ENV
if [ $KIT = 1 ]; then
    [ -x "$DIST/build/test_gpu" ] || { echo "bundle --kit: no build/test_gpu (a kit needs the CUDA build)" >&2; exit 1; }
    mkdir -p "$DIST/test/data" "$DIST/dev/cuda"
    cp test/data/ref_*.bin "$DIST/test/data/"
    # dev/cuda's kernel notebooks and PyTorch's SDPA beside the attention (gpu_check --kernels)
    make -C dev/cuda GPU_ARCH="$GPU_ARCH" attention_forward attention_backward classifier layernorm matmul_epilogue fp8_gemm fp8_cast
    cp dev/cuda/attention_forward dev/cuda/attention_backward dev/cuda/classifier dev/cuda/layernorm \
        dev/cuda/matmul_epilogue dev/cuda/fp8_gemm dev/cuda/fp8_cast "$DIST/dev/cuda/"
    cp dev/bench/torch_attention.py "$DIST/dev/bench/"
    size=$(du -sm "$DIST" | cut -f1)
    [ "$size" -le 60 ] || { echo "bundle --kit: $DIST is $size MiB, over 60" >&2; exit 1; }
fi
echo "bundle: $DIST ($(du -sh "$DIST" | cut -f1); CUDA=$CUDA GPU_ARCH=\"$GPU_ARCH\" CPU_ARCH=$CPU_ARCH)"
