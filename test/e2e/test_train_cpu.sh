# A short CPU training run on a generated shard: the loss falls, every record has its keys, step
# lines show tokens and an ETA, a summary ends the run, the final weights are written in llm.c's
# and transformers' formats (out.format) and both reload, a second run is bit-identical, and a CPU
# run of the CUDA build loads no cuBLASLt.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"
"$BIN" "$W/c.json" train.steps=30 eval.every=10 eval.batches=2 eval.sample_every=15 eval.sample_tokens=8 > "$W/run1.txt"
log="$W/out/log.jsonl"
[ "$(losses "$log" | wc -l)" -eq 30 ] || die "expected 30 loss records"
first=$(losses "$log" | head -n1); last=$(losses "$log" | tail -n1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || die "loss did not fall by 1.0: $first -> $last"
for k in step loss lr grad_norm ms enqueue_ms comm_ms compute_ms tok_per_s tokens; do grep -q "\"$k\":" "$log" || die "log.jsonl lacks $k"; done
[ "$(grep -c '"val_loss"' "$log")" -ge 3 ] || die "expected val_loss at steps 0, 10, 20, 30"
grep -q 'sample' "$W/run1.txt" || die "no text sample printed"
grep -q 'parameters' "$W/run1.txt" || die "no memory table printed"
# 64 tokens per step (2 x 16 x 2): step 30 has seen 1920 tokens; the last step has nothing left
grep -Eq '^step +30/30 \|.* \| 1.92K tok \| ETA 0s$' "$W/run1.txt" || die "step line without tokens and ETA: $(grep '^step  *30/' "$W/run1.txt")"
grep -Eq '^step +2/30 \|.* tok \| ETA [0-9]+s$' "$W/run1.txt" || die "step 2 has no ETA"
grep -Eq '^done: 30 steps, 1.92K tokens, wall time [0-9]+s, mean [0-9]+ tok/s, best val loss [0-9.]+ \(step [0-9]+\)$' \
    "$W/run1.txt" || die "no summary line: $(grep '^done' "$W/run1.txt")"
grep -qx "weights: $W/out/model_00000030.bin" "$W/run1.txt" || die "the summary does not name the .bin"
grep -qx "weights: $W/out/model_00000030.safetensors (transformers; $W/out/config.json)" "$W/run1.txt" ||
    die "the summary does not name the .safetensors"
grep -qx "checkpoints: none written by this run (in $W/out/checkpoints)" "$W/run1.txt" || die "summary: checkpoints"
grep -q '"architectures": \[' "$W/out/config.json" && grep -q '"GPT2LMHeadModel"' "$W/out/config.json" ||
    die "config.json is not a GPT2LMHeadModel config"
f="$W/out/model_00000030.bin"
[ -f "$f" ] || die "final model not written"
# header: magic 20240326, version 3
[ "$(od -An -t d4 -N 8 "$f" | tr -s ' ')" = " 20240326 3" ] || die "bad model header: $(od -An -t d4 -N 8 "$f")"
# the written model loads as init and gives the final step's weights: loss at step 1 of a new run
# equals the val loss evaluated on it, so just check it runs and starts below the first run's start
"$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 "model.init=$f" "out_dir=$W/out2" > /dev/null
l2=$(losses "$W/out2/log.jsonl")
awk -v a="$first" -v b="$l2" 'BEGIN { exit !(b < a - 1.0) }' || die "reloaded model does not carry the training: $l2"
# the safetensors export starts a new run from exactly the trained weights (one step at lr 1e-30
# changes nothing in fp32): its .bin equals the first run's
"$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 train.lr=1e-30 "model.init=$W/out/model_00000030.safetensors" \
    "out_dir=$W/from_st" out.format=llmc > "$W/from_st.txt" || die "model.init from the safetensors: $(tail -3 "$W/from_st.txt")"
cmp -s "$f" "$W/from_st/model_00000001.bin" || die "the exported safetensors did not load back to the same weights"
[ ! -e "$W/from_st/model_00000001.safetensors" ] && [ ! -e "$W/from_st/config.json" ] || die "out.format=llmc wrote safetensors"
"$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 "out_dir=$W/hf_only" out.format=hf > /dev/null
[ -s "$W/hf_only/model_00000001.safetensors" ] && [ -s "$W/hf_only/config.json" ] && [ ! -e "$W/hf_only/model_00000001.bin" ] ||
    die "out.format=hf: expected the .safetensors and config.json only"
# out.format none (benchmarks): no final weights, no summary line naming them; checkpoints as usual
"$BIN" "$W/c.json" train.steps=2 train.warmup_steps=0 "out_dir=$W/none" out.format=none checkpoint.every=0 > "$W/none.txt" ||
    die "out.format=none: $(tail -3 "$W/none.txt")"
[ -z "$(ls "$W/none" | grep -E '^model_|^config.json$')" ] && ! grep -q '^weights:' "$W/none.txt" ||
    die "out.format=none wrote or named final weights: $(ls "$W/none")"
"$BIN" "$W/c.json" train.steps=2 train.warmup_steps=0 "out_dir=$W/none_ck" "checkpoint.dir=$W/none_ck/ck" out.format=none \
    checkpoint.every=1 > /dev/null || die "out.format=none with checkpoints failed"
ls "$W/none_ck/ck" | grep -q . || die "out.format=none with checkpoint.every=1 wrote no checkpoint"
expect_fail 2 'out\.format' "$BIN" "$W/c.json" out.format=onnx
# determinism: the same config gives bitwise the same losses
"$BIN" "$W/c.json" train.steps=30 "out_dir=$W/out3" > /dev/null
diff <(losses "$log") <(losses "$W/out3/log.jsonl") || die "two identical runs differ"
# A CPU run loads no cuBLASLt (the CUDA build loads it on the first GEMM on a GPU, llmc/cuda/common.cuh's
# lt(): linked, its constructors cost every process of a run ~0.5 s of CPU, every rank and --plan too)
LD_DEBUG=files "$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 "out_dir=$W/out4" > /dev/null 2> "$W/ld.txt" || die "one-step run failed"
grep -q 'libcublasLt' "$W/ld.txt" && die "a CPU run loaded cuBLASLt: $(grep -m1 'libcublasLt' "$W/ld.txt")"
grep -q 'file=libgomp' "$W/ld.txt" || die "LD_DEBUG=files shows no library loads (the check above proves nothing)"
