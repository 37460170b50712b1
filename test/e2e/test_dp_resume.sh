# Checkpoints are layout-independent: saved at dp=4 with ZeRO-3 (parameters and optimizer state
# gathered from the shards to rank 0, whole tensors written), they resume at dp=2 with ZeRO-1 and at
# dp=1, and at dp=2 with ZeRO-3 (world rank 0 reads the whole file, the other ranks their shards), continuing with the losses and
# final weights of the uninterrupted dp=4 run, to 1e-5 relative. The global batch stays 8
# micro-batches per step: grad_accum x dp = 2 x 4 = 4 x 2 = 8 x 1.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
common=(train.steps=10 checkpoint.every=5 checkpoint.keep=5 parallel.bucket_mb=0.01)
dp_run 4 "$W/c.json" "${common[@]}" parallel.zero=3 "out_dir=$W/full" > "$W/full.txt" || die "dp=4 run failed"
ck="$W/full/checkpoints/step_00000005"
[ -f "$ck/DONE" ] || die "no step-5 checkpoint"
tail_losses() { grep '"loss"' "$1" | tail -n 5 > "$2"; }
tail_losses "$W/full/log.jsonl" "$W/full_tail.jsonl"
for layout in "2 1 4" "1 0 8" "2 3 4"; do
    read -r dp zero accum <<< "$layout"
    out="$W/resume_dp${dp}_z$zero"
    dp_run $dp "$W/c.json" "${common[@]}" parallel.zero=$zero train.grad_accum=$accum "checkpoint.resume=$ck" \
        "out_dir=$out" > "$out.txt" || die "resume at dp=$dp failed: $(tail -n 20 "$out.txt")"
    grep -q 'resumed from .*step_00000005 at step 5 (saved at dp 4)' "$out.txt" || die "dp=$dp did not resume: $(head "$out.txt")"
    [ "$(losses "$out/log.jsonl" | wc -l)" -eq 5 ] || die "dp=$dp: expected steps 6..10"
    echo "resumed at dp=$dp zero=$zero grad_accum=$accum"
    close_losses "$W/full_tail.jsonl" "$out/log.jsonl"
    close_weights "$W/full/model_00000010.bin" "$out/model_00000010.bin"
done
# the same layout resumes bit-exactly
dp_run 4 "$W/c.json" "${common[@]}" parallel.zero=3 "checkpoint.resume=$ck" "out_dir=$W/same" > /dev/null
diff <(losses "$W/full_tail.jsonl") <(losses "$W/same/log.jsonl") || die "dp=4 resume is not bit-exact"
cmp "$W/full/model_00000010.bin" "$W/same/model_00000010.bin" || die "dp=4 resume: final weights differ"
# a shuffled run's window order depends on dp: resuming it elsewhere is refused, clearly
dp_run 2 "$W/c.json" train.steps=4 checkpoint.every=2 data.shuffle=true "out_dir=$W/shuf" > /dev/null
rc=0
"$BIN" "$W/c.json" train.steps=4 data.shuffle=true train.grad_accum=4 "out_dir=$W/shuf1" \
    "checkpoint.resume=$W/shuf/checkpoints/step_00000002" > /dev/null 2> "$W/shuf.err" || rc=$?
[ $rc -eq 2 ] && grep -q 'data.shuffle' "$W/shuf.err" || die "shuffled resume at another dp: rc=$rc $(cat "$W/shuf.err")"
