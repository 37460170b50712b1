# Local SGD / DiLoCo (parallel.local_sgd, llmc/train/local_sgd.h) on two CPU processes:
#  - H=1 with outer lr 1 and momentum 0 (the defaults) averages the replicas after every step: with
#    an inner update linear in the gradient (AdamW whose epsilon 1e8 dwarfs sqrt(v): momentum SGD
#    at lr/eps = 0.5, no weight decay, no clipping) that is plain dp2, to 1e-6 in the losses and the
#    final weights, at ZeRO 0 and 1. (With AdamW as usual it is not: the mean of two AdamW steps is
#    not the AdamW step of the mean gradient.)
#  - dp_bytes: plain dp2 sends 4 Psi bytes a step (the ring all-reduce of the fp32 gradients,
#    2 (p - 1) / p x 4 Psi); H=4 sends nothing but on its sync steps (4, 8 and the last, 10), the
#    same 4 Psi there (ZeRO-1: reduce-scatter and all-gather, 2 Psi each).
#  - H=4 converges: 300 steps at equal tokens end within 2% of plain dp2's validation loss.
#  - a resume in the middle of an interval (step 6 of H=4, outer momentum 0.5) is bit-exact, at ZeRO
#    0 and 1 and from ZeRO 0 into 1; other local SGD settings or another dp are refused (exit 2).
#  - dp2 x pp2 (4 processes) equals dp2, and its checkpoint resumes on dp2 alone.
#  - bad keys exit with code 2 naming the key.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
lsgd() { echo "parallel.local_sgd.every=$1" "parallel.local_sgd.outer_lr=${2:-1}" "parallel.local_sgd.outer_momentum=${3:-0}"; }
dp_bytes() { grep -o '"dp_bytes":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# --- H=1 = plain dp2 with a linear inner update
linear=(train.eps=1e8 train.lr=5e7 train.weight_decay=0 train.grad_clip=0)
dp_run 2 "$W/c.json" "${linear[@]}" "out_dir=$W/plain" > "$W/plain.txt" || die "plain dp2 failed"
for zero in 0 1; do
    out="$W/h1_z$zero"
    dp_run 2 "$W/c.json" "${linear[@]}" $(lsgd 1) parallel.zero=$zero "out_dir=$out" > "$out.txt" ||
        die "H=1 zero=$zero failed: $(tail -n 5 "$out.txt")"
    grep -q 'local SGD: every 1 steps' "$out.txt" || die "no local SGD banner: $(head -n 5 "$out.txt")"
    echo "H=1 zero=$zero against plain dp2:"
    close_losses "$W/plain/log.jsonl" "$out/log.jsonl" 1e-6
    close_weights "$W/plain/model_00000010.bin" "$out/model_00000010.bin" 1e-6
done

# --- the bytes each step sends
P=$(psi "$W/plain.txt")
[ -n "$P" ] || die "no memory table in $W/plain.txt"
B=$((4 * P))
[ "$(dp_bytes "$W/plain/log.jsonl")" = "$(printf "$B %.0s" $(seq 10))" ] || die "plain dp_bytes: $(dp_bytes "$W/plain/log.jsonl") (want $B each)"
for zero in 0 1; do
    dp_run 2 "$W/c.json" $(lsgd 4) parallel.zero=$zero "out_dir=$W/h4_z$zero" > "$W/h4_z$zero.txt" || die "H=4 failed"
    [ "$(dp_bytes "$W/h4_z$zero/log.jsonl")" = "0 0 0 $B 0 0 0 $B 0 $B " ] ||
        die "H=4 zero=$zero dp_bytes: $(dp_bytes "$W/h4_z$zero/log.jsonl") (want $B on steps 4, 8, 10)"
    [ "$(grep -c '^step .* | outer step$' "$W/h4_z$zero.txt")" -eq 3 ] || die "expected 3 outer steps"
done
echo "dp_bytes: plain $B every step; H=4 $B on steps 4, 8, 10 only (Psi = $P)"
# two replicas' sums are the same bits however they are reduced: ZeRO 1 = ZeRO 0
cmp "$W/h4_z0/model_00000010.bin" "$W/h4_z1/model_00000010.bin" || die "H=4: ZeRO-1 differs from ZeRO-0"

# --- convergence at equal tokens
converges_like_plain "$W/c.json" 2 "H=4" $(lsgd 4)

# --- resume in the middle of an interval
ck=(train.steps=10 checkpoint.every=3 checkpoint.keep=5)
for zero in 0 1; do
    dp_run 2 "$W/c.json" "${ck[@]}" $(lsgd 4 0.7 0.5) parallel.zero=$zero "out_dir=$W/full$zero" > /dev/null ||
        die "H=4 zero=$zero with checkpoints failed"
done
cmp "$W/full0/model_00000010.bin" "$W/full1/model_00000010.bin" || die "momentum 0.5: ZeRO-1 differs from ZeRO-0"
for from_to in "0 0" "1 1" "0 1"; do
    read -r from to <<< "$from_to"
    out="$W/resume_${from}_$to"
    dp_run 2 "$W/c.json" "${ck[@]}" $(lsgd 4 0.7 0.5) parallel.zero=$to \
        "checkpoint.resume=$W/full$from/checkpoints/step_00000006" "out_dir=$out" > "$out.txt" ||
        die "resume zero $from -> $to failed: $(tail -n 5 "$out.txt")"
    diff <(grep '"loss"' "$W/full$from/log.jsonl" | tail -n 4 | grep -o '"loss":[^,}]*') \
         <(grep -o '"loss":[^,}]*' "$out/log.jsonl") > /dev/null || die "resume zero $from -> $to: losses differ"
    cmp "$W/full$from/model_00000010.bin" "$out/model_00000010.bin" || die "resume zero $from -> $to: weights differ"
    echo "resumed at step 6 (mid-interval), ZeRO $from -> $to: steps 7-10 and final weights bitwise"
done
step6="checkpoint.resume=$W/full0/checkpoints/step_00000006"
expect_fail 2 'parallel.local_sgd.every: 4 -> 2' \
    dp_run 2 "$W/c.json" "${ck[@]}" $(lsgd 2 0.7 0.5) "$step6" "out_dir=$W/bad1"
expect_fail 2 'parallel.local_sgd.outer_momentum: 0.5 -> 0.9' \
    dp_run 2 "$W/c.json" "${ck[@]}" $(lsgd 4 0.7 0.9) "$step6" "out_dir=$W/bad2"
expect_fail 2 'parallel.local_sgd.every: 4 -> 0' dp_run 2 "$W/c.json" "${ck[@]}" "$step6" "out_dir=$W/bad3"
expect_fail 2 'replicas of 2 DP ranks, this run has parallel.dp = 1' \
    "$BIN" "$W/c.json" "${ck[@]}" $(lsgd 4 0.7 0.5) train.grad_accum=4 "$step6" "out_dir=$W/bad4"
# allowed changes: plain DP continues DP rank 0's replica; local SGD starts from a plain checkpoint
dp_run 2 "$W/c.json" "${ck[@]}" checkpoint.allow_changes=true "$step6" "out_dir=$W/to_plain" > "$W/to_plain.txt" ||
    die "local -> plain with allow_changes failed"
grep -q 'local SGD state (2 replicas) is not used' "$W/to_plain.txt" || die "no note: $(head "$W/to_plain.txt")"
dp_run 2 "$W/c.json" "${ck[@]}" "out_dir=$W/plain_ck" > /dev/null || die "plain with checkpoints failed"
dp_run 2 "$W/c.json" "${ck[@]}" $(lsgd 4) checkpoint.allow_changes=true \
    "checkpoint.resume=$W/plain_ck/checkpoints/step_00000006" "out_dir=$W/to_local" > "$W/to_local.txt" ||
    die "plain -> local with allow_changes failed"
grep -q 'local SGD starts at step 6' "$W/to_local.txt" || die "no note: $(head "$W/to_local.txt")"

# --- pipeline parallelism inside each replica
pp=(train.steps=6 checkpoint.every=3 $(lsgd 2 0.7 0.5))
dp_run 2 "$W/c.json" "${pp[@]}" "out_dir=$W/dp2" > /dev/null || die "dp2 H=2 failed"
dp_run 4 "$W/c.json" "${pp[@]}" parallel.pp=2 "out_dir=$W/dp2pp2" > "$W/dp2pp2.txt" ||
    die "dp2 x pp2 failed: $(tail -n 5 "$W/dp2pp2.txt")"
echo "dp2 x pp2 against dp2:"
close_losses "$W/dp2/log.jsonl" "$W/dp2pp2/log.jsonl"
close_weights "$W/dp2/model_00000006.bin" "$W/dp2pp2/model_00000006.bin"
dp_run 2 "$W/c.json" "${pp[@]}" "checkpoint.resume=$W/dp2pp2/checkpoints/step_00000003" "out_dir=$W/pp_resumed" \
    > /dev/null || die "resuming dp2 x pp2's checkpoint on dp2 failed"
echo "dp2 x pp2's step-3 checkpoint resumed on dp2:"
close_weights "$W/dp2pp2/model_00000006.bin" "$W/pp_resumed/model_00000006.bin"

# --- bad keys
expect_fail 2 'parallel.local_sgd.every' "$BIN" "$W/c.json" parallel.local_sgd.every=-1
expect_fail 2 'parallel.local_sgd.outer_lr' "$BIN" "$W/c.json" $(lsgd 4 0)
expect_fail 2 'parallel.local_sgd.outer_momentum' "$BIN" "$W/c.json" $(lsgd 4 1 1)
expect_fail 2 'parallel.local_sgd.outer_lr: set, but parallel.local_sgd.every is not' \
    "$BIN" "$W/c.json" parallel.local_sgd.outer_lr=0.5
expect_fail 2 'parallel.zero: 2 .*stages 0 and 1' "$BIN" "$W/c.json" $(lsgd 4) parallel.zero=2
expect_fail 2 'parallel.cp: 2 .*parallel.cp=1' "$BIN" "$W/c.json" $(lsgd 4) parallel.cp=2
echo "bad keys: exit 2 naming the key"
