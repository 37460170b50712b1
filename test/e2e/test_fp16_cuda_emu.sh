# precision "fp16" on device "cuda": the trainer (train_gpt.cu) over CudaOps compiled for the CUDA
# emulator of CI (build/train_gpt_emu: IEEE half tensors, cuBLASLt's 16F GEMMs, the flash attention
# kernels' f16 mma at head size 32), against the CPU's exact emulation of fp16 (test_fp16_cpu.sh):
#  (a) step 1's gradients equal the CPU's to 2e-3 in norm, and 10 steps track the CPU's fp16 run
#      (losses within 2e-4 relative: the two differ in summation order and in what a fused kernel
#      keeps in fp32) and take the same loss-scale decisions, the real overflow of a scale grown to
#      262144 included;
#  (b) a forced overflow (LLMC_FAULT=nan:grad_5) skips exactly step 5 on the device: the weights and
#      the AdamW state after it equal those after step 4, bit for bit, and the scale halves;
#  (c) a run resumed from the step-7 checkpoint (mid-window) ends bit-identical to the uninterrupted one;
#  (d) dp=2 over MPI (a device each) tracks one process and takes the same scale decisions;
#  (e) a CPU fp16 checkpoint resumes on the device: steps 6 to 10 track the CPU's own continuation;
#  (f) the memory table says fp16 parameters with fp32 master weights; full recomputation is bitwise
#      the plain run.
# The device numbers of a real GPU are dev/bench's (scripts/gpu_window.sh); this proves the code paths.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
emu_tiny_config "$W/c.json" fp16
ck=(checkpoint.every=1 checkpoint.keep=20 train.loss_scale_window=4)
# skips FILE: STEP:WHY of each skipped step of a log.jsonl, on one line
skips() { grep '"skipped":"' "$1" | sed 's/.*"skipped":"\([a-z-]*\)".*"step":\([0-9]*\),.*/\2:\1/' | tr '\n' ' '; }

# ---- (a) device against the CPU's emulation ----
LLMC_DUMP_GRADS="$W/dev.grads.bin" "$EMU" "$W/c.json" device=cuda "${ck[@]}" "out_dir=$W/dev" > "$W/dev.txt" 2>&1 ||
    die "device run: $(tail -n 5 "$W/dev.txt")"
LLMC_DUMP_GRADS="$W/cpu.grads.bin" "$BIN" "$W/c.json" "${ck[@]}" "out_dir=$W/cpu" > "$W/cpu.txt" 2>&1 ||
    die "CPU run: $(tail -n 5 "$W/cpu.txt")"
grep -q '^train_gpt | device cuda | precision fp16' "$W/dev.txt" || die "not a device run: $(head -n 2 "$W/dev.txt")"
grep -q '^fp16: parameters, gradients and activations in IEEE half, fp32 master' "$W/dev.txt" ||
    die "no fp16 banner line: $(grep '^fp16' "$W/dev.txt")"
grep -q '^  parameters .*(fp16)' "$W/dev.txt" || die "memory table: parameters not fp16"
grep -q '^  optimizer .*(m, v, master fp32)' "$W/dev.txt" || die "memory table: no master weights"
close_losses "$W/cpu/log.jsonl" "$W/dev/log.jsonl" 2e-4
# step 1's gradients (LLMC_DUMP_GRADS, unscaled): 6.2e-4 apart in norm here; fp16 tensors rounded
# through bf16's precision, a planted mistake, gave 4.4e-3 (the losses, averages, hardly show it)
close_weights "$W/cpu.grads.bin" "$W/dev.grads.bin" 2e-3 3e-3
[ "$(scales "$W/dev/log.jsonl")" = "$(scales "$W/cpu/log.jsonl")" ] ||
    die "loss scales: device $(scales "$W/dev/log.jsonl"), CPU $(scales "$W/cpu/log.jsonl")"
[ "$(skips "$W/dev/log.jsonl")" = "$(skips "$W/cpu/log.jsonl")" ] ||
    die "skipped steps: device $(skips "$W/dev/log.jsonl"), CPU $(skips "$W/cpu/log.jsonl")"
[ -n "$(skips "$W/dev/log.jsonl")" ] || die "no overflow in 10 steps: the scale never reached fp16's limit"
echo "  device vs CPU: same scales ($(scales "$W/dev/log.jsonl")), same skips ($(skips "$W/dev/log.jsonl"))"

