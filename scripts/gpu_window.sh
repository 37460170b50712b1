#!/usr/bin/env bash
# One GPU window in one command (issue 26), from the kit: gpu-kit/scripts/gpu_window.sh OUT [SECONDS [FROM]]
# Under one global deadline (SECONDS, default 540: one device command of at most 600 s), in order
# of value (FROM: the stage to start at, quick, kernels, variants, profile or sanitizers, for a second
# device command where the first one's deadline ended the window's plan early):
#   1. gpu_check --quick (test_gpu per filter, parity, 124M and 1.5B beside PyTorch, ncu table);
#   2. gpu_check --kernels (dev/cuda's kernel versions; attention beside PyTorch's SDPA);
#   2b. gpu_check --variants (the step with each kernels.* config way beside the default);
#   3. gpu_check --profile of an fp8 step at the 1.5B shape's width (4 layers of d_model 1600, B=8:
#      the casts' share beside the GEMMs'), then at GPT-2 124M bf16 B=32 (the benchmark shape);
#   4. compute-sanitizer racecheck on the reference model and memcheck on the model step.
# Writes at most 9 files to OUT (what the device tool brings back): quick.md, kernels.md, variants.md,
# profile_fp8.md, profile.md, sanitizers.txt, RESULTS.md (the tables as gpu_check appended them),
# window.log and logs.tgz (every stage's logs without data shards or weights, under 16 MiB).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_window.sh OUT [SECONDS [FROM]]}
TOTAL=${2:-540}
FROM=${3:-quick}
STAGES=(quick kernels variants profile sanitizers)
[[ " ${STAGES[*]} " == *" $FROM "* ]] || { echo "gpu_window.sh: FROM '$FROM' is not one of: ${STAGES[*]}" >&2; exit 2; }
mkdir -p "$OUT"
T0=$(date +%s)
END=$((T0 + TOTAL))
left() { echo $((END - $(date +%s))); }
W=$(mktemp -d "${TMPDIR:-/tmp}/gpu_window.XXXXXX")
trap 'rm -rf "$W"' EXIT  # what matters is in OUT (logs.tgz)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/window.log"; }
# wanted NAME: whether stage NAME comes at or after FROM
wanted() {
    local st
    for st in "${STAGES[@]}"; do
        [ "$st" = "$FROM" ] && return 0
        [ "$st" = "$1" ] && return 1
    done
}
# stage NAME SHARE ARGS...: gpu_check with a deadline of min(SHARE, what is left less the tail's 40 s)
stage() {
    local name=$1 share=$2; shift 2
    wanted "$name" || return 0
    local d=$(( $(left) - 40 ))
    [ "$d" -lt "$share" ] || d=$share
    if [ "$d" -lt 20 ]; then log "$name: skipped ($(left) s left)"; return; fi
    log "$name: up to $d s"
    QUICK_SECONDS=$d scripts/gpu_check.sh --deadline "$d" --out "$W" "$@" >"$W/$name.stdout" 2>&1
    log "$name: exit $? after $(( $(date +%s) - T0 )) s"
    [ -f "$W/$name/table.md" ] && cp "$W/$name/table.md" "$OUT/$name.md"
}
stage quick 330 --quick
stage kernels 150 --kernels
stage variants 120 --variants
mkdir -p "$W/data"
if [ -x dev/data/synth_shards ] && dev/data/synth_shards --out "$W/data/bench" --shards 1 --tokens 3000000 --vocab 50257 >/dev/null 2>&1; then
    data=(data.train="$W/data/bench_*.bin" data.val= tokenizer= model.arch=gpt2 model.vocab_size=50257
          model.max_seq_len=1024 train.seq_len=1024 train.grad_accum=1)
    # (gpu_check's profile stage writes W/profile: each table is moved aside before the next)
    stage profile 50 --profile - device=cuda precision=fp8 model.n_layer=4 model.n_head=25 model.d_model=1600 \
        train.micro_batch=8 "${data[@]}"
    if [ -d "$W/profile" ]; then
        mv "$W/profile" "$W/profile_fp8"
        [ -f "$OUT/profile.md" ] && mv "$OUT/profile.md" "$OUT/profile_fp8.md"
    fi
    stage profile 60 --profile - device=cuda precision=bf16 model.n_layer=12 model.n_head=12 model.d_model=768 \
        train.micro_batch=32 "${data[@]}"
fi
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
wanted sanitizers || CS=
for spec in "racecheck reference" "memcheck model_step"; do
    t=$(( $(left) - 15 )); [ "$t" -le 60 ] || t=60
    [ "$t" -ge 10 ] && [ -n "$CS" ] || break
    timeout -k 2 "$t" "$CS" --tool "${spec% *}" --error-exitcode 9 build/test_gpu "${spec#* }" >"$W/san_${spec% *}_${spec#* }.log" 2>&1
    echo "$spec: exit $? (limit $t s): $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|passed, ' "$W/san_${spec% *}_${spec#* }.log" | tr '\n' ' ')" >>"$OUT/sanitizers.txt"
done
[ -f dev/bench/RESULTS.md ] && cp dev/bench/RESULTS.md "$OUT/RESULTS.md"
tar czf "$OUT/logs.tgz" -C "$W" --exclude='*.bin' --exclude='ckpt' --exclude='data' --exclude='*.safetensors' . 2>/dev/null
log "done: $(( $(date +%s) - T0 )) s; logs.tgz $(du -h "$OUT/logs.tgz" | cut -f1)"
