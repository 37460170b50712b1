# precision "fp16" on the CPU (fp32 storage rounded to fp16 where CUDA stores fp16, llmc/cpu/fp16_ops.h)
# with loss scaling (train.loss_scale, train.loss_scale_window):
#  (a) a forced overflow (LLMC_FAULT=nan:grad_5: step 5's scaled gradient is NaN, its loss finite)
#      skips exactly step 5 ("skipped": "overflow"; the weights and AdamW moments after it equal those
#      after step 4, bit for bit) and halves the scale; the scale doubles after every window of clean
#      steps (window 4: 65536 x4, 131072, then 65536 x4, 131072);
#  (b) a run resumed from the step-7 checkpoint (mid-window: 2 clean steps counted) ends bit-identical
#      to the uninterrupted one, loss scales included: the scale and the count travel in the checkpoint;
#  (c) a fixed scale stays fixed; a real fp16 overflow (a fixed scale of 1e30: every scaled gradient
#      rounds to inf) skips every step as "overflow" and train.max_bad_steps ends the run (exit 4);
#  (d) dp=2, tp=2 and pp=2 track the one-process run within fp16's rounding (step 1's gradient, the
#      losses, the final weights) and take the same scale decisions (a real overflow at step 10 included);
#  (e) the rounding happens (step 1 differs from fp32 bitwise) and fp16 trains as fp32 does (final val
#      loss and the mean of the last 10 losses within 2% after 150 steps);
#  (f) bad keys: exit 2 naming the key; train.offload_optimizer trains bitwise alike.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
sed -i 's/"precision": "fp32"/"precision": "fp16"/' "$W/c.json"
ck=(checkpoint.every=1 checkpoint.keep=20 train.loss_scale_window=4)

# ---- (a) a forced overflow at step 5 ----
LLMC_FAULT=nan:grad_5 "$BIN" "$W/c.json" "${ck[@]}" "out_dir=$W/one" > "$W/one.txt" 2>&1 || die "one process: $(tail -n 5 "$W/one.txt")"
grep -q '^fp16: parameters, gradients and activations in IEEE half (emulated exactly on the CPU' "$W/one.txt" ||
    die "no fp16 banner line: $(head -n 3 "$W/one.txt")"
grep -q 'parameters .*(fp32 holding fp16 values)' "$W/one.txt" || die "memory table: no fp16 note"
grep -q 'optimizer .*(m, v, master fp32)' "$W/one.txt" || die "memory table: no master weights"
# --plan (device "cpu") counts what the run allocates, master weights included
"$BIN" "$W/c.json" --plan=json > "$W/plan.json" || die "--plan failed"
opt=$(grep -o '^  optimizer *[0-9.]* [KMG]iB *[0-9]* B' "$W/one.txt" | awk '{ print $(NF-1) }')
grep -q "\"optimizer\":$opt[,}]" "$W/plan.json" || die "--plan's optimizer bytes are not the run's $opt: $(head -c 600 "$W/plan.json")"
want="65536.0 65536.0 65536.0 65536.0 131072.0 65536.0 65536.0 65536.0 65536.0 131072.0 "
[ "$(scales "$W/one/log.jsonl")" = "$want" ] || die "loss scales: $(scales "$W/one/log.jsonl"), want $want"
[ "$(grep -c '"skipped"' "$W/one/log.jsonl")" -eq 1 ] || die "expected exactly one skipped step"
grep '"step":5,' "$W/one/log.jsonl" | grep -q '"skipped":"overflow","skipped_steps":1' ||
    die "step 5's record: $(grep '"step":5,' "$W/one/log.jsonl")"
grep -q '^step     5/10 .*| loss scale 131072 | skipped (overflow): no update; loss scale 131072 -> 65536; 1 skipped so far' \
    "$W/one.txt" || die "no overflow line for step 5: $(grep '^step     5' "$W/one.txt")"
c="$W/one/checkpoints"
cmp "$c/step_00000004/model.bin" "$c/step_00000005/model.bin" || die "step 5 changed the weights"
cmp <(tensors "$c/step_00000004/state.bin") <(tensors "$c/step_00000005/state.bin") || die "step 5 changed the optimizer state"
cmp -s "$c/step_00000005/model.bin" "$c/step_00000006/model.bin" && die "step 6 did not train"
echo "  step 5 skipped as an overflow, scale 131072 -> 65536; weights and moments unchanged; scales: $want"