# ---- (b) a forced overflow at step 5 ----
LLMC_FAULT=nan:grad_5 "$EMU" "$W/c.json" device=cuda "${ck[@]}" "out_dir=$W/nan" > "$W/nan.txt" 2>&1 ||
    die "forced overflow: $(tail -n 5 "$W/nan.txt")"
grep '"step":5,' "$W/nan/log.jsonl" | grep -q '"skipped":"overflow"' || die "step 5: $(grep '"step":5,' "$W/nan/log.jsonl")"
[ "$(scales "$W/nan/log.jsonl" | cut -d' ' -f5,6)" = "131072.0 65536.0" ] ||
    die "the scale did not halve after step 5: $(scales "$W/nan/log.jsonl")"
c="$W/nan/checkpoints"
cmp "$c/step_00000004/model.bin" "$c/step_00000005/model.bin" || die "step 5 changed the weights"
cmp <(tensors "$c/step_00000004/state.bin") <(tensors "$c/step_00000005/state.bin") || die "step 5 changed the optimizer state"
cmp -s "$c/step_00000005/model.bin" "$c/step_00000006/model.bin" && die "step 6 did not train"
echo "  forced overflow: step 5 skipped, weights and state unchanged, scale 131072 -> 65536"

# ---- (c) resume mid-window on the device ----
"$EMU" "$W/c.json" device=cuda "${ck[@]}" "checkpoint.resume=$W/dev/checkpoints/step_00000007" "out_dir=$W/res" \
    > "$W/res.txt" 2>&1 || die "resume: $(tail -n 5 "$W/res.txt")"
cmp "$W/dev/model_00000010.bin" "$W/res/model_00000010.bin" || die "the resumed run ends at other weights"
[ "$(losses "$W/res/log.jsonl")" = "$(losses "$W/dev/log.jsonl" | tail -n 3)" ] || die "resumed losses differ"
echo "  resumed from step 7: bit-identical weights and losses"

# ---- (d) dp=2 over MPI, one emulated device per rank ----
BIN=$EMU dp_run 2 "$W/c.json" device=cuda train.loss_scale_window=4 parallel.dp=2 train.grad_accum=1 \
    "out_dir=$W/dp2" > "$W/dp2.txt" 2>&1 || die "dp2: $(tail -n 5 "$W/dp2.txt")"
close_losses "$W/dev/log.jsonl" "$W/dp2/log.jsonl" 2e-4
[ "$(scales "$W/dp2/log.jsonl")" = "$(scales "$W/dev/log.jsonl")" ] || die "dp2 loss scales: $(scales "$W/dp2/log.jsonl")"
[ "$(skips "$W/dp2/log.jsonl")" = "$(skips "$W/dev/log.jsonl")" ] || die "dp2 skips: $(skips "$W/dp2/log.jsonl")"

# ---- (e) a CPU checkpoint resumed on the device ----
"$EMU" "$W/c.json" device=cuda "${ck[@]}" "checkpoint.resume=$W/cpu/checkpoints/step_00000005" "out_dir=$W/x" \
    > "$W/x.txt" 2>&1 || die "CPU checkpoint on the device: $(tail -n 5 "$W/x.txt")"
paste <(losses "$W/x/log.jsonl") <(losses "$W/cpu/log.jsonl" | tail -n 5) | awk '
    NF != 2 { bad++ } { d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $2) bad++ } END { exit bad > 0 || NR != 5 }' ||
    die "steps 6-10 on the device from the CPU's step 5: $(losses "$W/x/log.jsonl" | tr '\n' ' ')"
[ "$(scales "$W/x/log.jsonl")" = "$(scales "$W/cpu/log.jsonl" | cut -d' ' -f6-)" ] ||
    die "scales after the CPU checkpoint: $(scales "$W/x/log.jsonl")"
echo "  the CPU's step-5 checkpoint continues on the device as on the CPU"

# ---- (f) full recomputation: bitwise the plain run ----
"$EMU" "$W/c.json" device=cuda train.loss_scale_window=4 train.recompute=full "out_dir=$W/rc" > "$W/rc.txt" 2>&1 ||
    die "recompute: $(tail -n 5 "$W/rc.txt")"
cmp "$W/dev/model_00000010.bin" "$W/rc/model_00000010.bin" || die "full recomputation changed the weights"
echo PASS
