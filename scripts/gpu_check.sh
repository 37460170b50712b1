#!/usr/bin/env bash
# The checks to run on a machine with a CUDA GPU (issue 12), in stages ordered by what they prove,
# each meant to finish within 8 minutes on one H100 so that one stage fits one command:
#   scripts/gpu_check.sh --list                      the stages, one a line, with what each proves
#   scripts/gpu_check.sh [--stage NAME]... [--out DIR] [--steps N]
#   scripts/gpu_check.sh ... --deadline SECONDS             every command's limit within the time left
#   scripts/gpu_check.sh --quick [--out DIR] [--dry-run]     about 5 minutes, one global deadline
#   scripts/gpu_check.sh --profile CONFIG [key=value...]     the kernel table of a run (ncu)
#   scripts/gpu_check.sh --kernels                           dev/cuda's kernel versions, attention beside PyTorch
#   scripts/gpu_check.sh --variants                          the step with each kernels.* way beside the default
# (--quick, --kernels, --variants and --profile: scripts/gpu_quick.sh; --dry-run prints their steps and runs nothing.)
# Without --stage, every stage in order. Each stage appends its table (date, commit, GPU) to
# dev/bench/RESULTS.md as soon as it finishes; --out DIR also copies the table and the stage's logs
# to DIR/NAME/, and writes each row to DIR/NAME/rows.partial.md the moment it is known (what a
# stage killed at a time limit leaves). The logs are written in a folder under $TMPDIR (or /tmp),
# kept and named at the end unless --out took them (or a dry run wrote none). A failing check is a FAIL row; the stage carries on, and the script exits 1 at the
# end if any row failed. Runs from the repository (builds what a stage needs for the GPU present)
# or from the offline bundle (dist/scripts/gpu_check.sh: uses the binaries there, builds nothing);
# the bundle's env.sh is sourced when no mpirun is on PATH.
set -u
cd "$(dirname "$0")/.."
STAGES=(env ops parity bench layouts fp8)
describe() {
    case "$1" in
        env) echo "what the machine has (GPU, driver, toolkit, NCCL, cuDNN, PyTorch), a dp=2 smoke run, transformers loading our exports" ;;
        ops) echo "build/test_gpu (op parity with the CPU backend), its large cases, then under compute-sanitizer (memcheck's run: a second process, bitwise)" ;;
        parity) echo "the whole model on the GPU (fp32, bf16) against the CPU backend (fp32); optimizer offload against the GPU optimizer; two processes bitwise equal" ;;
        bench) echo "GPT-2 124M and a 1.5B shape in bf16 at T=1024 (tokens/s, MFU, peak memory); 124M with optimizer offload; the PyTorch peer (dev/bench/torch_gpt2.py) at both shapes and the ratio; dev/cuda kernels" ;;
        layouts) echo "dp, tp, pp (1F1B, interleaved), cp, ZeRO-2/3, SP, optimizer offload with ZeRO-1/3, MoE with parallel.ep on the one GPU over MPI against one process; parallel.comm=nccl against mpi; the overlap table" ;;
        fp8) echo "FP8 against bf16 on the 124M shape (300 steps, within 1%); FP8/bf16 tokens/s at the 1.5B shape" ;;
    esac
}
usage() {
    echo "usage: $0 --list | [--stage NAME]... [--out DIR] [--steps N] [--deadline SECONDS]" \
         "| --quick [--out DIR] [--dry-run] | --kernels | --variants" \
         "| --profile CONFIG [key=value...]   (stages: ${STAGES[*]})" >&2
    exit 2
}
source "$(dirname "$0")/gpu_quick.sh"
STEPS=30
OUT=""
WANT=()
DRY_RUN=0
PROFILE_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --list) for st in "${STAGES[@]}"; do printf '%-8s %s\n' "$st" "$(describe "$st")"; done; exit 0 ;;
        --stage) [ $# -ge 2 ] || usage
                 [ -n "$(describe "$2")" ] || { echo "gpu_check: unknown stage '$2' (stages: ${STAGES[*]})" >&2; exit 2; }
                 WANT+=("$2"); shift ;;
        --out) [ $# -ge 2 ] || usage; OUT="$2"; shift ;;
        --steps) [ $# -ge 2 ] || usage; STEPS="$2"; shift ;;
        --quick) WANT+=(quick) ;;
        --kernels) WANT+=(kernels) ;;
        --variants) WANT+=(variants) ;;
        --deadline) [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || usage; DEADLINE=$(( $(date +%s) + $2 )); shift ;;
        --dry-run) DRY_RUN=1 ;;
        --profile) [ $# -ge 2 ] || usage
                   [ "$2" = - ] || [ -f "$2" ] || { echo "gpu_check: --profile: no config file '$2'" >&2; exit 2; }
                   WANT+=(profile); shift; PROFILE_ARGS=("$@"); break ;;
        *) usage ;;
    esac
    shift
done
[ ${#WANT[@]} -gt 0 ] || WANT=("${STAGES[@]}")
if [ "$DRY_RUN" = 1 ] && [[ " ${WANT[*]} " != *" quick "* && " ${WANT[*]} " != *" profile "* && " ${WANT[*]} " != *" kernels "* && " ${WANT[*]} " != *" variants "* ]]; then
    echo "gpu_check: --dry-run goes with --quick or --profile" >&2; exit 2
fi

if [ "$DRY_RUN" = 1 ]; then
    GPU_NAME="(dry run: no GPU queried)"; GPU_CC=90; GPU_MEM="?"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed): stage ${WANT[0]} needs one; nothing was run" >&2
    exit 1
else
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | sed 's/ *$//')
GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')
GPU_MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -n1)
fi
if git rev-parse --git-dir >/dev/null 2>&1; then
    COMMIT=$(git rev-parse --short HEAD)
    DIRTY=$(git status --porcelain | grep -qv '^??' && echo " (+local changes)" || true)
else  # the offline bundle: the commit scripts/bundle.sh built it from
    COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
    DIRTY=""
