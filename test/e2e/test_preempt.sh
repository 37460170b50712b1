# Preemption (llmc/run/preempt.h): a stop signal on any rank stops every rank at the next step
# boundary; world rank 0 saves a checkpoint; every rank exits with code 3 ("saved, resume me");
# `checkpoint.resume: auto` then ends with the losses and final weights of an uninterrupted run,
# bit for bit. Cases:
#  - dp=2 under mpirun, SIGUSR1 raised on rank 1 only during step 4;
#  - one process, SIGINT during step 6;
#  - one process, a real SIGINT from outside (kill) at whatever step it lands;
#  - dp=2, SIGTERM on rank 0 in the middle of writing the step-3 checkpoint: that save completes;
#  - one process, a real SIGTERM during a long evaluation (issue 34): it stops within a batch,
#    saves the checkpoint of the step it evaluated and exits 3 within 5 s; the resumed run ends
#    bit-identical;
#  - dp=2, SIGTERM on rank 1 as a long sample begins (rank 1 does not sample; rank 0 does): both
#    stop at the next token, saved, exit 3.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
common=(train.steps=10)

# expect_preempted DIR STEP RC OUT: the run exited 3, saying so, with a complete checkpoint of STEP
expect_preempted() {
    local dir=$1 step=$2 rc=$3 out=$4
    [ "$rc" -eq 3 ] || die "$dir: expected exit code 3 (preempted), got $rc: $(tail -n 5 "$out")"
    grep -q "stopped after step $step, checkpoint saved; exit code 3" "$out" || die "$dir: no stop message: $(cat "$out")"
    [ -f "$dir/checkpoints/$(printf 'step_%08d' "$step")/DONE" ] || die "$dir: no complete step-$step checkpoint"
    [ "$(losses "$dir/log.jsonl" | wc -l)" -eq "$step" ] || die "$dir: expected $step loss records"
    [ ! -e "$dir/model_00000010.bin" ] || die "$dir: a preempted run wrote the final model"
}
# expect_resumed DIR STEP FULL ARGS...: resume=auto from STEP ends bit-identical to the run in FULL
expect_resumed() {
    local dir=$1 step=$2 full=$3; shift 3
    "$@" "out_dir=$dir" > "$dir.resume.txt" || die "$dir: resumed run failed: $(tail -n 5 "$dir.resume.txt")"
    grep -q "resumed from .*$(printf 'step_%08d' "$step") at step $step" "$dir.resume.txt" ||
        die "$dir: did not resume from step $step: $(head "$dir.resume.txt")"
    diff <(losses "$full/log.jsonl") <(losses "$dir/log.jsonl") || die "$dir: losses differ from $full"
    cmp "$full/model_00000010.bin" "$dir/model_00000010.bin" || die "$dir: final weights differ from $full"
    echo "  $dir: resumed from step $step, losses and final weights bit-identical"
}

"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/full1" > /dev/null || die "one-process baseline failed"
dp_run 2 "$W/c.json" "${common[@]}" "out_dir=$W/full2" > /dev/null || die "dp=2 baseline failed"

echo "dp=2, SIGUSR1 on rank 1 during step 4"
rc=0
LLMC_FAULT=usr1:train_step_4 LLMC_FAULT_RANK=1 dp_run 2 "$W/c.json" "${common[@]}" "out_dir=$W/usr1" \
    > "$W/usr1.txt" 2>&1 || rc=$?
expect_preempted "$W/usr1" 4 $rc "$W/usr1.txt"
grep -q 'SIGUSR1: stopped after step 4' "$W/usr1.txt" || die "rank 0 does not name SIGUSR1"
expect_resumed "$W/usr1" 4 "$W/full2" dp_run 2 "$W/c.json" "${common[@]}"

echo "one process, SIGINT during step 6"
rc=0
LLMC_FAULT=int:train_step_6 "$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/int" > "$W/int.txt" 2>&1 || rc=$?
expect_preempted "$W/int" 6 $rc "$W/int.txt"
expect_resumed "$W/int" 6 "$W/full1" "$BIN" "$W/c.json" "${common[@]}"

echo "one process, SIGINT sent from outside"
# a slower run (more steps): the signal lands somewhere in steps 2..199
long=(train.steps=200 train.warmup_steps=2)
"$BIN" "$W/c.json" "${long[@]}" "out_dir=$W/long_full" > /dev/null || die "200-step baseline failed"
"$BIN" "$W/c.json" "${long[@]}" "out_dir=$W/kill" > "$W/kill.txt" 2>&1 &
pid=$!
for _ in $(seq 200); do [ "$(losses "$W/kill/log.jsonl" 2>/dev/null | wc -l)" -ge 1 ] && break; sleep 0.05; done
kill -INT $pid
rc=0
wait $pid || rc=$?
step=$(losses "$W/kill/log.jsonl" | wc -l)
[ "$step" -lt 200 ] || die "the 200-step run finished before the signal: make it longer"
[ $rc -eq 3 ] || die "external SIGINT: expected exit 3, got $rc: $(tail -n 3 "$W/kill.txt")"
grep -q "SIGINT: stopped after step $step, checkpoint saved" "$W/kill.txt" || die "external SIGINT: $(tail -n 3 "$W/kill.txt")"
"$BIN" "$W/c.json" "${long[@]}" "out_dir=$W/kill" > "$W/kill.resume.txt" || die "resume after external SIGINT failed"
grep -q "resumed from .* at step $step" "$W/kill.resume.txt" || die "did not resume at step $step"
diff <(losses "$W/long_full/log.jsonl") <(losses "$W/kill/log.jsonl") || die "external SIGINT: losses differ"
cmp "$W/long_full/model_00000200.bin" "$W/kill/model_00000200.bin" || die "external SIGINT: final weights differ"
echo "  stopped after step $step by kill -INT; resumed, bit-identical at step 200"

