# checkpoint.async: checkpoints written on a thread of their own while training goes on
# (llmc/io/async_save.h). Cases:
#  - one process, the step-3 write slowed by 5 s (LLMC_FAULT=slow:): steps 4.. are trained (and
#    logged) before that checkpoint's line, which gives its time in the background; every
#    checkpoint, the losses and the final weights are those of a synchronous run, bit for bit;
#  - dp=2 under mpirun: the same checkpoints as the synchronous dp=2 run;
#  - kill -9 in the middle of a background write: the previous checkpoint resumes to the
#    uninterrupted run's losses and final weights;
#  - a background write that fails (file size limit): the run ends with exit 2 and the message, the
#    checkpoint before is untouched;
#  - SIGUSR1 from outside while a slowed write is in flight: the run waits for it, saves the step it
#    stopped at, exits 3, and the resume ends bit-identical.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
common=(train.steps=9 checkpoint.every=3 checkpoint.keep=5)

# same_checkpoints A B: A's and B's checkpoints of steps 3, 6 and 9 hold the same weights and state
# (state.bin's metadata holds the config, which differs in checkpoint.async)
same_checkpoints() {
    local s
    for s in 3 6 9; do
        s=$(printf 'step_%08d' $s)
        [ -f "$2/checkpoints/$s/DONE" ] || die "$2: no complete $s"
        cmp "$1/checkpoints/$s/model.bin" "$2/checkpoints/$s/model.bin" || die "$2: $s/model.bin differs from $1's"
        cmp <(tensors "$1/checkpoints/$s/state.bin") <(tensors "$2/checkpoints/$s/state.bin") ||
            die "$2: $s/state.bin's tensors differ from $1's"
    done
    diff <(losses "$1/log.jsonl") <(losses "$2/log.jsonl") || die "$2: losses differ from $1's"
    cmp "$1/model_00000009.bin" "$2/model_00000009.bin" || die "$2: final weights differ from $1's"
}

"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/sync" > "$W/sync.txt" || die "synchronous run failed"

echo "one process, the step-3 write slowed by 5 s"
LLMC_FAULT=slow:checkpoint_after_model_3 "$BIN" "$W/c.json" "${common[@]}" checkpoint.async=true \
    "out_dir=$W/async" > "$W/async.txt" 2>&1 || die "async run failed: $(tail -n 5 "$W/async.txt")"
line3=$(grep -n 'checkpoint: .*step_00000003 (written in the background in' "$W/async.txt" | cut -d: -f1 || true)
[ -n "$line3" ] || die "no background line for the step-3 checkpoint: $(cat "$W/async.txt")"
step4=$(grep -n '^step *4/9 ' "$W/async.txt" | cut -d: -f1 || true)
[ -n "$step4" ] && [ "$step4" -lt "$line3" ] || die "step 4 did not train while step 3's checkpoint was written: $(cat "$W/async.txt")"
secs=$(sed -n 's/.*step_00000003 (written in the background in \([0-9.]*\) s).*/\1/p' "$W/async.txt")
awk -v s="$secs" 'BEGIN { exit !(s >= 5.0) }' || die "step 3's write took $secs s, not the 5 s sleep and more"
# the synchronous run writes its lines in order
[ "$(grep -n 'checkpoint: .*step_00000003$' "$W/sync.txt" | cut -d: -f1)" -lt "$(grep -n '^step *4/9 ' "$W/sync.txt" | cut -d: -f1)" ] ||
    die "synchronous run: step 3's checkpoint line is not before step 4"
same_checkpoints "$W/sync" "$W/async"
echo "  steps 4..$(( $(sed -n "1,${line3}p" "$W/async.txt" | grep -c '^step ') )) trained during the write ($secs s); checkpoints bit-identical"

echo "dp=2 under mpirun"
dp_run 2 "$W/c.json" "${common[@]}" "out_dir=$W/sync2" > /dev/null || die "dp=2 synchronous run failed"
dp_run 2 "$W/c.json" "${common[@]}" checkpoint.async=true "out_dir=$W/async2" > "$W/async2.txt" 2>&1 ||
    die "dp=2 async run failed: $(tail -n 5 "$W/async2.txt")"
grep -q 'step_00000006 (written in the background' "$W/async2.txt" || die "dp=2: no background write"
same_checkpoints "$W/sync2" "$W/async2"

