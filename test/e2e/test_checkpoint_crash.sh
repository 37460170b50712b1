# kill -9 at several points of a checkpoint write: the previous checkpoint stays loadable,
# resume=auto never picks the incomplete one, and the resumed run ends exactly like an
# uninterrupted one. A failed write (file size limit) is an error that keeps the old checkpoint.
# Corrupt, truncated and mismatched checkpoints are refused with exit code 2.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"
common=(train.steps=9 checkpoint.every=3)
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/full" > /dev/null
for point in checkpoint_after_model checkpoint_after_state checkpoint_after_rename; do
    d="$W/$point"
    rc=0
    LLMC_FAULT=${point}_6 "$BIN" "$W/c.json" "${common[@]}" "out_dir=$d" > /dev/null 2>&1 || rc=$?
    [ $rc -eq 137 ] || die "$point: expected SIGKILL (137), got $rc"
    [ -f "$d/checkpoints/step_00000003/DONE" ] || die "$point: step-3 checkpoint lost"
    [ ! -f "$d/checkpoints/step_00000006/DONE" ] || die "$point: incomplete step-6 checkpoint marked done"
    "$BIN" "$W/c.json" "${common[@]}" "out_dir=$d" > "$d/resume.txt"
    grep -q 'resumed from .*step_00000003' "$d/resume.txt" || die "$point: did not resume from step 3"
    # steps 4..6 were logged before the crash; the resume drops those records and logs them again
    diff <(losses "$W/full/log.jsonl") <(losses "$d/log.jsonl") || die "$point: losses differ"
    cmp "$W/full/model_00000009.bin" "$d/model_00000009.bin" || die "$point: final weights differ"
done

# a failed write: with a file-size limit smaller than a checkpoint, the save fails with exit 2
# and a message, and the complete checkpoint from before is untouched
d="$W/full/checkpoints"
before=$(cat "$d"/step_00000009/state.bin | md5sum)
rc=0
( ulimit -f 8; trap '' XFSZ; exec "$BIN" "$W/c.json" train.steps=12 checkpoint.every=3 "out_dir=$W/full" ) > /dev/null 2> "$W/err.txt" || rc=$?
[ $rc -eq 2 ] || die "failed write: expected exit 2, got $rc: $(cat "$W/err.txt")"
grep -q 'cannot write' "$W/err.txt" || die "failed write: no clear message: $(cat "$W/err.txt")"
[ "$(cat "$d"/step_00000009/state.bin | md5sum)" = "$before" ] || die "failed write damaged the previous checkpoint"
[ -f "$d/step_00000009/DONE" ] || die "previous checkpoint lost"

# corrupt / truncated / mismatched checkpoints are refused, naming the file
cp -r "$d/step_00000009" "$W/corrupt"
printf '\x01' | dd of="$W/corrupt/state.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_fail 2 'state\.bin.*(checksum|corrupt)' "$BIN" "$W/c.json" train.steps=12 "out_dir=$W/x1" "checkpoint.resume=$W/corrupt"
cp -r "$d/step_00000009" "$W/trunc"
truncate -s 3000 "$W/trunc/model.bin"
expect_fail 2 'model\.bin.*(truncated|bytes)' "$BIN" "$W/c.json" train.steps=12 "out_dir=$W/x2" "checkpoint.resume=$W/trunc"
expect_fail 2 'model\.d_model' "$BIN" "$W/c.json" train.steps=12 model.d_model=64 "out_dir=$W/x3" "checkpoint.resume=$d/step_00000009"
rm "$W/trunc/DONE"
expect_fail 2 'incomplete' "$BIN" "$W/c.json" train.steps=12 "out_dir=$W/x4" "checkpoint.resume=$W/trunc"