fi
JOBS=$(nproc 2>/dev/null || echo 4)
if ! command -v mpirun >/dev/null 2>&1; then
    for e in env.sh dist/env.sh; do [ -f "$e" ] && { source "$e"; echo "gpu_check: OpenMPI from $e"; break; }; done
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "gpu_check: $GPU_NAME (sm_$GPU_CC, $GPU_MEM), commit $COMMIT$DIRTY"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
echo "gpu_check: logs in $WORK"
ROWS=()
ANY_FAIL=0
row() {  # stage result tok_s mfu peak notes (a note's newlines and pipes would break the table)
    local note=${6:-}
    note=${note//$'\n'/; }
    note=${note//|/\\|}
    ROWS+=("| $1 | $2 | ${3:-} | ${4:-} | ${5:-} | $note |")
    # with --out, each row also lands at once in DIR/STAGE/rows.partial.md: a stage killed at a
    # time limit (SIGKILL: no trap runs) still leaves the rows it finished
    if [ -n "$OUT" ] && [ "$DRY_RUN" = 0 ] && [ -n "${CUR_STAGE:-}" ] && mkdir -p "$OUT/$CUR_STAGE"; then
        echo "${ROWS[${#ROWS[@]}-1]}" >>"$OUT/$CUR_STAGE/rows.partial.md"
    fi
    case "$2" in FAIL*) ANY_FAIL=1 ;; esac
    echo "  -> $1: $2 ${6:-}"
}

# build TARGET...: make the targets for this GPU (in the repository; the bundle has them built)
build() {
    [ -f Makefile ] || return 0
    if ! make -j"$JOBS" GPU_ARCH="$GPU_CC$([ "$GPU_CC" = 90 ] && echo a)" "$@" >>"$WORK/build.log" 2>&1; then
        row "build $* (sm_$GPU_CC)" "FAIL" "" "" "" "see build.log: $(grep -m1 -i error "$WORK/build.log" | cut -c1-80)"
    fi
}

# tiny_model: a tiny fp32 CUDA model and its data under $L (the layouts, parity and smoke runs)
tiny_model() {
    L="$WORK/tiny"
    [ -f "$L/c.json" ] && return 0
    mkdir -p "$L"
    if [ -x dev/data/synth_shards ]; then
        dev/data/synth_shards --out "$L/train" --shards 1 --tokens 200000 --vocab 512 >/dev/null 2>&1
    fi
    cat >"$L/c.json" <<JSON
{ "device": "cuda", "precision": "fp32",
  "model": { "n_layer": 4, "n_head": 4, "d_model": 128, "vocab_size": 512, "max_seq_len": 64 },
  "data": { "train": "$L/train_*.bin" },
  "train": { "micro_batch": 4, "seq_len": 64, "grad_accum": 4, "steps": 10, "lr": 1e-3 } }
JSON
}

# the largest relative difference between the per-step losses of two log.jsonl files, in order,
# and how many steps were compared ("1.2e-07 10"); fails, saying why, unless both logs exist and
# hold the same non-zero number of loss records (a run that died early or never started fails)
loss_rel_diff() {  # base_log other_log
    local f
    for f in "$1" "$2"; do
        if [ ! -s "$f" ]; then echo "no $f"; return 1; fi
    done
    awk 'FNR == 1 { f++ }
         match($0, /"loss":[^,}]*/) { n[f]++; x[f, n[f]] = substr($0, RSTART + 7, RLENGTH - 7) + 0 }
         END {
             if (n[1] == 0 || n[1] != n[2]) { printf "%d loss records against %d", n[1], n[2]; exit 1 }
             m = 0
             for (i = 1; i <= n[1]; i++) {
                 d = x[1, i] - x[2, i]; if (d < 0) d = -d
                 a = x[1, i] < 0 ? -x[1, i] : x[1, i]
                 r = a > 0 ? d / a : d; if (r > m) m = r
             }
             printf "%.2g %d", m, n[1]
         }' "$1" "$2"
}

# loss_row NAME BASE_LOG LOG [NOTE]: a table row, PASS when the two runs' per-step losses agree to 1e-5 relative
loss_row() {
    local res
    if ! res=$(loss_rel_diff "$2" "$3"); then
        row "$1" "FAIL" "" "" "" "against $2: $res"
    elif awk -v m="${res% *}" 'BEGIN { exit !(m + 0 <= 1e-5) }'; then
        row "$1" "PASS" "" "" "" "max relative loss difference ${res% *} over ${res#* } steps${4:+; $4}"
    else
        row "$1" "FAIL" "" "" "" "max relative loss difference ${res% *} > 1e-5"
    fi
}

# loss_tol_row NAME BASE_LOG LOG TOL: a table row, PASS when the per-step losses agree to TOL relative
loss_tol_row() {
    local res
    if ! res=$(loss_rel_diff "$2" "$3"); then
        row "$1" "FAIL" "" "" "" "$res"
    elif awk -v m="${res% *}" -v t="$4" 'BEGIN { exit !(m + 0 <= t) }'; then
        row "$1" "PASS" "" "" "" "max relative difference ${res% *} over ${res#* } steps (limit $4)"
    else
        row "$1" "FAIL" "" "" "" "max relative difference ${res% *} > $4"
    fi
}

# the "memory" value of the JSON object on the first line of stdin, keys sorted (empty when none)
memory_json() {
    python3 -c 'import json, sys; print(json.dumps(json.loads(sys.stdin.readline())["memory"], sort_keys=True))' \
        2>/dev/null
}

