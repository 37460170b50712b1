# Non-finite steps: a step whose loss or gradient norm is NaN or infinite changes no weight and
# no optimizer state. It is skipped, printed and recorded ("skipped": "nonfinite" with a running
# count), and the run goes on; train.max_bad_steps consecutive ones end it with exit code 4 and
# no new checkpoint. The NaN comes from the test hook LLMC_FAULT=nan:grad_4, which makes step 4's
# loss gradient NaN on one rank only (a last pipeline stage): the gradient reductions spread it.
#
# Proof, per layout (one process; dp=2 with the NaN on rank 1; tp=2 x pp=2 with it on rank 3):
#  - the checkpoints after steps 3 and 4 hold the same weights and AdamW moments, bit for bit
#    (state.bin past its metadata, which differs in the step and the loader's position);
#  - the run ends normally: with dp=2 the end-of-run check that the replicas are identical passed;
#  - a fresh process resumed from the step-4 checkpoint, without the fault, ends at the same
#    weights, bit for bit: nothing but the saved state carried the skip forward;
#  - the layouts end at the weights of the one-process run (1e-5, as the layout tests).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
ck=(checkpoint.every=1 checkpoint.keep=20)

# check_skipped NAME: the run in $W/NAME skipped step 4 and only step 4, and left the state as it was
check_skipped() {
    local d="$W/$1" c="$W/$1/checkpoints"
    grep -q '^step     4/10 .*| skipped (non-finite): no update; 1 skipped so far, 1 in a row' "$d.txt" ||
        die "$1: no skip line for step 4: $(grep '^step' "$d.txt")"
    [ "$(grep -c '"skipped":"nonfinite"' "$d/log.jsonl")" -eq 1 ] || die "$1: expected one skipped record"
    grep '"step":4,' "$d/log.jsonl" | grep -q '"skipped":"nonfinite","skipped_steps":1' ||
        die "$1: step 4's record: $(grep '"step":4,' "$d/log.jsonl")"
    cmp "$c/step_00000003/model.bin" "$c/step_00000004/model.bin" || die "$1: step 4 changed the weights"
    cmp <(tensors "$c/step_00000003/state.bin") <(tensors "$c/step_00000004/state.bin") ||
        die "$1: step 4 changed the optimizer state"
    cmp -s "$c/step_00000004/model.bin" "$c/step_00000005/model.bin" && die "$1: step 5 did not train"
    echo "  $1: step 4 skipped; weights and AdamW moments after it == after step 3"
}
# resume_same NAME RUN...: RUN resumed from NAME's step-4 checkpoint, without the fault, ends at NAME's weights
resume_same() {
    local name=$1; shift
    "$@" "checkpoint.resume=$W/$name/checkpoints/step_00000004" "out_dir=$W/$name.resumed" > /dev/null ||
        die "$name: resume from step 4 failed"
    cmp "$W/$name/model_00000010.bin" "$W/$name.resumed/model_00000010.bin" || die "$name: resumed run ends elsewhere"
    echo "  $name: a fresh process resumed from step 4 ends at the same weights"
}

echo "one process"
LLMC_FAULT=nan:grad_4 "$BIN" "$W/c.json" "${ck[@]}" train.grad_accum=4 "out_dir=$W/one" > "$W/one.txt" 2>&1 ||
    die "one process: $(tail -n 5 "$W/one.txt")"
check_skipped one
resume_same one "$BIN" "$W/c.json" "${ck[@]}" train.grad_accum=4
# the count of skipped steps is part of the state: resumed after step 4's skip, step 6's is the second
LLMC_FAULT=nan:grad_6 "$BIN" "$W/c.json" "${ck[@]}" train.grad_accum=4 "checkpoint.resume=$W/one/checkpoints/step_00000004" \
    "out_dir=$W/one.count" > "$W/one.count.txt" 2>&1 || die "skipped count: $(tail -n 5 "$W/one.count.txt")"
grep '"step":6,' "$W/one.count/log.jsonl" | grep -q '"skipped_steps":2' ||
    die "skipped count: not carried over the resume: $(grep '"step":6,' "$W/one.count/log.jsonl")"

echo "dp=2 (ZeRO-0: replicas), NaN on rank 1"
LLMC_FAULT=nan:grad_4 LLMC_FAULT_RANK=1 dp_run 2 "$W/c.json" "${ck[@]}" "out_dir=$W/dp2" > "$W/dp2.txt" 2>&1 ||
    die "dp=2: $(tail -n 5 "$W/dp2.txt")"
grep -q 'rank 1.*LLMC_FAULT=nan:grad_4' "$W/dp2.txt" || die "dp=2: the fault did not fire on rank 1"
check_skipped dp2
resume_same dp2 dp_run 2 "$W/c.json" "${ck[@]}"
close_weights "$W/one/model_00000010.bin" "$W/dp2/model_00000010.bin"

echo "tp=2 x pp=2, NaN on rank 3 (last stage, tp rank 1)"
mp=(parallel.tp=2 parallel.pp=2 train.grad_accum=4)
LLMC_FAULT=nan:grad_4 LLMC_FAULT_RANK=3 dp_run 4 "$W/c.json" "${ck[@]}" "${mp[@]}" "out_dir=$W/tp2pp2" \
    > "$W/tp2pp2.txt" 2>&1 || die "tp=2 x pp=2: $(tail -n 5 "$W/tp2pp2.txt")"
grep -q 'rank 3.*LLMC_FAULT=nan:grad_4' "$W/tp2pp2.txt" || die "tp=2 x pp=2: the fault did not fire on rank 3"
check_skipped tp2pp2
resume_same tp2pp2 dp_run 4 "$W/c.json" "${ck[@]}" "${mp[@]}"
close_weights "$W/one/model_00000010.bin" "$W/tp2pp2/model_00000010.bin"

echo "train.max_bad_steps=3 consecutive non-finite steps end the run"
rc=0
LLMC_FAULT=nan:grad LLMC_FAULT_RANK=1 dp_run 2 "$W/c.json" train.max_bad_steps=3 checkpoint.every=2 "out_dir=$W/bad" \
    > "$W/bad.txt" 2>&1 || rc=$?
[ $rc -eq 4 ] || die "max_bad_steps: expected exit code 4, got $rc: $(tail -n 5 "$W/bad.txt")"
grep -q 'error: 3 consecutive steps (1 to 3) had a non-finite loss or gradient norm (train.max_bad_steps = 3)' \
    "$W/bad.txt" || die "max_bad_steps: no clear message: $(tail -n 5 "$W/bad.txt")"
[ "$(grep -c '"skipped_steps"' "$W/bad/log.jsonl")" -eq 3 ] || die "max_bad_steps: expected 3 skipped records"
# the step-2 checkpoint (weights as initialised: nothing was ever applied) is the only one; no final model
[ "$(cd "$W/bad/checkpoints" && ls -d step_*)" = step_00000002 ] || die "max_bad_steps: checkpoints: $(ls "$W/bad/checkpoints")"
[ ! -e "$W/bad/model_00000010.bin" ] || die "max_bad_steps: a final model was written"
echo "  stopped after 3 skipped steps with exit code 4; checkpoints as they were"