# ---- (b) resume mid-window ----
"$BIN" "$W/c.json" "${ck[@]}" "checkpoint.resume=$c/step_00000007" "out_dir=$W/resumed" > "$W/resumed.txt" 2>&1 ||
    die "resume: $(tail -n 5 "$W/resumed.txt")"
cmp "$W/one/model_00000010.bin" "$W/resumed/model_00000010.bin" || die "the resumed run ends at other weights"
# (its own log: steps 8 to 10, whose scales the step-7 checkpoint decides)
[ "$(scales "$W/resumed/log.jsonl")" = "65536.0 65536.0 131072.0 " ] || die "resumed scales: $(scales "$W/resumed/log.jsonl")"
[ "$(losses "$W/resumed/log.jsonl" | tail -n 3)" = "$(losses "$W/one/log.jsonl" | tail -n 3)" ] || die "resumed losses differ"
echo "  resumed from step 7 (2 of 4 clean steps counted): bit-identical weights, losses and scales"

# ---- (c) fixed scales ----
"$BIN" "$W/c.json" train.loss_scale=1024 "out_dir=$W/fixed" > "$W/fixed.txt" 2>&1 || die "fixed: $(tail -n 5 "$W/fixed.txt")"
[ "$(scales "$W/fixed/log.jsonl")" = "$(printf '1024.0 %.0s' $(seq 10))" ] || die "fixed scale moved: $(scales "$W/fixed/log.jsonl")"
grep -q 'loss scale fixed at 1024' "$W/fixed.txt" || die "no fixed-scale banner"
rc=0
"$BIN" "$W/c.json" train.loss_scale=1e30 train.max_bad_steps=3 "out_dir=$W/huge" > "$W/huge.txt" 2>&1 || rc=$?
[ $rc -eq 4 ] || die "a fixed scale of 1e30: expected exit 4, got $rc: $(tail -n 3 "$W/huge.txt")"
[ "$(grep -c '"skipped":"overflow"' "$W/huge/log.jsonl")" -eq 3 ] || die "1e30: expected 3 overflow records"
grep -q '^step     3/10 .*skipped (overflow at the fixed loss scale): no update; 3 skipped so far, 3 in a row' "$W/huge.txt" ||
    die "1e30: no overflow line: $(grep '^step' "$W/huge.txt")"
echo "  a fixed 1024 stays; a fixed 1e30 overflows fp16 at every step and ends the run after 3 (exit 4)"

# ---- (d) layouts ----
base=(train.loss_scale_window=4 train.grad_accum=4)
# (window 4: the scale doubles after steps 4 and 8, and step 10 at 262144 overflows fp16 for real:
# every layout must take the same decisions)
"$BIN" "$W/c.json" "${base[@]}" "out_dir=$W/l1" > /dev/null || die "layout baseline failed"
grep '"step":10,' "$W/l1/log.jsonl" | grep -q '"loss_scale":262144.0,.*"skipped":"overflow"' ||
    die "the baseline's step 10 did not overflow: $(grep '"step":10,' "$W/l1/log.jsonl")"
# step 1's gradient (unscaled by the dump), of 1-step runs
one=(train.steps=1 train.warmup_steps=0 train.grad_accum=4)
LLMC_DUMP_GRADS="$W/g1.bin" "$BIN" "$W/c.json" "${one[@]}" "out_dir=$W/g1" > /dev/null || die "gradient baseline failed"
# (dp=2 with half the accumulation: the same sequences per step)
for layout in "dp 2 parallel.dp=2 train.grad_accum=2" "tp 2 parallel.tp=2" "pp 2 parallel.pp=2"; do
    read -r name n arg more <<< "$layout"
    LLMC_DUMP_GRADS="$W/g_$name.bin" dp_run "$n" "$W/c.json" "${one[@]}" $arg $more "out_dir=$W/g_$name" \
        > "$W/g_$name.txt" 2>&1 || die "$name=2, one step: $(tail -n 5 "$W/g_$name.txt")"
    dp_run "$n" "$W/c.json" "${base[@]}" $arg $more "out_dir=$W/l_$name" > "$W/l_$name.txt" 2>&1 ||
        die "$name=2: $(tail -n 5 "$W/l_$name.txt")"
    [ "$(scales "$W/l_$name/log.jsonl")" = "$(scales "$W/l1/log.jsonl")" ] || die "$name=2: other loss scales"
    echo "  $name=2:"
    # fp16 tolerances: the layouts round other partial sums to fp16 (a half's step is 2^-10 relative)
    close_weights "$W/g1.bin" "$W/g_$name.bin" 2e-3 5e-3  # step 1's gradient
    close_losses "$W/l1/log.jsonl" "$W/l_$name/log.jsonl" 5e-5
    close_weights "$W/l1/model_00000010.bin" "$W/l_$name/model_00000010.bin" 5e-3 2e-2
