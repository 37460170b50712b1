#!/usr/bin/env bash
# The GPU kit (make gpu-kit = scripts/bundle.sh --kit, issue 26) holds what a GPU window runs, so
# that nothing compiles on the device: train_gpt, test_gpu, the data tools, the OpenMPI runtime,
# gpu_check.sh with gpu_quick.sh, the PyTorch peers, dev/cuda's kernel binaries and test_gpu's
# reference data, under 60 MiB; and gpu_check.sh --quick (and --kernels) --dry-run, run from
# inside the kit, finds every binary a step names.
# Packaged here from this checkout's build (REUSE_BUILD=1, in seconds; `make gpu-kit` builds the
# portable one for sm_90 into build-dist/ first). Without the CUDA build (CUDA=0) the kit is refused.
source "$(dirname "$0")/lib.sh"
K="$W/kit"
if [ ! -x "$ROOT/build/test_gpu" ]; then
    expect_fail 1 "no build/test_gpu (a kit needs the CUDA build)" env REUSE_BUILD=1 DIST="$K" bash "$ROOT/scripts/bundle.sh" --kit
    echo "no CUDA build here: the kit was refused as it must be"; exit 0
fi
REUSE_BUILD=1 DIST="$K" bash "$ROOT/scripts/bundle.sh" --kit > "$W/kit.log" 2>&1 || die "bundle.sh --kit: $(tail -n 5 "$W/kit.log")"
[ ! -e "$K/build/test_cpu" ] || die "the kit holds build/test_cpu (nothing on the device runs it)"
for f in train_gpt build/test_gpu dev/data/synth_shards dev/data/prepare_text env.sh COMMIT \
         scripts/gpu_check.sh scripts/gpu_quick.sh scripts/gpu_window.sh dev/bench/torch_gpt2.py test/data/ref_model.bin test/data/ref_state.bin \
         dev/cuda/attention_forward dev/cuda/attention_backward dev/cuda/classifier dev/cuda/layernorm dev/cuda/matmul_epilogue dev/cuda/fp8_gemm dev/cuda/fp8_cast \
         dev/bench/torch_attention.py; do
    [ -e "$K/$f" ] || die "the kit lacks $f"
done
size=$(du -sm "$K" | cut -f1)
[ "$size" -le 60 ] || die "the kit is $size MiB, over 60"
dry=$(cd /tmp && bash "$K/scripts/gpu_check.sh" --quick --dry-run) || die "kit's --quick --dry-run: $dry"
# every program a step runs by a relative path lies in the kit
for p in $(echo "$dry" | grep '^\[dry-run\]' | grep -oE '(\./train_gpt|build/test_gpu|dev/data/synth_shards|dev/bench/torch_gpt2.py)' | sort -u); do
    [ -e "$K/$p" ] || die "a --quick step runs $p, which the kit lacks"
done
adry=$(cd /tmp && bash "$K/scripts/gpu_check.sh" --kernels --dry-run) || die "kit's --kernels --dry-run: $adry"
for p in $(echo "$adry" | grep '^\[dry-run\]' | grep -oE '(dev/cuda/[a-z0-9_]+|dev/bench/torch_attention.py)' | sort -u); do
    [ -e "$K/$p" ] || die "a --kernels step runs $p, which the kit lacks"
done
# gpu_window.sh's plumbing (no GPU here: every gpu_check stage stops at once): at most 8 files
# in OUT, named as the device tool brings them back, and each stage in its log
(cd /tmp && bash "$K/scripts/gpu_window.sh" "$W/win" 120 > "$W/win.txt" 2>&1) || die "gpu_window.sh: $(tail -n 3 "$W/win.txt")"
n=$(ls "$W/win" | wc -l)
[ "$n" -le 8 ] || die "gpu_window.sh wrote $n files (the device tool returns 8): $(ls "$W/win")"
ls "$W/win" | grep -qvE '^[A-Za-z0-9._-]+$' && die "gpu_window.sh wrote a name the device tool refuses: $(ls "$W/win")"
for st in quick kernels profile; do grep -q "^\[[0-9]*s\] $st: " "$W/win/window.log" || die "window.log lacks stage $st: $(cat "$W/win/window.log")"; done
[ -s "$W/win/logs.tgz" ] || die "gpu_window.sh wrote no logs.tgz"
# a second device command takes the plan up where the first one's deadline ended it (FROM)
(cd /tmp && bash "$K/scripts/gpu_window.sh" "$W/win2" 60 variants > "$W/win2.txt" 2>&1) || die "gpu_window.sh from variants: $(tail -n 3 "$W/win2.txt")"
grep -qE '^\[[0-9]*s\] (quick|kernels): ' "$W/win2/window.log" && die "gpu_window.sh from variants ran an earlier stage: $(cat "$W/win2/window.log")"
grep -q '^\[[0-9]*s\] variants: ' "$W/win2/window.log" || die "gpu_window.sh from variants: no variants stage: $(cat "$W/win2/window.log")"
expect_fail 2 "FROM 'nope' is not one of: quick kernels variants profile sanitizers" bash "$K/scripts/gpu_window.sh" "$W/win3" 60 nope
echo "gpu kit: $size MiB, $(echo "$dry" | grep -c '^\[dry-run\]') steps of --quick, $(echo "$adry" | grep -c '^\[dry-run\]') of --kernels, every program in the kit"
