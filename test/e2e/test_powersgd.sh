# PowerSGD (parallel.grad_compression=powersgd, llmc/train/powersgd.h) on two CPU processes:
#  - a rank at least every matrix's smaller side (32 on the test's model: d_model) compresses nothing:
#    the run is plain dp2, to 1e-6 in the losses and the final weights (every tensor goes through the
#    plain all-reduce; the sums of two ranks are the same bits however they are packed)
#  - dp_bytes and compression: rank 32 sends plain dp2's 4 Psi bytes a step (compression 1); rank 4
#    sends less, and 4 Psi / dp_bytes is the logged compression
#  - rank 4 converges: 300 steps at equal tokens end within 3% of plain dp2's validation loss
#  - a resume at step 6 (every rank's error feedback and Q from the checkpoint) is bit-exact; a plain
#    checkpoint starts PowerSGD afresh (allow_changes); another rank, plain DP or another dp is
#    refused (exit 2)
#  - bad keys and combinations exit with code 2 naming the key
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
psgd() { echo "parallel.grad_compression=powersgd" "parallel.powersgd_rank=$1"; }
dp_bytes() { grep -o '"dp_bytes":[0-9]*' "$1" | cut -d: -f2 | sort -u | tr '\n' ' '; }
ratio() { grep -o '"compression":[0-9.e+-]*' "$1" | cut -d: -f2 | sort -u; }

# --- full rank = plain dp2
dp_run 2 "$W/c.json" "out_dir=$W/plain" > "$W/plain.txt" || die "plain dp2 failed"
dp_run 2 "$W/c.json" $(psgd 32) "out_dir=$W/full" > "$W/full.txt" || die "rank 32 failed: $(tail -n 5 "$W/full.txt")"
grep -q 'PowerSGD rank 32: 0 matrices compressed' "$W/full.txt" || die "no PowerSGD banner: $(head -n 5 "$W/full.txt")"
echo "rank 32 (full) against plain dp2:"
close_losses "$W/plain/log.jsonl" "$W/full/log.jsonl" 1e-6
close_weights "$W/plain/model_00000010.bin" "$W/full/model_00000010.bin" 1e-6

# --- bytes and compression
P=$(psi "$W/plain.txt")
[ -n "$P" ] || die "no memory table in $W/plain.txt"
B=$((4 * P))
[ "$(dp_bytes "$W/plain/log.jsonl")" = "$B " ] || die "plain dp_bytes: $(dp_bytes "$W/plain/log.jsonl") (want $B)"
[ "$(dp_bytes "$W/full/log.jsonl")" = "$B " ] || die "rank 32 dp_bytes: $(dp_bytes "$W/full/log.jsonl") (want $B)"
awk -v c="$(ratio "$W/full/log.jsonl")" 'BEGIN { exit !(c == 1) }' || die "rank 32 compression: $(ratio "$W/full/log.jsonl") (want 1)"
dp_run 2 "$W/c.json" $(psgd 4) "out_dir=$W/r4" > "$W/r4.txt" || die "rank 4 failed: $(tail -n 5 "$W/r4.txt")"
b4=$(dp_bytes "$W/r4/log.jsonl"); c4=$(ratio "$W/r4/log.jsonl")
[ "$(echo $b4 | wc -w)" -eq 1 ] && [ "$(echo $c4 | wc -w)" -eq 1 ] || die "rank 4: dp_bytes '$b4', compression '$c4' vary"
awk -v B="$B" -v b="$b4" -v c="$c4" 'BEGIN { r = B / b; d = r - c; if (d < 0) d = -d; exit !(b < B / 4 && d < 1e-9 * r) }' ||
    die "rank 4: dp_bytes $b4 of plain $B, logged compression $c4"
echo "dp_bytes: plain and rank 32 $B a step; rank 4 $b4 (compression $c4)"

# --- convergence at equal tokens
converges_like_plain "$W/c.json" 3 "PowerSGD rank 4" $(psgd 4)