echo "dp=2, SIGTERM on rank 0 while it writes the step-3 checkpoint"
rc=0
LLMC_FAULT=term:checkpoint_after_model_3 dp_run 2 "$W/c.json" "${common[@]}" checkpoint.every=3 \
    "out_dir=$W/term" > "$W/term.txt" 2>&1 || rc=$?
expect_preempted "$W/term" 3 $rc "$W/term.txt"
[ "$(grep -c 'checkpoint: ' "$W/term.txt")" -eq 1 ] || die "expected one checkpoint save: $(cat "$W/term.txt")"
expect_resumed "$W/term" 3 "$W/full2" dp_run 2 "$W/c.json" "${common[@]}" checkpoint.every=3

echo "one process, SIGTERM from outside during a long evaluation"
# a million validation batches per evaluation: it would take hours; the signal lands in step 0's
# (the full run evaluates 2 batches: the resumed run must end as it does)
"$BIN" "$W/c.json" "${common[@]}" eval.every=1 eval.batches=2 "out_dir=$W/eval_full" > /dev/null || die "eval baseline failed"
"$BIN" "$W/c.json" "${common[@]}" eval.every=1 eval.batches=1000000 "out_dir=$W/eval" > "$W/eval.txt" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -qE '^ +total ' "$W/eval.txt" 2>/dev/null && break; sleep 0.05; done
sleep 0.5  # into the evaluation
t0=$(date +%s)
kill -TERM $pid
for _ in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then kill -9 $pid; die "SIGTERM during the evaluation: still running after 5 s"; fi
rc=0
wait $pid || rc=$?
[ $rc -eq 3 ] || die "SIGTERM during the evaluation: expected exit 3, got $rc: $(tail -n 3 "$W/eval.txt")"
grep -q 'SIGTERM: stopped in the evaluation at step 0, checkpoint saved; exit code 3' "$W/eval.txt" ||
    die "no stop message: $(tail -n 3 "$W/eval.txt")"
[ -f "$W/eval/checkpoints/step_00000000/DONE" ] || die "no complete step-0 checkpoint"
! grep -q 'val loss' "$W/eval.txt" || die "a cut evaluation logged a validation loss"
"$BIN" "$W/c.json" "${common[@]}" eval.every=1 eval.batches=2 "out_dir=$W/eval" > "$W/eval.resume.txt" ||
    die "resume after the evaluation's stop failed: $(tail -n 3 "$W/eval.resume.txt")"
grep -q "resumed from .*step_00000000 at step 0" "$W/eval.resume.txt" || die "did not resume at step 0"
diff <(losses "$W/eval_full/log.jsonl") <(losses "$W/eval/log.jsonl") || die "losses differ after the evaluation's stop"
diff <(grep -o '"val_loss":[^,}]*' "$W/eval_full/log.jsonl") <(grep -o '"val_loss":[^,}]*' "$W/eval/log.jsonl") ||
    die "validation losses differ after the evaluation's stop"
cmp "$W/eval_full/model_00000010.bin" "$W/eval/model_00000010.bin" || die "final weights differ after the evaluation's stop"
echo "  stopped within $(( $(date +%s) - t0 )) s of the signal, exit 3; resumed, bit-identical"

echo "dp=2, SIGTERM on rank 1 (which does not sample) as rank 0's 65536-token sample begins"
rc=0
t0=$(date +%s)
LLMC_FAULT=term:sample_2 LLMC_FAULT_RANK=1 dp_run 2 "$W/c.json" "${common[@]}" eval.every=0 eval.sample_every=2 \
    eval.sample_tokens=65536 "out_dir=$W/sample" > "$W/sample.txt" 2>&1 || rc=$?
t=$(( $(date +%s) - t0 ))
[ $rc -eq 3 ] || die "SIGTERM during the sample: expected exit 3, got $rc: $(tail -n 5 "$W/sample.txt")"
grep -q 'SIGTERM: stopped in the evaluation at step 2, checkpoint saved' "$W/sample.txt" ||
    die "no stop message: $(tail -n 5 "$W/sample.txt")"
[ -f "$W/sample/checkpoints/step_00000002/DONE" ] || die "no complete step-2 checkpoint"
! grep -q '| sample' "$W/sample.txt" || die "a cut sample was printed"
[ $t -lt 20 ] || die "the sampling stop took $t s (a whole sample takes minutes)"
echo "  both ranks stopped, exit 3, checkpoint of step 2, in $t s"