# parse a log.jsonl: median tok_per_s and mfu over the steps after the first 5
parse_log() {
    local f="$1"
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$f" <<'PY'
import json, sys, statistics
tok, mfu = [], []
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except Exception:
        continue
    if "tok_per_s" in r:
        tok.append(float(r["tok_per_s"]))
        if "mfu" in r:
            mfu.append(float(r["mfu"]))
tok, mfu = tok[5:] or tok, mfu[5:] or mfu
t = "%.0f" % statistics.median(tok) if tok else ""
m = statistics.median(mfu) if mfu else None
# mfu may be logged as a fraction or a percentage
ms = "" if m is None else ("%.1f%%" % (m * 100 if m <= 1.0 else m))
print(t + "\t" + ms)
PY
    else
        local t
        t=$(grep -o '"tok_per_s": *[0-9.eE+-]*' "$f" | sed 's/.*: *//' | tail -n +6 | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
        local m
        m=$(grep -o '"mfu": *[0-9.eE+-]*' "$f" | sed 's/.*: *//' | tail -n +6 | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
        printf '%s\t%s\n' "$t" "$m"
    fi
}

bench() {  # name config_file fallback_model_json "micro-batches to try" [precision] [extra key=value]
    local name="$1" cfg="$2" model_json="$3" mbs="$4" prec="${5:-bf16}" extra="${6:-}"
    echo "== bench $name"
    if [ ! -x ./train_gpt ]; then row "bench $name bf16" "FAIL" "" "" "" "train_gpt not built"; return; fi
    local data="$WORK/synth/train"
    if ! ls "$data"_*.bin >/dev/null 2>&1; then
        mkdir -p "$WORK/synth"
        if [ -x dev/data/synth_shards ]; then
            dev/data/synth_shards --out "$data" --shards 2 --tokens 20000000 --vocab 50257 >"$WORK/synth.log" 2>&1
        fi
    fi
    if ! ls "$data"_*.bin >/dev/null 2>&1; then row "bench $name bf16" "FAIL" "" "" "" "no synthetic shards"; return; fi
    if [ ! -f "$cfg" ]; then  # the bench config is not in the repo yet: write one
        cfg="$WORK/$name.json"
        cat >"$cfg" <<JSON
{ "device": "cuda", "precision": "bf16", "model": $model_json,
  "data": { "train": "$data*.bin" },
  "train": { "micro_batch": 8, "seq_len": 1024, "grad_accum": 1, "steps": $STEPS, "lr": 3e-4,
             "lr_schedule": "constant", "weight_decay": 0.1, "grad_clip": 1.0 } }
JSON
    fi
    local mb out log rc
    for mb in $mbs; do
        out="$WORK/bench_${name}_${prec}_B$mb"
        mkdir -p "$out"
        log="$out/stdout.log"
        echo "   trying micro_batch=$mb"
        timeout "$(tlimit 900)" ./train_gpt "$cfg" device=cuda precision="$prec" train.steps="$STEPS" train.micro_batch="$mb" \
            train.seq_len=1024 train.grad_accum=1 data.train="$data*.bin" data.val= eval.every=0 \
            eval.sample_every=0 tokenizer= checkpoint.every=0 checkpoint.resume=never checkpoint.dir="$out/ckpt" \
            log.jsonl="$out/log.jsonl" out_dir="$out" $extra >"$log" 2>&1
        rc=$?
        if [ $rc -eq 0 ] && [ -s "$out/log.jsonl" ]; then
            local parsed tok mfu peak
            parsed=$(parse_log "$out/log.jsonl")
            tok=$(printf '%s' "$parsed" | cut -f1)
            mfu=$(printf '%s' "$parsed" | cut -f2)
            peak=$(grep -i 'peak' "$log" | tail -n1 | sed 's/^[[:space:]]*//' | cut -c1-60)
            row "bench $name $prec (B=$mb, T=1024)" "PASS" "$tok" "$mfu" "$peak" "$STEPS steps"
            eval "TOK_${name}_${prec}=$tok"
            eval "MB_${name}_${prec}=$mb"
            return
        fi
        # out of memory: try a smaller micro-batch; anything else is a failure
        if ! grep -qiE 'out of memory|cudaErrorMemoryAllocation' "$log"; then
            row "bench $name $prec (B=$mb)" "FAIL" "" "" "" "exit $rc: $(grep -iE 'error' "$log" | tail -n1 | cut -c1-90)"
            return
        fi
    done
    row "bench $name $prec" "FAIL" "" "" "" "out of memory at every micro-batch tried ($mbs)"
}

MODEL_124M='{ "arch": "gpt2", "n_layer": 12, "n_head": 12, "d_model": 768, "vocab_size": 50257, "max_seq_len": 1024 }'
MODEL_1558M='{ "arch": "gpt2", "n_layer": 48, "n_head": 25, "d_model": 1600, "vocab_size": 50257, "max_seq_len": 1024 }'

stage_env() {
    echo "== env"
    row "GPU" "INFO" "" "" "" "$GPU_NAME, sm_$GPU_CC, $GPU_MEM, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
    local v
    v=$( (nvcc --version || "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version) 2>/dev/null | sed -n 's/.*release \([^,]*\),.*/\1/p')
    row "CUDA toolkit (nvcc)" "INFO" "" "" "" "${v:-not found}"
    v=$(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' /usr/include/nccl.h "${CUDA_HOME:-/usr/local/cuda}"/include/nccl.h 2>/dev/null | awk '{printf "%s%s", (NR > 1 ? "." : ""), $3}')
    row "NCCL" "INFO" "" "" "" "${v:-nccl.h not found}; $(ldconfig -p 2>/dev/null | grep -o 'libnccl.so[.0-9]*' | head -n1 | grep . || echo 'libnccl not in ldconfig')"
    row "cuDNN" "INFO" "" "" "" "$(ldconfig -p 2>/dev/null | grep -o 'libcudnn.so[.0-9]*' | head -n1 | grep . || echo 'libcudnn not in ldconfig')"
    v=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null)
    row "PyTorch" "INFO" "" "" "" "${v:-not importable}"
    row "OpenMPI" "INFO" "" "" "" "$(command -v mpirun || echo 'no mpirun') $(mpirun --version 2>/dev/null | head -n1); ${OPAL_PREFIX:+OPAL_PREFIX $OPAL_PREFIX}"
    # smoke run: the binaries on this GPU, one process and dp=2 over mpirun, the same losses
    build train_gpt dev/data/synth_shards
    tiny_model
    if [ ! -x ./train_gpt ] || ! command -v mpirun >/dev/null 2>&1; then
        row "smoke: 1 process vs dp=2" "FAIL" "" "" "" "train_gpt or mpirun missing"
    elif ! timeout "$(tlimit 300)" ./train_gpt "$L/c.json" out_dir="$L/smoke1" >"$L/smoke1.txt" 2>&1; then
        row "smoke: 1 process vs dp=2" "FAIL" "" "" "" "1 process: $(grep -m1 -i error "$L/smoke1.txt" | cut -c1-90)"
    elif ! timeout "$(tlimit 300)" mpirun --oversubscribe -np 2 ./train_gpt "$L/c.json" parallel.dp=2 train.grad_accum=2 \
            out_dir="$L/smoke2" >"$L/smoke2.txt" 2>&1; then
        row "smoke: 1 process vs dp=2" "FAIL" "" "" "" "dp=2: $(grep -m1 -i error "$L/smoke2.txt" | cut -c1-90)"
    else
        loss_row "smoke: 1 process vs dp=2" "$L/smoke1/log.jsonl" "$L/smoke2/log.jsonl"
    fi
    # our Hugging Face exports, loaded by transformers as a user would (from_pretrained), give the
    # validation loss the trainer logged for the same weights (dev/reference/check_export.py)
    if ! python3 -c 'import transformers' >/dev/null 2>&1; then
        row "transformers loads our exports" "SKIP" "" "" "" "transformers not importable"
        return 0
    fi
    dev/data/synth_shards --out "$L/val" --shards 1 --tokens 20000 --vocab 512 >/dev/null 2>&1
    local arch out msg
    for arch in gpt2 llama; do
        out="$L/hf_$arch"
        msg=""
        if timeout "$(tlimit 300)" ./train_gpt "$L/c.json" device=cpu model.arch=$arch train.steps=3 "data.val=$L/val_*.bin" \
                eval.every=3 eval.batches=2 out.format=both "out_dir=$out" >"$out.txt" 2>&1 &&
            msg=$(python3 dev/reference/check_export.py "$out" "$L/val_000000.bin" --batch 4 --seq 64 --batches 2 \
                --engine transformers 2>&1); then
            row "transformers loads our $arch export" "PASS" "" "" "" "$(echo "$msg" | tail -n1 | cut -c1-120)"
        else
            row "transformers loads our $arch export" "FAIL" "" "" "" "$(echo "${msg:-$(tail -n1 "$out.txt")}" | tail -n1 | cut -c1-120)"
        fi
    done
}

stage_ops() {
    build build/test_gpu
    echo "== GPU op parity (build/test_gpu)"
    if [ -x build/test_gpu ]; then
        LLMC_GPU_DIGEST="$WORK/digest_1" build/test_gpu >"$WORK/test_gpu.log" 2>&1
        rc=$?
        summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/test_gpu.log" | tail -n1)
        grep '^FAIL' "$WORK/test_gpu.log" | head -n 20
        if [ $rc -eq 0 ] && [ -n "$summary" ]; then
            row "test_gpu (op parity)" "PASS" "" "" "" "$summary"
        else
            nf=$(grep -c '^FAIL' "$WORK/test_gpu.log")
            row "test_gpu (op parity)" "FAIL" "" "" "" "${summary:-no summary, exit $rc}; first: $(grep -m1 '^FAIL' "$WORK/test_gpu.log" | cut -c1-90) ($nf FAIL lines)"
        fi
        # the large cases (logits past 2^31 elements), not in the sanitizer runs below
        if timeout "$(tlimit 420)" build/test_gpu big >"$WORK/test_gpu_big.log" 2>&1; then
            row "test_gpu big (logits > 2^31)" "PASS" "" "" "" "$(grep -E '^[0-9]+ passed' "$WORK/test_gpu_big.log")"
        else
            row "test_gpu big (logits > 2^31)" "FAIL" "" "" "" "$(grep -m1 -E '^FAIL|error' "$WORK/test_gpu_big.log" | cut -c1-90)"
        fi
    else
        row "test_gpu (op parity)" "FAIL" "" "" "" "not built"
    fi
    # compute-sanitizer: memcheck on every op (the cases are small shapes), racecheck and synccheck
    # on the kernels with shared memory and block-level synchronization
    # on PATH, or in the toolkit (its bin/ is not always on PATH)
    local cs c
    cs=$(command -v compute-sanitizer || true)
    for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
             "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
        [ -z "$cs" ] && [ -x "$c" ] && cs=$c
    done
    if [ -z "$cs" ]; then
        row "compute-sanitizer" "FAIL" "" "" "" "compute-sanitizer not on PATH nor in ${CUDA_HOME:-/usr/local/cuda}"
        return
    fi
    local tool op log
    for spec in "memcheck all" "racecheck attention" "racecheck layernorm" "racecheck cross_entropy" \
                "synccheck attention" "synccheck layernorm" "synccheck cross_entropy"; do
        read -r tool op <<<"$spec"
        log="$WORK/sanitizer_${tool}_$op.log"
        echo "== compute-sanitizer --tool $tool ($op)"
        # memcheck over every case is a second process of the same cases: its results' digests
        # must equal the plain run's (determinism across processes; memcheck changes no arithmetic)
        if timeout "$(tlimit 420)" env LLMC_GPU_DIGEST="$WORK/digest_$tool$op" "$cs" --tool "$tool" --error-exitcode 3 \
            build/test_gpu ${op/#all/} >"$log" 2>&1; then
            row "compute-sanitizer $tool: $op" "PASS" "" "" "" "$(grep -m1 'ERROR SUMMARY' "$log")"
        else
            row "compute-sanitizer $tool: $op" "FAIL" "" "" "" "$(grep -m1 -E 'ERROR SUMMARY|^FAIL|Invalid|Race' "$log" | cut -c1-90)"
        fi
        if [ "$tool$op" = memcheckall ]; then
            if [ -s "$WORK/digest_1" ] && cmp -s "$WORK/digest_1" "$WORK/digest_memcheckall"; then
                row "test_gpu: two processes bitwise" "PASS" "" "" "" "$(wc -l <"$WORK/digest_1") results equal"
            else
                row "test_gpu: two processes bitwise" "FAIL" "" "" "" "first difference: $(diff "$WORK/digest_1" "$WORK/digest_memcheckall" 2>&1 | sed -n 2p | cut -c1-90)"
            fi
        fi
    done
}

# close_models A B TOL: two llm.c model files hold the same weights to TOL (norm of the difference
# relative to the norm of A); prints the ratio
close_models() {
    [ -s "$1" ] && [ -s "$2" ] || { echo "no final model ($1, $2)"; return 1; }
    cmp -s -n 1024 "$1" "$2" || { echo "model headers differ"; return 1; }
    paste <(od -An -v -f -w4 -j1024 "$1") <(od -An -v -f -w4 -j1024 "$2") | awk -v tol="$3" '
        { d = $1 - $2; sd += d * d; sa += $1 * $1; n++ }
        END { r = sa > 0 ? sqrt(sd / sa) : 1; printf "weights: %d values, norm ratio %.3g", n, r; exit !(n > 0 && r <= tol) }'
}

stage_parity() {
    build train_gpt dev/data/synth_shards
    tiny_model
    echo "== parity: GPU against CPU (the CPU backend runs fp32 only: bf16 on the GPU is compared with it)"
    local run prec tol res
    for run in cpu_fp32 cuda_fp32 cuda_bf16; do
        timeout "$(tlimit 420)" ./train_gpt "$L/c.json" device=${run%_*} precision=${run#*_} out_dir="$L/parity_$run" >"$L/parity_$run.txt" 2>&1 ||
            row "parity: $run run" "FAIL" "" "" "" "$(grep -m1 -i error "$L/parity_$run.txt" | cut -c1-90)"
    done
    for prec in fp32 bf16; do
        tol=1e-4; [ $prec = bf16 ] && tol=2e-2
        loss_tol_row "parity $prec: losses GPU vs CPU" "$L/parity_cpu_fp32/log.jsonl" "$L/parity_cuda_$prec/log.jsonl" $tol
    done
    if res=$(close_models "$L/parity_cpu_fp32/model_00000010.bin" "$L/parity_cuda_fp32/model_00000010.bin" 1e-4); then
        row "parity fp32: final weights GPU vs CPU" "PASS" "" "" "" "$res (limit 1e-4)"
    else
        row "parity fp32: final weights GPU vs CPU" "FAIL" "" "" "" "$res (limit 1e-4)"
    fi
    # optimizer offload (train.offload_optimizer): AdamW on the host (the CPU backend's kernel, m, v
    # and master in pinned memory) against AdamW on the GPU. Not bitwise: the two kernels round
    # differently (FMA contraction; the bias corrections' pow in fp32 on the host, fp64 on the GPU),
    # so the states differ by float rounding; bf16 parameters share the stochastic rounding's random
    # bits (llmc/precision/bf16.h), so they differ only where the masters straddle a rounding boundary. The
    # plan (--plan=json) must equal the offloaded run's allocation record, the host bytes included.
    for prec in fp32 bf16; do
        timeout "$(tlimit 420)" ./train_gpt "$L/c.json" device=cuda precision=$prec train.offload_optimizer=true \
            out_dir="$L/offload_$prec" >"$L/offload_$prec.txt" 2>&1 ||
            row "offload $prec run" "FAIL" "" "" "" "$(grep -m1 -i error "$L/offload_$prec.txt" | cut -c1-90)"
        tol=1e-5; [ $prec = bf16 ] && tol=1e-3
        loss_tol_row "offload $prec: losses vs the GPU optimizer" "$L/parity_cuda_$prec/log.jsonl" \
            "$L/offload_$prec/log.jsonl" $tol
        plan=$(./train_gpt "$L/c.json" device=cuda precision=$prec train.offload_optimizer=true --plan=json 2>/dev/null |
               memory_json)
        rec=$(head -n 1 "$L/offload_$prec/log.jsonl" 2>/dev/null | memory_json)
        if [ -n "$plan" ] && [ "$plan" = "$rec" ]; then
            row "offload $prec: plan = allocation" "PASS" "" "" "" "$rec"
        else
            row "offload $prec: plan = allocation" "FAIL" "" "" "" "plan ${plan:-none} vs record ${rec:-none}"
        fi
    done
    if res=$(close_models "$L/parity_cuda_fp32/model_00000010.bin" "$L/offload_fp32/model_00000010.bin" 1e-5); then
        row "offload fp32: final weights vs the GPU optimizer" "PASS" "" "" "" "$res (limit 1e-5)"
    else
        row "offload fp32: final weights vs the GPU optimizer" "FAIL" "" "" "" "$res (limit 1e-5)"
    fi
    # determinism: a second process gives bitwise the same run
    for prec in fp32 bf16; do
        timeout "$(tlimit 420)" ./train_gpt "$L/c.json" device=cuda precision=$prec out_dir="$L/again_$prec" >"$L/again_$prec.txt" 2>&1
        if [ -s "$L/again_$prec/model_00000010.bin" ] &&
           cmp -s "$L/parity_cuda_$prec/model_00000010.bin" "$L/again_$prec/model_00000010.bin" &&
           diff -q <(grep -o '"loss":[^,}]*' "$L/parity_cuda_$prec/log.jsonl") <(grep -o '"loss":[^,}]*' "$L/again_$prec/log.jsonl") >/dev/null; then
            row "two processes bitwise equal ($prec)" "PASS" "" "" "" "losses and final weights"
        else
            row "two processes bitwise equal ($prec)" "FAIL" "" "" "" "losses or final weights differ (or a run failed)"
        fi
    done
}

torch_peer() {  # name n_layer n_head d_model
    local name=$1 out="$WORK/torch_$1" v
    if [ ! -f dev/bench/torch_gpt2.py ]; then
        row "PyTorch peer $name" "FAIL" "" "" "" "dev/bench/torch_gpt2.py missing"; return
    fi
    if ! v=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null); then
        row "PyTorch peer $name" "SKIP" "" "" "" "torch not importable"; return
    fi
    local mbv="MB_${name}_bf16" tokv="TOK_${name}_bf16"
    local mb=${!mbv:-8}
    echo "== PyTorch peer $name (B=$mb)"
    if timeout "$(tlimit 900)" python3 dev/bench/torch_gpt2.py --n_layer "$2" --n_head "$3" --d_model "$4" --seq 1024 \
            --batch "$mb" --steps "$STEPS" --warmup 5 >"$out.log" 2>&1 && grep -q '^RESULT ' "$out.log"; then
        local res tok mfu peak b
        res=$(grep '^RESULT ' "$out.log" | tail -n1)
        tok=$(echo "$res" | sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p')
        mfu=$(echo "$res" | sed -n 's/.*mfu=\([^ ]*\).*/\1/p')
        peak=$(echo "$res" | sed -n 's/.*peak_mem_gib=\([^ ]*\).*/\1/p')
        b=$(echo "$res" | sed -n 's/.*batch=\([^ ]*\).*/\1/p')
        row "PyTorch peer $name bf16 (B=$b, T=1024)" "PASS" "$tok" "$(awk -v m="$mfu" 'BEGIN { printf "%.1f%%", 100 * m }')" \
            "${peak} GiB" "torch $v, $(echo "$res" | grep -q 'compiled=1' && echo compiled || echo eager); $STEPS steps after 5"
        if [ -n "${!tokv:-}" ]; then
            row "train_gpt / PyTorch tokens/s ($name bf16)" "INFO" "" "" "" \
                "$(awk -v a="${!tokv}" -v b="$tok" 'BEGIN { printf "%.3f", a / b }')$([ "$b" != "$mb" ] && echo " (PyTorch at B=$b, train_gpt at B=$mb)")"
        fi
    else
        row "PyTorch peer $name" "FAIL" "" "" "" "$(grep -m1 -iE 'error|Traceback' "$out.log" | cut -c1-90) (see $out.log)"
    fi
}

stage_bench() {
    build train_gpt dev/data/synth_shards
    bench gpt2_124m configs/bench_gpt2_124m.json "$MODEL_124M" "64 32 16 8 4 2 1"
    bench gpt2_1558m configs/bench_gpt2_1558m.json "$MODEL_1558M" "32 16 8 4 2 1"
    # optimizer offload: the 124M run with AdamW on the host; its tokens/s against the GPU optimizer's
    bench gpt2_124m_offload configs/bench_gpt2_124m.json "$MODEL_124M" "64 32 16 8 4 2 1" bf16 train.offload_optimizer=true
    if [ -n "${TOK_gpt2_124m_bf16:-}" ] && [ -n "${TOK_gpt2_124m_offload_bf16:-}" ]; then
        row "offload/GPU optimizer tokens/s (124M bf16)" "INFO" "" "" "" \
            "$(awk -v a="$TOK_gpt2_124m_offload_bf16" -v b="$TOK_gpt2_124m_bf16" 'BEGIN { printf "%.3f", a / b }')"
    fi
    # the PyTorch peer at the same shapes and micro-batch (dev/bench/torch_gpt2.py: bf16 autocast,
    # SDPA flash attention, fused AdamW, torch.compile), and train_gpt's tokens/s over its
    torch_peer gpt2_124m 12 12 768
    torch_peer gpt2_1558m 48 25 1600
    echo "== dev/cuda kernel experiments"
    if make -C dev/cuda -j"$JOBS" GPU_ARCH="$GPU_CC$([ "$GPU_CC" = 90 ] && echo a)" >"$WORK/dev_cuda_build.log" 2>&1; then
        for spec in "attention_forward 2" "attention_forward 3" "attention_backward 1" "attention_backward 2" \
                    "layernorm 2" "layernorm 3" "classifier 2" "classifier 3" "adamw 1" "adamw 2" "adamw 3"; do
            set -- $spec
            log="$WORK/dev_$1_$2.log"
            # smaller problems for the fp32 versions whose CPU references are slow
            args=""
            case "$spec" in
                "attention_forward 2") args="2 512 12 64" ;;
                "attention_backward 1"|"attention_backward 2") args="1 512 12 64" ;;
                "adamw 1"|"adamw 2"|"adamw 3") args="20000000" ;;
            esac
            if timeout "$(tlimit 600)" "dev/cuda/$1" "$2" $args >"$log" 2>&1; then
                row "dev/cuda $1 v$2" "PASS" "" "" "" "$(grep -m1 '^time' "$log" | cut -c1-60)"
            else
                row "dev/cuda $1 v$2" "FAIL" "" "" "" "$(grep -m1 -E 'FAIL|error' "$log" | cut -c1-90)"
            fi
        done
    else
        row "dev/cuda build" "FAIL" "" "" "" "see dev_cuda_build.log"
    fi
}

stage_layouts() {
    build train_gpt dev/data/synth_shards
    tiny_model
    echo "== layouts on one GPU (mpirun, MPI communicator)"
    if command -v mpirun >/dev/null 2>&1 && [ -x dev/data/synth_shards ] && [ -x ./train_gpt ]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        ./train_gpt "$L/c.json" out_dir="$L/base" >"$L/base.txt" 2>&1
        # ZeRO-3 (parameters sharded too, gathered unit by unit) also on 4 ranks: the same global
        # batch as the one process (grad_accum 4 / dp); optimizer offload with ZeRO-1 and ZeRO-3
        # (each rank's shard updated on the host)
        for spec in "2 dp2 parallel.dp=2 train.grad_accum=2" "2 tp2 parallel.tp=2" "2 pp2 parallel.pp=2" \
                    "2 dp2_zero2 parallel.dp=2 parallel.zero=2 train.grad_accum=2" \
                    "2 tp2_sp parallel.tp=2 parallel.sequence_parallel=true" \
                    "2 dp2_zero3 parallel.dp=2 parallel.zero=3 train.grad_accum=2" \
                    "2 cp2 parallel.cp=2" "2 pp2_interleaved parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2" \
                    "4 dp4_zero3 parallel.dp=4 parallel.zero=3 train.grad_accum=1" \
                    "2 dp2_zero1_offload parallel.dp=2 parallel.zero=1 train.grad_accum=2 train.offload_optimizer=true" \
                    "2 dp2_zero3_offload parallel.dp=2 parallel.zero=3 train.grad_accum=2 train.offload_optimizer=true"; do
            read -r -a args <<<"$spec"
            np=${args[0]}; name=${args[1]}
            if timeout "$(tlimit 300)" mpirun --oversubscribe -np "$np" ./train_gpt "$L/c.json" "${args[@]:2}" out_dir="$L/$name" \
                    >"$L/$name.txt" 2>&1; then
                loss_row "1 GPU, $np ranks: $name" "$L/base/log.jsonl" "$L/$name/log.jsonl"
            else
                row "1 GPU, $np ranks: $name" "FAIL" "" "" "" "$(grep -m1 -i error "$L/$name.txt" | cut -c1-90)"
            fi
        done
        # expert parallelism: an MoE variant of the tiny model (capacity drops included), dp2 x ep2
        # (rows staged through the host for the all-to-all) against one process
        moe=(model.moe.num_experts=4 model.moe.top_k=2 model.moe.capacity_factor=1.0)
        ./train_gpt "$L/c.json" "${moe[@]}" out_dir="$L/moe_base" >"$L/moe_base.txt" 2>&1
        if timeout "$(tlimit 300)" mpirun --oversubscribe -np 2 ./train_gpt "$L/c.json" "${moe[@]}" parallel.dp=2 parallel.ep=2 \
                train.grad_accum=2 out_dir="$L/moe_dp2_ep2" >"$L/moe_dp2_ep2.txt" 2>&1; then
            loss_row "1 GPU, 2 ranks: moe dp2_ep2" "$L/moe_base/log.jsonl" "$L/moe_dp2_ep2/log.jsonl"
        else
            row "1 GPU, 2 ranks: moe dp2_ep2" "FAIL" "" "" "" "$(grep -m1 -i error "$L/moe_dp2_ep2.txt" | cut -c1-90)"
        fi
    else
        row "layouts on one GPU" "FAIL" "" "" "" "mpirun, synth_shards or train_gpt missing"
    fi

    echo "== parallel.comm=nccl on one process"
    if [ -x dev/data/synth_shards ] && [ -x ./train_gpt ]; then
        N="$WORK/nccl1"  # the tiny model and data
        mkdir -p "$N"
        for prec in fp32 bf16; do
            failed=""
            for comm in mpi nccl; do
                if ! timeout "$(tlimit 300)" ./train_gpt "$L/c.json" precision="$prec" parallel.comm="$comm" out_dir="$N/${prec}_$comm" \
                        >"$N/${prec}_$comm.txt" 2>&1; then
                    failed="the parallel.comm=$comm run failed: $(grep -m1 -i error "$N/${prec}_$comm.txt" | cut -c1-90)"
                    break
                fi
            done
            # the data-parallel group's communicator as the start-up line names it ("nccl": a group of one over NCCL)
            used=$(sed -n 's/^parallel: .*; comm \([^;]*\);.*/\1/p' "$N/${prec}_nccl.txt" 2>/dev/null | head -n1)
            if [ -n "$failed" ]; then
                row "1 process, parallel.comm=nccl ($prec)" "FAIL" "" "" "" "$failed"
            else
                loss_row "1 process, parallel.comm=nccl ($prec)" "$N/${prec}_mpi/log.jsonl" "$N/${prec}_nccl/log.jsonl" \
                    "dp group comm: ${used:-?}"
            fi
        done
    else
        row "1 process, parallel.comm=nccl" "FAIL" "" "" "" "synth_shards or train_gpt missing"
    fi

    # issue 17's table on the GPU: dp=2 ZeRO-1 on the one GPU over MPI with and without overlap at
    # injected delays (the bench appends its own table to dev/bench/RESULTS.md)
    echo "== communication overlap on one GPU (dev/bench/overlap_bench.sh)"
    if command -v mpirun >/dev/null 2>&1 && DEVICE=cuda timeout "$(tlimit 300)" dev/bench/overlap_bench.sh 1 0 20 >"$L/overlap.txt" 2>&1; then
        row "overlap dp2 ZeRO-1, delays 0 and 20 ms" "PASS" "" "" "" "$(tail -n 1 dev/bench/RESULTS.md | cut -c1-90)"
    else
        row "overlap dp2 ZeRO-1, delays 0 and 20 ms" "FAIL" "" "" "" "$(tail -n 3 "$L/overlap.txt" | tr '\n' ' ' | cut -c1-90)"
    fi
}

stage_fp8() {
    build train_gpt dev/data/synth_shards
    echo "== fp8 vs bf16 loss (124M shape, 300 steps)"
    if [ -x ./train_gpt ]; then
        F="$WORK/fp8_loss"
        mkdir -p "$F"
        data="$WORK/synth/train"  # the benchmark's shards; made here as bench() makes them under --no-bench
        if ! ls "$data"_*.bin >/dev/null 2>&1 && [ -x dev/data/synth_shards ]; then
            mkdir -p "$WORK/synth"
            dev/data/synth_shards --out "$data" --shards 2 --tokens 20000000 --vocab 50257 >"$WORK/synth.log" 2>&1
        fi
        cat >"$F/c.json" <<JSON
{ "device": "cuda", "precision": "bf16",
  "model": { "arch": "gpt2", "n_layer": 12, "n_head": 12, "d_model": 768, "vocab_size": 50257, "max_seq_len": 1024,
             "init": "random", "init_seed": 0 },
  "data": { "train": "$data*.bin", "val": "", "shuffle": false },
  "train": { "micro_batch": 8, "seq_len": 512, "grad_accum": 1, "steps": 300, "lr": 3e-4, "lr_schedule": "cosine",
             "warmup_steps": 30, "final_lr_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1337 },
  "eval": { "every": 0, "sample_every": 0 },
  "checkpoint": { "every": 0, "resume": "never" } }
JSON
        if ! ls "$data"_*.bin >/dev/null 2>&1; then
            row "fp8 vs bf16 loss (124M, 300 steps)" "FAIL" "" "" "" "no synthetic shards"
        else
            runs_failed=""
            for prec in bf16 fp8; do
                out="$F/$prec"
                timeout "$(tlimit 420)" ./train_gpt "$F/c.json" precision="$prec" out_dir="$out" >"$F/$prec.txt" 2>&1
                rc=$?
                if [ $rc -eq 0 ] && [ -s "$out/log.jsonl" ]; then
                    parsed=$(parse_log "$out/log.jsonl")
                    row "fp8 loss run: $prec (124M, B=8, T=512)" "PASS" "$(printf '%s' "$parsed" | cut -f1)" \
                        "$(printf '%s' "$parsed" | cut -f2)" "$(grep -i 'peak' "$F/$prec.txt" | tail -n1 | sed 's/^[[:space:]]*//' | cut -c1-60)" \
                        "300 steps$([ "$prec" = fp8 ] && grep -o '"fp8_overflows":[0-9]*' "$out/log.jsonl" |
                            awk -F: '{ s += $2 } END { printf "; %d fp8 overflow events", s }')"
                else
                    runs_failed="$runs_failed $prec"
                    row "fp8 loss run: $prec (124M, B=8, T=512)" "FAIL" "" "" "" \
                        "exit $rc: $(grep -iE 'error' "$F/$prec.txt" | tail -n1 | cut -c1-90)"
                fi
            done
            # mean of the last 10 losses and the step-300 loss of each log (needs all 300 records)
            if [ ! -s "$F/bf16/log.jsonl" ] || [ ! -s "$F/fp8/log.jsonl" ]; then
                row "fp8 vs bf16 loss (124M, 300 steps)" "FAIL" "" "" "" "no log.jsonl from the$runs_failed run"
            elif ! res=$(awk 'FNR == 1 { f++ }
                       match($0, /"loss":[^,}]*/) { n[f]++; x[f, n[f]] = substr($0, RSTART + 7, RLENGTH - 7) + 0 }
                       END {
                           if (f != 2 || n[1] != 300 || n[2] != 300) { printf "loss records: bf16 %d, fp8 %d (want 300 each)", n[1], n[2]; exit 1 }
                           for (k = 1; k <= 2; k++) for (i = 291; i <= 300; i++) s[k] += x[k, i] / 10
                           r = (s[2] - s[1]) / s[1]; a = r < 0 ? -r : r
                           printf "%s\tbf16 %.4f, fp8 %.4f (mean of steps 291-300; step 300: %.4f, %.4f): relative difference %+.2f%%", \
                               (a <= 0.01 ? "PASS" : "FAIL"), s[1], s[2], x[1, 300], x[2, 300], 100 * r
                       }' "$F/bf16/log.jsonl" "$F/fp8/log.jsonl" 2>/dev/null) || [ -z "$res" ]; then
                row "fp8 vs bf16 loss (124M, 300 steps)" "FAIL" "" "" "" "${res:-no log.jsonl}"
            elif [ -n "$runs_failed" ]; then
                row "fp8 vs bf16 loss (124M, 300 steps)" "FAIL" "" "" "" "run failed:$runs_failed; ${res#*$'\t'}"
            else
                row "fp8 vs bf16 loss (124M, 300 steps)" "${res%%$'\t'*}" "" "" "" "${res#*$'\t'} (limit 1%)"
            fi
        fi
    else
        row "fp8 vs bf16 loss (124M, 300 steps)" "FAIL" "" "" "" "train_gpt not built"
    fi
    # FP8 linears against bf16 on the 1.5B shape (issue 7: target 1.3x or more)
    bench gpt2_1558m configs/bench_gpt2_1558m.json "$MODEL_1558M" "32 16 8 4 2 1" bf16
    bench gpt2_1558m configs/bench_gpt2_1558m.json "$MODEL_1558M" "32 16 8 4 2 1" fp8
    if [ -n "${TOK_gpt2_1558m_bf16:-}" ] && [ -n "${TOK_gpt2_1558m_fp8:-}" ]; then
        row "fp8 / bf16 tokens/s (1.5B shape)" "PASS" "" "" "" \
            "$(awk -v a="$TOK_gpt2_1558m_fp8" -v b="$TOK_gpt2_1558m_bf16" 'BEGIN { printf "%.2fx (target >= 1.3x)", a / b }')"
    fi
}

# finish STAGE: its table to the terminal and dev/bench/RESULTS.md, and with --out to DIR/STAGE/
finish() {
    local table
    table=$(
        echo "### $(date -u '+%Y-%m-%d %H:%M UTC') · stage \`$1\` · commit \`$COMMIT\`$DIRTY · $GPU_NAME ($GPU_MEM, sm_$GPU_CC)"
        echo
        echo "| check | result | tokens/s | MFU | peak memory | notes |"
        echo "|---|---|---|---|---|---|"
        for r in "${ROWS[@]}"; do echo "$r"; done
        echo
    )
    echo
    echo "$table"
    if [ "$DRY_RUN" = 1 ]; then
        echo "gpu_check: dry run: nothing written"
    elif [ -d dev/bench ] || [ -f Makefile ]; then
        mkdir -p dev/bench
        [ -f dev/bench/RESULTS.md ] || printf '# GPU results\n\nAppended by scripts/gpu_check.sh, newest last.\n\n' >dev/bench/RESULTS.md
        echo "$table" >>dev/bench/RESULTS.md
        echo "gpu_check: stage $1 appended to dev/bench/RESULTS.md"
    else
        echo "gpu_check: no dev/bench/RESULTS.md here (the bundle): use --out DIR and add DIR/$1/table.md to it"
    fi
    if [ -n "$OUT" ] && [ "$DRY_RUN" = 0 ]; then
        mkdir -p "$OUT/$1"
        echo "$table" >"$OUT/$1/table.md"
        cp -r "$WORK"/. "$OUT/$1/" 2>/dev/null
        echo "gpu_check: stage $1 table and logs in $OUT/$1"
    fi
    ROWS=()
}

for st in "${WANT[@]}"; do
    CUR_STAGE=$st
    "stage_$st"
    finish "$st"
done
if [ "$DRY_RUN" = 1 ] || [ -n "$OUT" ]; then
    rm -rf "$WORK"  # a dry run ran nothing; with --out each stage copied its logs there
else
    echo "gpu_check: logs in $WORK"
fi
exit $ANY_FAIL
