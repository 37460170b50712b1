#!/usr/bin/env bash
# The CPU backend's GEMM: the hand-written kernel (llmc/cpu/gemm.h) against OpenBLAS's sgemm (the
# OpenMP build, libopenblas-openmp-dev) on the matmuls of GPT-2 124M with 256 tokens
# (B=4, T=64) and on 2048^3, each in the three passes of a linear layer (fwd, dinp, dw; see
# dev/bench/cpu_gemm_bench.cpp); then a 124M training step on the CPU (fp32, B=4, T=64) with each
# trainer given (to compare builds). Every number is the best of RUNS runs (the cores may be
# shared: the best is the least disturbed). Appends a table to dev/bench/RESULTS.md with the date, the commit and the
# machine. OMP_NUM_THREADS as set (default: all cores); OPENBLAS_* as set.
#   usage: dev/bench/cpu_gemm.sh [RUNS (default 3)] [TRAINER ...]
#   TRAINER: label=path of a train_gpt binary (default: train_gpt=./train_gpt)
set -euo pipefail
cd "$(dirname "$0")/../.."
args="$*"
RUNS=${1:-3}
shift || true
trainers=("$@")
[ ${#trainers[@]} -gt 0 ] || trainers=(train_gpt=./train_gpt)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
make -s CUDA=0 build/cpu_gemm_bench dev/data/synth_shards
W=$(mktemp -d /tmp/cpu_gemm.XXXXXX)
trap 'rm -rf "$W"' EXIT
load=$(cut -d' ' -f1-3 /proc/loadavg)

# GEMM rows: per (shape, pass) the best GFLOP/s of each side over the runs
for r in $(seq "$RUNS"); do build/cpu_gemm_bench 1 >> "$W/gemm.md"; done
gemm_rows=$(grep -v -e '^| shape' -e '^|---' "$W/gemm.md" | awk -F'|' '
    { k = $2 "|" $3; h = $4 + 0; b = $5 + 0; if (!(k in H)) order[n++] = k;
      if (h > H[k]) H[k] = h; if (b > B[k]) B[k] = b }
    END { for (i = 0; i < n; i++) { k = order[i]; split(k, s, "|");
          printf "|%s|%s| %.1f | %.1f | %.2f |\n", s[1], s[2], H[k], B[k], B[k] / H[k] } }')

# the 124M step: best step time (steps 2-6) over the runs, per trainer
dev/data/synth_shards --out "$W/train" --shards 1 --tokens 100000 --vocab 50257 --seed 1 > /dev/null
dev/data/synth_shards --out "$W/val" --shards 1 --tokens 10000 --vocab 50257 --seed 2 > /dev/null
cat > "$W/step.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "arch": "gpt2", "n_layer": 12, "n_head": 12, "d_model": 768, "vocab_size": 50257, "max_seq_len": 1024 },
  "data": { "train": "$W/train_*.bin", "val": "$W/val_*.bin" },
  "train": { "micro_batch": 4, "seq_len": 64, "grad_accum": 1, "steps": 6, "lr": 3e-4, "warmup_steps": 2 },
  "eval": { "every": 0, "sample_every": 0 }, "checkpoint": { "every": 0 }, "out_dir": "$W/out" }
JSON
step_rows=""
for t in "${trainers[@]}"; do
    label=${t%%=*} bin=${t#*=}
    [ -x "$bin" ] || { echo "cpu_gemm.sh: no trainer at $bin (label $label)" >&2; exit 2; }
    best=""
    for r in $(seq "$RUNS"); do
        "$bin" "$W/step.json" > "$W/step.txt" 2>&1 || { tail -n 20 "$W/step.txt" >&2; exit 1; }
        params=$(sed -n 's/.*; \([0-9]*\) parameters padded.*/\1/p' "$W/step.txt")
        ms=$(grep -o '"ms":[0-9.]*,"step":[2-6],' "$W/out/log.jsonl" | cut -d: -f2 | cut -d, -f1 | sort -g | head -n1)
        [ -z "$best" ] || ms=$(awk -v a="$best" -v b="$ms" 'BEGIN { print (a < b) ? a : b }')
        best=$ms
        rm -rf "$W/out"
    done
    step_rows+=$(awk -v l="$label" -v ms="$best" -v p="$params" \
        'BEGIN { printf "| %s | %.0f | %.1f |\n", l, ms, 6 * p * 256 / (ms * 1e-3) * 1e-9 }')$'\n'
done

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
blas=$(OPENBLAS_VERBOSE=2 build/cpu_gemm_bench 0 64x64x64 2>&1 | sed -n 's/^Core: //p')
{
    echo
    echo "## CPU GEMM: hand-written vs OpenBLAS (CPU) - $(date -u +%Y-%m-%d) - commit $(git rev-parse --short HEAD) - $cpu, $(nproc) cores"
    echo
    echo "\`dev/bench/cpu_gemm.sh $args\`: OMP_NUM_THREADS=$OMP_NUM_THREADS; OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas0-openmp 2>/dev/null || echo '?')"
    echo "(OpenMP build), kernels for core '$blas' (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}). Best of $RUNS runs;"
    echo "load average before the runs: $load (the cores are shared with other jobs: a lower bound)."
    echo "Shape = tokens x out x in of a linear layer; fwd = inp w^T, dinp = dout w, dw = dout^T inp."
    echo
    echo "| shape | pass | hand-written GFLOP/s | OpenBLAS GFLOP/s | OpenBLAS / hand-written |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "$gemm_rows"
    echo
    echo "GPT-2 124M training step on the CPU (fp32, B=4, T=64: 256 tokens), best step of 2-6 over $RUNS runs;"
    echo "model GFLOP/s = 6 x $params parameters x 256 tokens / step time."
    echo
    echo "| trainer | step ms | model GFLOP/s |"
    echo "|---|---|---|"
    printf '%s' "$step_rows"
} | tee -a dev/bench/RESULTS.md
