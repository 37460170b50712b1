# Helpers for the end-to-end tests. Each test sources this, works in its own temp folder
# ($W), and fails (non-zero exit) on the first broken expectation.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# LLMC_BIN (set by `make test`): where the binaries are, relative to the root ("build-asan/" under SANITIZE=1)
BIN="$ROOT/${LLMC_BIN:-}train_gpt"
SYNTH="$ROOT/${LLMC_BIN:-}dev/data/synth_shards"
W=$(mktemp -d "${TMPDIR:-/tmp}/train_gpt_e2e.XXXXXX")
trap '[ -n "${KEEP_E2E:-}" ] || rm -rf "$W"' EXIT  # KEEP_E2E=1 keeps the work folder
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

die() { echo "FAILED: $*" >&2; exit 1; }

# make_data: train and val shards for a 512-token vocabulary under $W/data
make_data() {
    mkdir -p "$W/data"
    "$SYNTH" --out "$W/data/train" --shards 2 --tokens ${1:-20000} --vocab 512 --seed 1 >/dev/null
    "$SYNTH" --out "$W/data/val" --shards 1 --tokens 5000 --vocab 512 --seed 2 >/dev/null
}

# tiny_config FILE: a small CPU model on the data of make_data
tiny_config() {
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": 2, "n_head": 2, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 2, "steps": 10, "lr": 3e-3, "warmup_steps": 2,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "out_dir": "$W/out" }
JSON
}

# emu_tiny_config FILE PRECISION: tiny_config on make_data's shards for build/train_gpt_emu (the
# trainer over CudaOps on the CUDA emulator; $EMU), in PRECISION, d_model 64 over 2 heads (head
# size 32, which the flash kernels take); a SANITIZE=1 build has no emulator binaries: SKIP
emu_tiny_config() {
    EMU="$ROOT/${LLMC_BUILD:-build}/train_gpt_emu"
    if [ "${LLMC_SANITIZE:-0}" = 1 ]; then echo "SKIP (SANITIZE=1 builds no emulator binaries)"; exit 0; fi
    [ -x "$EMU" ] || die "no $EMU (make ${LLMC_BUILD:-build}/train_gpt_emu)"
    make_data
    tiny_config "$1"
    sed -i "s/\"precision\": \"fp32\"/\"precision\": \"$2\"/; s/\"d_model\": 32/\"d_model\": 64/" "$1"
}

# losses FILE: the "loss" values of a log.jsonl, one per line, exactly as written
losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2; }
# val_last FILE: the last "val_loss" of a log.jsonl
val_last() { grep -o '"val_loss":[^,}]*' "$1" | tail -n 1 | cut -d: -f2; }
# tensors STATE: a checkpoint's state.bin past its 32-byte header and its metadata (header int32 #2)
tensors() {
    local meta
    meta=$(od -An -t d4 -j 8 -N 4 "$1" | tr -d ' ')
    tail -c +$((32 + meta + 1)) "$1"
}
# scales FILE: the "loss_scale" records of a log.jsonl (precision fp16), on one line
scales() { grep -o '"loss_scale":[^,}]*' "$1" | cut -d: -f2 | tr '\n' ' '; }
# psi FILE: the padded parameter count a run's memory table names (its start-up output)
psi() { sed -n 's/^memory per rank .*parameters padded to \([0-9]*\)).*/\1/p' "$1"; }

# resume_flipped KEY CONFIG DIR FIRST: a run of CONFIG with boolean KEY=FIRST, killed right after
# its step-2 checkpoint, resumed in DIR with KEY the other way (its output in DIR.txt); dies unless
# the resume ran from that checkpoint. The caller compares DIR with a straight run.
resume_flipped() {
    local key=$1 cfg=$2 dir=$3 first=$4 second
    second=$([ "$first" = true ] && echo false || echo true)
    (LLMC_FAULT=checkpoint_after_done_2 "$BIN" "$cfg" checkpoint.every=2 "$key=$first" "out_dir=$dir" || true) \
        > /dev/null 2>&1
    [ -f "$dir/checkpoints/step_00000002/DONE" ] || die "$key=$first: no step-2 checkpoint"
    "$BIN" "$cfg" checkpoint.every=2 "$key=$second" "out_dir=$dir" > "$dir.txt" 2>&1 ||
        die "resume with $key=$second failed: $(tail "$dir.txt")"
    grep -q 'resumed from .*step_00000002' "$dir.txt" || die "did not resume from step 2: $(cat "$dir.txt")"
}

# expect_fail CODE PATTERN CMD...: the command exits with CODE and stderr matches PATTERN
expect_fail() {
    local code=$1 pat=$2; shift 2
    local err rc=0
    err=$("$@" 2>&1 >/dev/null) || rc=$?
    [ "$rc" -eq "$code" ] || die "expected exit $code, got $rc from: $* ; stderr: $err"
    echo "$err" | grep -qE -- "$pat" || die "stderr of '$*' does not match /$pat/: $err"
}