echo "kill -9 during the background write of step 6"
rc=0
LLMC_FAULT=checkpoint_after_state_6 "$BIN" "$W/c.json" "${common[@]}" checkpoint.async=true "out_dir=$W/kill" \
    > /dev/null 2>&1 || rc=$?
[ $rc -eq 137 ] || die "kill: expected SIGKILL (137), got $rc"
[ -f "$W/kill/checkpoints/step_00000003/DONE" ] || die "kill: step-3 checkpoint lost"
[ ! -f "$W/kill/checkpoints/step_00000006/DONE" ] || die "kill: incomplete step-6 checkpoint marked done"
"$BIN" "$W/c.json" "${common[@]}" checkpoint.async=true "out_dir=$W/kill" > "$W/kill.txt" || die "kill: resume failed"
grep -q 'resumed from .*step_00000003' "$W/kill.txt" || die "kill: did not resume from step 3"
diff <(losses "$W/sync/log.jsonl") <(losses "$W/kill/log.jsonl") || die "kill: losses differ"
cmp "$W/sync/model_00000009.bin" "$W/kill/model_00000009.bin" || die "kill: final weights differ"

echo "a background write that fails"
cp -r "$W/sync" "$W/full"
before=$(md5sum < "$W/full/checkpoints/step_00000009/state.bin")
rc=0
( ulimit -f 8; trap '' XFSZ; exec "$BIN" "$W/c.json" train.steps=15 checkpoint.every=3 checkpoint.async=true \
    "out_dir=$W/full" ) > "$W/fail.txt" 2> "$W/fail_err.txt" || rc=$?
[ $rc -eq 2 ] || die "failed write: expected exit 2, got $rc: $(cat "$W/fail_err.txt")"
grep -q 'step_00000012.*cannot write' "$W/fail_err.txt" || die "failed write: no clear message: $(cat "$W/fail_err.txt")"
[ "$(md5sum < "$W/full/checkpoints/step_00000009/state.bin")" = "$before" ] || die "failed write damaged step 9's checkpoint"
[ -f "$W/full/checkpoints/step_00000009/DONE" ] || die "failed write: step 9's checkpoint lost"
[ ! -e "$W/full/checkpoints/step_00000012" ] || die "failed write left step_00000012"

echo "SIGUSR1 from outside while a slowed write is in flight"
LLMC_FAULT=slow:checkpoint_after_model_3 "$BIN" "$W/c.json" "${common[@]}" checkpoint.async=true \
    "out_dir=$W/usr1" > "$W/usr1.txt" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^step *4/9 ' "$W/usr1.txt" && break; sleep 0.1; done
grep -q '^step *4/9 ' "$W/usr1.txt" || { kill -9 $pid; die "usr1: step 4 not reached: $(cat "$W/usr1.txt")"; }
kill -USR1 $pid
rc=0
wait $pid || rc=$?
[ $rc -eq 3 ] || die "usr1: expected exit 3, got $rc: $(tail -n 5 "$W/usr1.txt")"
at=$(sed -n 's/^SIGUSR1: stopped after step \([0-9]*\), checkpoint saved.*/\1/p' "$W/usr1.txt")
[ -n "$at" ] || die "usr1: no stop message: $(cat "$W/usr1.txt")"
[ -f "$W/usr1/checkpoints/step_00000003/DONE" ] || die "usr1: the step-3 checkpoint in flight was not completed"
[ -f "$W/usr1/checkpoints/$(printf 'step_%08d' "$at")/DONE" ] || die "usr1: no complete checkpoint of step $at"
"$BIN" "$W/c.json" "${common[@]}" checkpoint.async=true "out_dir=$W/usr1" > "$W/usr1_resume.txt" ||
    die "usr1: resume failed"
grep -q "resumed from .*$(printf 'step_%08d' "$at")" "$W/usr1_resume.txt" || die "usr1: did not resume from step $at"
diff <(losses "$W/sync/log.jsonl") <(losses "$W/usr1/log.jsonl") || die "usr1: losses differ"
cmp "$W/sync/model_00000009.bin" "$W/usr1/model_00000009.bin" || die "usr1: final weights differ"
echo "  stopped after step $at, resumed bit-identical"
echo "PASS"