# --- resume
ck=(train.steps=10 checkpoint.every=3 checkpoint.keep=5 $(psgd 4))
dp_run 2 "$W/c.json" "${ck[@]}" "out_dir=$W/ck" > /dev/null || die "rank 4 with checkpoints failed"
step6="checkpoint.resume=$W/ck/checkpoints/step_00000006"
dp_run 2 "$W/c.json" "${ck[@]}" "$step6" "out_dir=$W/resumed" > "$W/resumed.txt" ||
    die "resume failed: $(tail -n 5 "$W/resumed.txt")"
diff <(grep '"loss"' "$W/ck/log.jsonl" | tail -n 4 | grep -o '"loss":[^,}]*') \
     <(grep -o '"loss":[^,}]*' "$W/resumed/log.jsonl") > /dev/null || die "resume: losses differ"
cmp "$W/ck/model_00000010.bin" "$W/resumed/model_00000010.bin" || die "resume: weights differ"
echo "resumed at step 6: steps 7-10 and final weights bitwise"
# a plain run's checkpoint, resumed into rank 4 with allow_changes, starts PowerSGD afresh
dp_run 2 "$W/c.json" train.steps=10 checkpoint.every=3 checkpoint.keep=5 "out_dir=$W/plain_ck" > /dev/null ||
    die "plain with checkpoints failed"
dp_run 2 "$W/c.json" "${ck[@]}" checkpoint.allow_changes=true "checkpoint.resume=$W/plain_ck/checkpoints/step_00000006" \
    "out_dir=$W/fresh" > "$W/fresh.txt" || die "plain -> rank 4 with allow_changes failed"
grep -q 'PowerSGD starts at step 6 with no error feedback' "$W/fresh.txt" || die "no note: $(head "$W/fresh.txt")"
expect_fail 2 'parallel.powersgd_rank: 4 -> 8' dp_run 2 "$W/c.json" "${ck[@]}" $(psgd 8) "$step6" "out_dir=$W/bad1"
expect_fail 2 'parallel.grad_compression' \
    dp_run 2 "$W/c.json" train.steps=10 "$step6" "out_dir=$W/bad2"
expect_fail 2 'error feedback of 2 DP ranks, this run has parallel.dp = 1' \
    "$BIN" "$W/c.json" "${ck[@]}" train.grad_accum=4 "$step6" "out_dir=$W/bad3"

# --- bad keys
expect_fail 2 'parallel.grad_compression' "$BIN" "$W/c.json" parallel.grad_compression=topk
expect_fail 2 'parallel.powersgd_rank' "$BIN" "$W/c.json" $(psgd 0)
expect_fail 2 'parallel.powersgd_rank' "$BIN" "$W/c.json" $(psgd -3)
expect_fail 2 'parallel.powersgd_rank: set \(8\), but parallel.grad_compression is "none"' \
    "$BIN" "$W/c.json" parallel.powersgd_rank=8
expect_fail 2 'parallel.zero: 1 with parallel.grad_compression = powersgd' "$BIN" "$W/c.json" $(psgd 4) parallel.zero=1
expect_fail 2 'parallel.local_sgd.every: 4 with parallel.grad_compression' \
    "$BIN" "$W/c.json" $(psgd 4) parallel.local_sgd.every=4
expect_fail 2 'parallel.tp: 2 with parallel.grad_compression' "$BIN" "$W/c.json" $(psgd 4) parallel.tp=2
expect_fail 2 'parallel.pp: 2 with parallel.grad_compression' "$BIN" "$W/c.json" $(psgd 4) parallel.pp=2
expect_fail 2 'parallel.grad_compression: "powersgd" runs on the CPU backend only' \
    "$BIN" "$W/c.json" $(psgd 4) device=cuda precision=bf16
expect_fail 2 'precision: fp16 with parallel.grad_compression = powersgd' "$BIN" "$W/c.json" $(psgd 4) precision=fp16
echo "bad keys: exit 2 naming the key"
