# Tensor, sequence and pipeline parallelism prove themselves against one process: each layout
# below trains 10 steps with the losses, validation losses and final weights of one process with
# the same global batch (8 micro-batches of 2 x 16 tokens per step), to 1e-5 relative: losses
# element-wise; the first step's summed gradient (LLMC_DUMP_GRADS) of the whole model in norm and
# in its largest element difference; the final weights in norm (||a - b|| <= 1e-5 ||a||). The
# largest single final-weight difference is allowed 3e-5 of the largest weight: a split matmul
# rounds its sum differently (~1e-7), and AdamW divides by sqrt(v), turning that into ~lr-sized
# relative changes on weights whose gradients nearly cancel (seen: one fc weight whose step-1
# gradient is 1.1e-8 ended 1.2e-5 apart at tp=2, while the gradients agreed to 5e-7 of the largest).
# The model has 4 layers and 4 heads so that tp=4 splits heads and pp=4 / 2 stages x 2 chunks
# split layers. Checkpoints stay layout-independent: one saved at tp=2 x pp=2 resumes at dp=4
# and at tp=4 with the uninterrupted run's losses.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
cat > "$W/c.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 8, "steps": 10, "lr": 3e-3, "warmup_steps": 2,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 5, "batches": 2 },
  "out_dir": "$W/out" }
JSON
LLMC_DUMP_GRADS="$W/base_grads.bin" "$BIN" "$W/c.json" "out_dir=$W/base" > "$W/base.txt" ||
    die "one-process baseline failed"

check() {  # check NAME NPROC ARGS...: the layout's run matches the baseline
    local name=$1 n=$2; shift 2
    local out="$W/$name"
    LLMC_DUMP_GRADS="$out.grads.bin" dp_run "$n" "$W/c.json" "$@" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "$name failed: $(tail -n 20 "$out.txt")"
    echo "$name ($*)"
    close_weights "$W/base_grads.bin" "$out.grads.bin"  # step-1 gradients
    close_losses "$W/base/log.jsonl" "$out/log.jsonl"
    close_val "$W/base/log.jsonl" "$out/log.jsonl"
    close_weights "$W/base/model_00000010.bin" "$out/model_00000010.bin" 1e-5 3e-5
}
check tp2 2 parallel.tp=2
check tp4 4 parallel.tp=4
check tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
grep -q 'activations .*(sequence parallel; .* without it)' "$W/tp2_sp.txt" || die "no SP activation saving in the memory table"
check pp2_gpipe 2 parallel.pp=2 parallel.pp_schedule=gpipe
check pp2_1f1b 2 parallel.pp=2 parallel.pp_schedule=1f1b
check pp2_interleaved 2 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
check pp4_1f1b 4 parallel.pp=4 parallel.pp_schedule=1f1b
grep -q 'idle fraction 0.273' "$W/pp4_1f1b.txt" || die "pp=4 x 8 micro-batches: expected the 1F1B idle fraction 3/11"
# parallel.pp_layers "auto": the step-time model gives the last stage, which also holds the head, fewer layers
"$BIN" "$W/c.json" parallel.dp=1 parallel.pp=2 parallel.pp_layers=auto --plan |
    grep -q 'layers per pipeline stage: \[3, 1\] (auto' || die "pp_layers auto: the plan does not report the split [3, 1]"
check pp2_auto 2 parallel.pp=2 parallel.pp_layers=auto
# dp=2: each DP rank evaluates 1 batch of its own (windows 0 and 1 = the baseline's 2 batches)
dp2=(parallel.dp=2 parallel.tp=2 parallel.pp=2 train.grad_accum=4 eval.batches=1)
check dp2_tp2_pp2_1f1b 8 "${dp2[@]}" parallel.zero=1
check dp2_tp2_pp2_interleaved 8 "${dp2[@]}" parallel.zero=1 parallel.pp_schedule=interleaved parallel.pp_virtual=2
check dp2_tp2_pp2_sp_zero2 8 "${dp2[@]}" parallel.zero=2 parallel.sequence_parallel=true parallel.pp_layers=[1,3]
check dp2_tp2_pp2_zero3 8 "${dp2[@]}" parallel.zero=3 parallel.pp_schedule=interleaved parallel.pp_virtual=2
# a layout is deterministic: the same run twice is bitwise the same
dp_run 4 "$W/c.json" parallel.tp=2 parallel.pp=2 "out_dir=$W/again1" > /dev/null
dp_run 4 "$W/c.json" parallel.tp=2 parallel.pp=2 "out_dir=$W/again2" > /dev/null
cmp "$W/again1/model_00000010.bin" "$W/again2/model_00000010.bin" || die "two tp=2 x pp=2 runs differ"

