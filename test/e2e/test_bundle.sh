# The offline bundle (scripts/bundle.sh, issue 12) runs where OpenMPI is absent: in a mount
# namespace that hides the system's OpenMPI and PMIx (binaries, libraries, plugins, /etc/openmpi,
# help files) and every system copy of a library the bundle carries, with a clean environment,
# the bundle's mpirun runs train_gpt on 2 ranks (dp=2) with the losses and final weights of one
# process, and the bundle's build/test_cpu passes. The same run from a copy of the bundle that
# lacks one library (libhwloc, needed by libopen-pal) fails.
# Bundle: $BUNDLE when set (e.g. dist/ from `make bundle`), else one packaged here from the
# binaries `make test` built (REUSE_BUILD=1: this machine's CPU flags; `make bundle` builds the
# portable one). Needs root (unshare --mount); skipped otherwise.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
if [ "$(id -u)" -ne 0 ] || ! unshare --mount --propagation private true 2>/dev/null; then
    echo "skipped: needs root and unshare --mount"; exit 0
fi
if [ -n "${BUNDLE:-}" ]; then
    D=$(cd "$BUNDLE" && pwd)
else
    D="$W/dist"
    REUSE_BUILD=1 DIST="$D" bash "$ROOT/scripts/bundle.sh" > "$W/bundle.log" 2>&1 || die "bundle.sh failed: $(tail -n 20 "$W/bundle.log")"
fi
[ -f "$D/env.sh" ] && [ -x "$D/train_gpt" ] && [ -x "$D/build/test_cpu" ] || die "$D is not a bundle"
size=$(du -sm "$D" | cut -f1)
echo "bundle $D: $size MiB"
# (a tripwire for what bloats it: 48 MiB since fp16's kernels joined fp32's and bf16's in train_gpt and
# test_gpu, 13 + 12 MiB for sm_80 and sm_90, beside 18 MiB of OpenMPI runtime; 56 MiB on 2026-11-27
# with LayerNorm's register kernels, the 128-key flash forward and the fused fp8 casts; 58 MiB on
# 2026-11-28 with the wgmma attention kernels (sm_90a), then 32 MiB with the device code compressed
# (nvcc -compress-mode=size: train_gpt 19.2 -> 4.9 MB); test_gpu_kit bounds the kit)
[ "$size" -lt 41 ] || die "bundle is $size MiB, over 40"

# the data and configs are made outside the namespace, with the bundle's own tool
SYNTH="$D/dev/data/synth_shards"
make_data
tiny_config "$W/c.json"
# test_cpu reads test/data and data/tokenizer and runs dev/data/prepare_text from its working folder
mkdir -p "$W/cwd" && ln -s "$ROOT/test" "$W/cwd/test" && ln -s "$ROOT/data" "$W/cwd/data" && ln -s "$D/dev" "$W/cwd/dev"

# hidden.sh BUNDLE CMD...: CMD in a namespace without the system's OpenMPI, with BUNDLE's env.sh sourced
# (EMPTY: an empty folder to mount over the system's folders)
cat > "$W/hidden.sh" <<'SH'
set -eu
B=$1; shift
empty=$EMPTY
hide() { [ -e "$1" ] || return 0; if [ -d "$1" ]; then mount --bind "$empty" "$1"; else mount --bind /dev/null "$1"; fi; }
for p in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi /usr/share/openmpi \
         /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted; do
    hide "$(readlink -f "$p")"
done
for f in /usr/lib/x86_64-linux-gnu/libmpi* /usr/lib/x86_64-linux-gnu/libopen-* /usr/lib/x86_64-linux-gnu/libpmix*; do
    hide "$(readlink -f "$f")"
done
# every library the bundle carries (and every one it should carry: see test_bundle.sh's copy)
for f in "$REF"/mpi/lib/x86_64-linux-gnu/openmpi/lib/*.so*; do
    for dir in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/local/lib; do
        hide "$(readlink -f "$dir/$(basename "$f")")"
    done
done
exec env -i PATH=/usr/bin:/bin HOME="$HOME" OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    bash -c 'source "$0/env.sh" && "$@"' "$B" "$@"
SH
mkdir -p "$W/empty"
hidden() { REF="$D" EMPTY="$W/empty" unshare --mount --propagation private bash "$W/hidden.sh" "$@"; }

# the namespace really hides OpenMPI: the bundle's mpirun is the one found, the system's is gone
hidden "$D" bash -c 'test "$(command -v mpirun)" = "$OPAL_PREFIX/bin/mpirun" && ! test -s /usr/bin/orted && ! test -e /etc/openmpi/openmpi-mca-params.conf' ||
    die "the namespace does not hide the system's OpenMPI"

hidden "$D" "$D/train_gpt" "$W/c.json" train.grad_accum=4 "out_dir=$W/one" > "$W/one.txt" 2>&1 ||
    die "one process failed: $(tail -n 20 "$W/one.txt")"
hidden "$D" timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS "$D/train_gpt" "$W/c.json" \
    "out_dir=$W/dp2" > "$W/dp2.txt" 2>&1 || die "mpirun -np 2 from the bundle failed: $(tail -n 20 "$W/dp2.txt")"
close_losses "$W/one/log.jsonl" "$W/dp2/log.jsonl"
close_weights "$W/one/model_00000010.bin" "$W/dp2/model_00000010.bin"

(cd "$W/cwd" && hidden "$D" "$D/build/test_cpu") > "$W/test_cpu.txt" 2>&1 || die "the bundle's test_cpu failed: $(tail -n 30 "$W/test_cpu.txt")"
grep '^All tests passed' "$W/test_cpu.txt" || die "test_cpu: no pass line: $(tail -n 5 "$W/test_cpu.txt")"

# a bundle that lacks a library fails in the same namespace (the system's copy is hidden too)
cp -r "$D" "$W/lacking"
lib=$(ls "$W/lacking/mpi/lib/x86_64-linux-gnu/openmpi/lib/" | grep -m1 '^libhwloc\.so') || die "the bundle has no libhwloc"
rm "$W/lacking/mpi/lib/x86_64-linux-gnu/openmpi/lib/$lib"
if hidden "$W/lacking" timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$W/lacking/train_gpt" "$W/c.json" \
    "out_dir=$W/lacking_out" > "$W/lacking.txt" 2>&1; then
    die "mpirun from a bundle without $lib succeeded"
fi
grep -q "$lib" "$W/lacking.txt" || die "the failure without $lib does not name it: $(tail -n 5 "$W/lacking.txt")"
echo "without $lib: fails ($(grep -m1 "$lib" "$W/lacking.txt"))"
