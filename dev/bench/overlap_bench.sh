#!/usr/bin/env bash
# Communication overlap: step time of a dp=2 run (2 processes under mpirun, one OpenMP
# thread each) with parallel.overlap true and false, at several LLMC_COMM_DELAY_MS delays (every
# collective completes no sooner than the delay after its post: a slow network). The model is
# test/e2e/test_overlap.sh's (12 layers, d_model 128, 1024 tokens per micro-batch per rank);
# 5 steps per run, medians of steps 2-5 of step time (ms), comm_ms and compute_ms from log.jsonl.
# Appends a table to dev/bench/RESULTS.md with the date, the commit and the machine.
# DEVICE=cuda runs the two ranks on the GPU (one GPU: both share it, over MPI; scripts/gpu_check.sh's
# layouts stage), else the CPU.
#   usage: [DEVICE=cuda] dev/bench/overlap_bench.sh [ZERO] [DELAYS...]   (default: 1, delays 0 10 20 40)
set -euo pipefail
cd "$(dirname "$0")/../.."
ZERO=${1:-1}
shift || true
[ $# -gt 0 ] && DELAYS=("$@") || DELAYS=(0 10 20 40)
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" = cpu ]; then
    [ -x train_gpt ] && [ -x dev/data/synth_shards ] || make -j"$(nproc)" CUDA=0 train_gpt dev/data/synth_shards
    where="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1), $(getconf _NPROCESSORS_ONLN) cores"
    title=CPU
else
    [ -x train_gpt ] && [ -x dev/data/synth_shards ] || { echo "build train_gpt and dev/data/synth_shards first" >&2; exit 2; }
    where="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1), both ranks on it"
    title=GPU
fi
W=$(mktemp -d /tmp/overlap_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dev/data/synth_shards --out "$W/data/train" --shards 1 --tokens 100000 --vocab 512 --seed 1 > /dev/null
cat > "$W/c.json" <<JSON
{ "device": "$DEVICE", "precision": "fp32",
  "model": { "n_layer": 12, "n_head": 4, "d_model": 128, "vocab_size": 512, "max_seq_len": 64 },
  "data": { "train": "$W/data/train_*.bin" },
  "train": { "micro_batch": 16, "seq_len": 64, "grad_accum": 1, "steps": 5, "lr": 3e-3, "warmup_steps": 1 },
  "parallel": { "zero": $ZERO, "bucket_mb": 0.8 },
  "out_dir": "$W/out" }
JSON
medians() {  # "ms comm_ms compute_ms" medians over the steps after the first
    python3 - "$1" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
print(" ".join("%.0f" % statistics.median(r[k] for r in recs) for k in ("ms", "comm_ms", "compute_ms")))
PY
}
load=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
for d in "${DELAYS[@]}"; do
    row="| $d"
    for ov in true false; do
        LLMC_COMM_DELAY_MS=$d mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS -x LLMC_COMM_DELAY_MS ./train_gpt \
            "$W/c.json" "out_dir=$W/run" parallel.overlap=$ov > "$W/out.txt"
        read -r ms comm compute <<< "$(medians "$W/run/log.jsonl")"
        row+=" | $ms | $comm | $compute"
        rm -rf "$W/run"
    done
    rows+=("$row |")
done
{
    echo
    echo "## Communication overlap ($title) - $(date -u +%Y-%m-%d) - commit $(git rev-parse --short HEAD) - $where"
    echo
    echo "\`DEVICE=$DEVICE dev/bench/overlap_bench.sh $ZERO ${DELAYS[*]}\`: dp=2 ZeRO-$ZERO over MPI, 12 layers x d_model 128,"
    echo "$(grep -o '[0-9]* gradient buckets' "$W/out.txt"), LLMC_COMM_DELAY_MS per collective; medians of steps 2-5 in ms"
    echo "(comm = waits inside communication, compute = step - comm). Load average before the runs: $load (other jobs"
    echo "share these cores: timings are noisy)."
    echo
    echo "| delay ms | overlap: step | comm | compute | no overlap: step | comm | compute |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} >> dev/bench/RESULTS.md
tail -n $(( ${#rows[@]} + 2 )) dev/bench/RESULTS.md
