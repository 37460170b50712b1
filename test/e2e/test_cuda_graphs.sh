# train.cuda_graphs (llmc/cuda/step_graph.cuh) on the trainer over CudaOps compiled for the CUDA
# emulator of CI (build/train_gpt_emu; the emulator records a captured stream's work and refuses
# what a capture may not hold: a synchronization, an allocation, a copy from pageable memory):
#  (a) bf16, grad_accum 2, warmup and cosine lr, validation and a checkpoint between steps: step 1
#      warms up (it allocates), step 2 is clean, step 3 is captured, later steps replay; losses,
#      final weights and checkpoints equal the run without graphs bit for bit (the lr, step and
#      seeds reach the graph's AdamW through uploads, each step its own); the same launches a step
#      counted, one host wait in a replayed step, no device allocation after step 1 (allocs);
#  (b) fp16 with the dynamic loss scale and a forced overflow at step 5 (LLMC_FAULT): a changed
#      loss seed drops the graph (steps 5 and 6 warm up: the NaN seed, then the halved scale's),
#      step 7 captures a new one; bitwise the run without graphs;
#  (c) the full recompute (another region) and the llama family, bitwise;
#  (d) fp8, delayed and current scaling: the scales advance on the device (Fp8Device), so the
#      step is all device work: replays, bitwise the run without graphs, one host wait a step;
#  (e) refusals, exit 2 naming the key: device cpu, two processes, optimizer offload.
# The speed of a graph is a GPU's to measure (scripts/gpu_quick.sh's 124M rows with and without).
source "$(dirname "$0")/lib.sh"
emu_tiny_config "$W/c.json" bf16
modes() { grep -o '"cuda_graph":"[a-z-]*' "$1" | cut -d'"' -f4 | tr '\n' ' '; }
# same RUN_A RUN_B: equal losses, final weights and checkpoints (weights, optimizer state; the
# header holds the config's digest)
same() {
    cmp <(losses "$1/log.jsonl") <(losses "$2/log.jsonl") || die "losses differ: $1 vs $2"
    cmp "$1/model_00000010.bin" "$2/model_00000010.bin" || die "final weights differ: $1 vs $2"
    for s in "$1"/checkpoints/step_*; do
        cmp "$s/model.bin" "$2/checkpoints/$(basename "$s")/model.bin" || die "checkpoint $(basename "$s"): weights"
        cmp <(tensors "$s/state.bin") <(tensors "$2/checkpoints/$(basename "$s")/state.bin") ||
            die "checkpoint $(basename "$s"): optimizer state"
    done
}
run() {  # DIR ARGS...: a device run into $W/DIR
    local d=$1
    shift
    "$EMU" "$W/c.json" device=cuda out.format=llmc eval.every=4 checkpoint.every=4 "out_dir=$W/$d" "$@" \
        > "$W/$d.txt" 2>&1 || die "$d: $(tail -n 5 "$W/$d.txt")"
}

# ---- (a) bf16 ----
run plain
run graphs train.cuda_graphs=true
[ "$(modes "$W/graphs/log.jsonl")" = "warm-up warm-up capture replay replay replay replay replay replay replay " ] ||
    die "graph modes: $(modes "$W/graphs/log.jsonl")"
[ -z "$(modes "$W/plain/log.jsonl")" ] || die "a run without graphs logged cuda_graph"
grep -q '^cuda graphs: after a clean warm-up step' "$W/graphs.txt" || die "no cuda graphs banner line"
grep -q '^cuda graphs' "$W/plain.txt" && die "a run without graphs printed the cuda graphs line"
same "$W/plain" "$W/graphs"
# the step counters: the same kernels (a replayed step counts those its graph ran), one host wait
# (the read back) in a replayed step
field() { grep -o "\"$2\":[0-9]*" "$1" | cut -d: -f2 | tr '\n' ' '; }
[ "$(field "$W/graphs/log.jsonl" launches)" = "$(field "$W/plain/log.jsonl" launches)" ] ||
    die "launches: graphs $(field "$W/graphs/log.jsonl" launches), plain $(field "$W/plain/log.jsonl" launches)"
[ "$(field "$W/graphs/log.jsonl" host_syncs | cut -d' ' -f4-10)" = "1 1 1 1 1 1 1" ] ||
    die "host_syncs of the replayed steps: $(field "$W/graphs/log.jsonl" host_syncs)"
# no device allocation or free after the first step (validation and checkpoints between steps
# included), as the graph's pointers need
[ "$(field "$W/graphs/log.jsonl" allocs | cut -d' ' -f2-10)" = "0 0 0 0 0 0 0 0 0" ] ||
    die "allocs after step 1: $(field "$W/graphs/log.jsonl" allocs)"
