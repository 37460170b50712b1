# Context parallelism (parallel.cp, llmc/parallel/context_parallel.h): every sequence split over the cp
# ranks in the load-balanced causal order, attention as a ring. Each layout below must match one
# process with the same global batch like test_model_parallel.sh's: losses and validation losses
# to 1e-5, step-1 gradients and final weights to 1e-5 in norm (largest single difference 1e-4 of
# the largest value, as test_llama_layouts.sh explains); the samples (token ids drawn from the
# logits) are the same. GPT-2 (learned positions) and Llama (RoPE, grouped-query attention);
# cp 2 and 4, with dp, tp (with and without SP), pp, ZeRO and recompute; a checkpoint saved at
# cp 2 resumes at cp 1 and the reverse.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
gpt2='"model": { "n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 }'
llama='"model": { "arch": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn_dim": 48,
                  "vocab_size": 512, "max_seq_len": 32 }'
for fam in gpt2 llama; do
    cat > "$W/$fam.json" <<JSON
{ "device": "cpu", "precision": "fp32", ${!fam},
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 2, "steps": 10, "lr": 3e-3, "warmup_steps": 2,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 5, "batches": 2, "sample_every": 10, "sample_tokens": 12 },
  "out_dir": "$W/out" }
JSON
done

baseline() {  # baseline FAMILY: one process
    LLMC_DUMP_GRADS="$W/$1.grads.bin" "$BIN" "$W/$1.json" "out_dir=$W/$1" > "$W/$1.txt" 2>&1 ||
        die "one-process baseline $1 failed: $(tail -n 20 "$W/$1.txt")"
}
check() {  # check FAMILY NAME NPROC ARGS...: the layout's run matches the family's one-process run
    local fam=$1 name=$2 n=$3; shift 3
    local out="$W/$fam.$name"
    LLMC_DUMP_GRADS="$out.grads.bin" dp_run "$n" "$W/$fam.json" "$@" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "$fam $name failed: $(tail -n 20 "$out.txt")"
    echo "$fam $name ($*)"
    grep -q "context parallel: .* ranks" "$out.txt" || die "$fam $name: no context parallelism in the banner"
    close_run "$W/$fam" "$out" model_00000010.bin
    [ "$(samples "$W/$fam.txt")" = "$(samples "$out.txt")" ] && [ -n "$(samples "$out.txt")" ] ||
        die "$fam $name: samples differ: $(samples "$out.txt") vs $(samples "$W/$fam.txt")"
}
for fam in gpt2 llama; do
    baseline $fam
    check $fam cp2 2 parallel.cp=2
    check $fam cp4 4 parallel.cp=4
    check $fam dp2_cp2_zero1 4 parallel.dp=2 parallel.cp=2 train.grad_accum=1 eval.batches=1 parallel.zero=1
    check $fam cp2_tp2_sp 4 parallel.cp=2 parallel.tp=2 parallel.sequence_parallel=true
    check $fam cp2_pp2 4 parallel.cp=2 parallel.pp=2
done
# the ring merges its blocks in a fixed order: a second run is the same, bit for bit
dp_run 4 "$W/gpt2.json" parallel.cp=4 "out_dir=$W/gpt2.cp4_again" > "$W/gpt2.cp4_again.txt" 2>&1 || die "cp4 again failed"
cmp -s "$W/gpt2.cp4/model_00000010.bin" "$W/gpt2.cp4_again/model_00000010.bin" &&
    [ "$(losses "$W/gpt2.cp4/log.jsonl")" = "$(losses "$W/gpt2.cp4_again/log.jsonl")" ] ||
    die "two cp4 runs differ"
echo "gpt2 cp4 twice: bitwise the same"
check gpt2 cp2_tp2_recompute_full 4 parallel.cp=2 parallel.tp=2 train.recompute=full
check llama dp2_cp2_zero3_selective 4 parallel.dp=2 parallel.cp=2 train.grad_accum=1 eval.batches=1 parallel.zero=3 \
    train.recompute=selective
check llama dp2_cp2_tp2 8 parallel.dp=2 parallel.cp=2 parallel.tp=2 train.grad_accum=1 eval.batches=1

# layout-independent checkpoints: saved at cp 2, resumed at cp 1; saved at cp 1, resumed at cp 2
grep '"loss"' "$W/llama/log.jsonl" | tail -n 5 > "$W/base_tail.jsonl"
resume() {  # resume NAME SAVE_NPROC SAVE_ARGS -- RESUME_NPROC RESUME_ARGS
    local name=$1 n=$2; shift 2
    local save=() load=()
    while [ "$1" != "--" ]; do save+=("$1"); shift; done
    shift
    local m=$1; shift
    load=("$@")
    dp_run "$n" "$W/llama.json" "${save[@]}" checkpoint.every=5 "out_dir=$W/$name.ck" > "$W/$name.ck.txt" 2>&1 ||
        die "$name: the run that saves failed: $(tail -n 20 "$W/$name.ck.txt")"
    dp_run "$m" "$W/llama.json" "${load[@]}" "checkpoint.resume=$W/$name.ck/checkpoints/step_00000005" \
        "out_dir=$W/$name" > "$W/$name.txt" 2>&1 || die "$name: resume failed: $(tail -n 20 "$W/$name.txt")"
    grep -q 'resumed from .*step_00000005 at step 5' "$W/$name.txt" || die "$name did not resume"
    echo "$name"
    close_losses "$W/base_tail.jsonl" "$W/$name/log.jsonl"
    close_weights "$W/llama/model_00000010.bin" "$W/$name/model_00000010.bin" 1e-5 1e-4
}
resume cp2_to_cp1 2 parallel.cp=2 -- 1 parallel.cp=1
resume cp1_to_cp2 1 parallel.cp=1 -- 2 parallel.cp=2

# bad layouts: exit 2 naming the key
expect_fail 2 "parallel.cp" "$BIN" "$W/gpt2.json" parallel.cp=0 --plan
expect_fail 2 "parallel.cp: train.seq_len = 16 must be a multiple of 2 x parallel.cp = 6" \
    "$BIN" "$W/gpt2.json" parallel.cp=3 plan.world=3 --plan
expect_fail 2 "parallel.sequence_parallel: train.seq_len / parallel.cp = 8 must be a multiple of parallel.tp = 16" \
    "$BIN" "$W/gpt2.json" parallel.cp=2 parallel.tp=16 model.n_head=16 parallel.sequence_parallel=true plan.world=32 --plan
expect_fail 2 "parallel.dp \* parallel.cp \* parallel.tp \* parallel.pp = 1 x 2 x 1 x 1 = 2, but the job has 1 process" \
    "$BIN" "$W/gpt2.json" parallel.dp=1 parallel.cp=2
echo "context parallelism: all layouts match one process"
