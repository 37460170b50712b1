# Bit-exact resume: N steps in one run == N/2 steps, stop, resume for the rest;
# losses at every step and the final weights are identical.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"
common=(train.steps=12 checkpoint.every=3 data.shuffle=true)
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/full" > /dev/null
# first half: a run that stops after 6 steps (its own steps=6 would change the LR schedule,
# so it is killed right after the step-6 checkpoint completes instead)
LLMC_FAULT=checkpoint_after_done_6 "$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/half" > /dev/null 2>&1 || true
[ -f "$W/half/checkpoints/step_00000006/DONE" ] || die "no step-6 checkpoint"
cp -r "$W/half" "$W/again"  # (for the resume with model.init below)
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/half" > "$W/resume.txt"
grep -q 'resumed from .*step_00000006' "$W/resume.txt" || die "did not resume from step 6: $(cat "$W/resume.txt")"
diff <(losses "$W/full/log.jsonl") <(losses "$W/half/log.jsonl") || die "losses differ after resume"
cmp "$W/full/model_00000012.bin" "$W/half/model_00000012.bin" || die "final weights differ after resume"
# keep=2: only the two newest complete checkpoints remain
[ "$(ls -d "$W/full/checkpoints"/step_* | wc -l)" -eq 2 ] || die "checkpoint.keep not honoured: $(ls "$W/full/checkpoints")"
# a resumed run takes every weight from the checkpoint: it neither draws nor reads model.init (a
# file that is no model at all does not stop it) and trains the same
printf 'not a model' > "$W/junk.bin"
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/again" "model.init=$W/junk.bin" > "$W/again.txt" 2>&1 || die "resume with model.init a junk file: $(tail -n 3 "$W/again.txt")"
diff <(losses "$W/full/log.jsonl") <(losses "$W/again/log.jsonl") || die "losses differ after resume (model.init junk)"
cmp "$W/full/model_00000012.bin" "$W/again/model_00000012.bin" || die "final weights differ after resume (model.init junk)"