# enqueue_ms: from the step's start to its read back, within the step's ms
paste <(grep -o '"enqueue_ms":[0-9.e+-]*' "$W/graphs/log.jsonl" | cut -d: -f2) \
      <(grep -o '"ms":[0-9.e+-]*' "$W/graphs/log.jsonl" | cut -d: -f2) |
    awk '{ n++; if (!($1 > 0 && $1 <= $2)) bad++ } END { exit n == 10 && !bad ? 0 : 1 }' ||
    die "enqueue_ms not in (0, ms] in every step: $(grep -o '"enqueue_ms":[0-9.e+-]*' "$W/graphs/log.jsonl" | tr '\n' ' ')"
echo "  bf16: $(modes "$W/graphs/log.jsonl")| bitwise the run without graphs; launches $(field "$W/graphs/log.jsonl" launches | cut -d' ' -f4) a step in both"

# ---- (b) fp16, dynamic loss scale, a forced overflow at step 5 ----
f16=(precision=fp16)
run f16_plain "${f16[@]}"
LLMC_FAULT=nan:grad_5 run f16_nan_plain "${f16[@]}"
run f16_graphs "${f16[@]}" train.cuda_graphs=true
LLMC_FAULT=nan:grad_5 run f16_nan_graphs "${f16[@]}" train.cuda_graphs=true
same "$W/f16_plain" "$W/f16_graphs"
same "$W/f16_nan_plain" "$W/f16_nan_graphs"
[ "$(scales "$W/f16_graphs/log.jsonl")" = "$(scales "$W/f16_plain/log.jsonl")" ] || die "fp16 scales differ"
grep '"step":5,' "$W/f16_nan_graphs/log.jsonl" | grep -q '"skipped":"overflow"' || die "step 5 not skipped"
# step 5's loss seed is NaN (a new key: warm-up), step 6's the halved scale's (warm-up), then a new graph
m=$(modes "$W/f16_nan_graphs/log.jsonl")
[ "$m" = "warm-up warm-up capture replay warm-up warm-up capture replay replay replay " ] || die "fp16 modes: $m"
echo "  fp16: scales $(scales "$W/f16_graphs/log.jsonl")| with the overflow at step 5: $m| bitwise"

# ---- (c) full recompute; llama ----
run rc_plain train.recompute=full
run rc_graphs train.recompute=full train.cuda_graphs=true
same "$W/rc_plain" "$W/rc_graphs"
run ll_plain model.arch=llama
run ll_graphs model.arch=llama train.cuda_graphs=true
same "$W/ll_plain" "$W/ll_graphs"
grep -q replay <<< "$(modes "$W/ll_graphs/log.jsonl")" || die "llama: no replay: $(modes "$W/ll_graphs/log.jsonl")"
echo "  full recompute, llama: bitwise the runs without graphs"

# ---- (d) fp8 ----
for recipe in delayed current; do
    run f8_${recipe}_plain precision=fp8 fp8.recipe=$recipe
    run f8_${recipe}_graphs precision=fp8 fp8.recipe=$recipe train.cuda_graphs=true
    same "$W/f8_${recipe}_plain" "$W/f8_${recipe}_graphs"
    m=$(modes "$W/f8_${recipe}_graphs/log.jsonl")
    [ "$m" = "warm-up warm-up capture replay replay replay replay replay replay replay " ] || die "fp8 $recipe modes: $m"
    [ "$(field "$W/f8_${recipe}_graphs/log.jsonl" host_syncs | cut -d' ' -f4-10)" = "1 1 1 1 1 1 1" ] ||
        die "fp8 $recipe: host_syncs of the replayed steps: $(field "$W/f8_${recipe}_graphs/log.jsonl" host_syncs)"
done
# (the losses of fp8 are not bf16's: the linears ran in fp8)
cmp -s <(losses "$W/plain/log.jsonl") <(losses "$W/f8_delayed_plain/log.jsonl") && die "fp8 losses equal bf16's"
echo "  fp8 delayed and current: $(modes "$W/f8_delayed_graphs/log.jsonl")| bitwise the runs without graphs"

# ---- (e) refusals ----
expect_fail 2 'train.cuda_graphs: true is not available here: device "cpu"' "$BIN" "$W/c.json" train.cuda_graphs=true
expect_fail 2 'train.cuda_graphs: .*train.offload_optimizer' "$EMU" "$W/c.json" device=cuda train.cuda_graphs=true \
    train.offload_optimizer=true
expect_fail 2 'train.cuda_graphs: true needs one process \(this job has 2' timeout 120 mpirun --oversubscribe -np 2 \
    "$EMU" "$W/c.json" device=cuda train.cuda_graphs=true parallel.dp=2 "out_dir=$W/dp2"
echo "  refusals: device cpu, optimizer offload, two processes (exit 2)"
echo PASS