done

# optimizer offload: the host update rounds the master weights to fp16 as the emulated AdamW does
"$BIN" "$W/c.json" "${base[@]}" train.offload_optimizer=true "out_dir=$W/l_off" > /dev/null || die "offload failed"
[ "$(losses "$W/l_off/log.jsonl")" = "$(losses "$W/l1/log.jsonl")" ] || die "optimizer offload changes the losses"
cmp "$W/l1/model_00000010.bin" "$W/l_off/model_00000010.bin" || die "optimizer offload changes the weights"
echo "  train.offload_optimizer: bitwise the same losses and weights"

# ---- (e) fp16 rounds, and trains as fp32 ----
long=(train.steps=150 train.grad_accum=1 train.micro_batch=4 train.seq_len=32 eval.every=150 eval.batches=4)
"$BIN" "$W/c.json" "${long[@]}" "out_dir=$W/t16" > /dev/null || die "fp16 150 steps failed"
"$BIN" "$W/c.json" "${long[@]}" precision=fp32 "out_dir=$W/t32" > /dev/null || die "fp32 150 steps failed"
[ "$(losses "$W/t16/log.jsonl" | head -n 1)" != "$(losses "$W/t32/log.jsonl" | head -n 1)" ] ||
    die "step 1 of fp16 equals fp32 bitwise: nothing was rounded"
mean_last10() { losses "$1" | tail -n 10 | awk '{ s += $1 } END { printf "%.6f", s / NR }'; }
v16=$(val_last "$W/t16/log.jsonl"); v32=$(val_last "$W/t32/log.jsonl")
m16=$(mean_last10 "$W/t16/log.jsonl"); m32=$(mean_last10 "$W/t32/log.jsonl")
echo "  150 steps: val loss fp16 $v16, fp32 $v32; mean of the last 10 losses fp16 $m16, fp32 $m32"
awk -v a="$(losses "$W/t32/log.jsonl" | head -n 1)" -v b="$v32" 'BEGIN { exit !(b < a - 1.0) }' ||
    die "the fp32 baseline did not learn"
for pair in "$v16 $v32 val" "$m16 $m32 mean"; do
    read -r a b what <<< "$pair"
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * b) }' ||
        die "fp16 vs fp32 $what loss: $a vs $b differ by more than 2%"
done

# ---- (f) bad keys ----
expect_fail 2 'train.loss_scale: 1024 applies to precision "fp16" only' "$BIN" "$W/c.json" precision=fp32 train.loss_scale=1024
expect_fail 2 'train.loss_scale_window: 10 applies to precision "fp16" only' "$BIN" "$W/c.json" precision=fp32 \
    train.loss_scale_window=10
expect_fail 2 'train.loss_scale_window: 10 applies to the dynamic loss scale only' "$BIN" "$W/c.json" \
    train.loss_scale=8 train.loss_scale_window=10
expect_fail 2 'train.loss_scale: expected a number or "dynamic", got string "static"' "$BIN" "$W/c.json" train.loss_scale=static
expect_fail 2 'train.loss_scale' "$BIN" "$W/c.json" train.loss_scale=0
expect_fail 2 'train.loss_scale_window' "$BIN" "$W/c.json" train.loss_scale_window=0
expect_fail 2 'does not run under the test hook LLMC_SIM_DEVICE' env LLMC_SIM_DEVICE=1 "$BIN" "$W/c.json"
echo "  bad keys: exit 2 naming the key"
echo PASS