# layout-independent checkpoints: saved at tp=2 x pp=2, resumed at dp=4 and at tp=4
dp_run 4 "$W/c.json" parallel.tp=2 parallel.pp=2 checkpoint.every=5 "out_dir=$W/ck" > "$W/ck.txt" ||
    die "tp=2 x pp=2 run with checkpoints failed"
ck="$W/ck/checkpoints/step_00000005"
[ -f "$ck/DONE" ] || die "no step-5 checkpoint"
grep '"loss"' "$W/base/log.jsonl" | tail -n 5 > "$W/base_tail.jsonl"
for layout in "dp4 4 parallel.dp=4 train.grad_accum=2" "tp4 4 parallel.tp=4"; do
    read -r name n args <<< "$layout"
    out="$W/resume_$name"
    # shellcheck disable=SC2086
    dp_run "$n" "$W/c.json" $args checkpoint.every=5 "checkpoint.resume=$ck" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "resume at $name failed: $(tail -n 20 "$out.txt")"
    grep -q 'resumed from .*step_00000005 at step 5' "$out.txt" || die "$name did not resume"
    echo "resumed at $name"
    close_losses "$W/base_tail.jsonl" "$out/log.jsonl"
    close_weights "$W/base/model_00000010.bin" "$out/model_00000010.bin" 1e-5 3e-5
done

# layouts the model cannot take are refused before any work, naming the key
bad() {  # bad N PATTERN ARGS...
    local n=$1 pat=$2; shift 2
    local rc=0
    dp_run "$n" "$W/c.json" "out_dir=$W/bad" "$@" > /dev/null 2> "$W/err.txt" || rc=$?
    [ $rc -eq 2 ] && grep -qE -- "$pat" "$W/err.txt" || die "expected exit 2 and /$pat/ for $*: rc=$rc $(cat "$W/err.txt")"
    [ ! -e "$W/bad" ] || die "out_dir created on a layout error ($*)"
}
bad 3 'parallel.tp: 3 does not divide model.n_head = 4' parallel.tp=3
bad 2 'parallel.pp_layers' parallel.pp=2 parallel.pp_layers=[1,2]
bad 2 'train.grad_accum' parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2 train.grad_accum=3
bad 2 'parallel.pp_virtual' parallel.pp=2 parallel.pp_virtual=2

# tp=3 with a 1003-token vocabulary: llm.c's file padding (1024) does not split in 3, the memory
# padding (1152 = 3 x 384) does; files keep 1024 rows (the same header as one process)
tp3=(model.n_head=6 model.d_model=48 model.vocab_size=1003 train.steps=4 eval.every=2)
"$BIN" "$W/c.json" "${tp3[@]}" "out_dir=$W/base3" > "$W/base3.txt" 2>&1 || die "tp3 baseline failed: $(tail "$W/base3.txt")"
dp_run 3 "$W/c.json" "${tp3[@]}" parallel.tp=3 "out_dir=$W/tp3" > "$W/tp3.txt" 2>&1 || die "tp=3 failed: $(tail "$W/tp3.txt")"
echo "tp3 (parallel.tp=3, vocabulary 1003)"
close_losses "$W/base3/log.jsonl" "$W/tp3/log.jsonl"
close_val "$W/base3/log.jsonl" "$W/tp3/log.jsonl"
close_weights "$W/base3/model_00000004.bin" "$W/tp3/model_00000004.bin" 1e-5 3e-5
echo "all layouts match one process"
