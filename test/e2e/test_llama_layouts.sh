# Llama proves the model seam: the same generic parameter table, units, TP/SP collectives, pipeline
# engine and ZeRO stages train a second family. Each layout below runs 10 steps of a small Llama
# (grouped-query: 4 heads, 2 key/value heads; untied head; SwiGLU width 48) and must match one
# process with the same global batch like test_model_parallel.sh's GPT-2 layouts: losses and
# validation losses to 1e-5, step-1 gradients and final weights to 1e-5 in norm. The largest single
# difference may reach 1e-4 of the largest value: dp=2 alone, which changes nothing but the order
# in which micro-batch gradients are summed, already moves single gradients by 2e-5 of the largest
# here (tiny q/k gradients at init, a vocabulary of 512 rows with heavy cancellation); a wrong
# split, sync or reduction shows up as differences of order one. A tied-head variant runs through the
# pipeline's tied-embedding sync. A checkpoint saved at tp=2 x pp=2 resumes at dp=4.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
cat > "$W/c.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "arch": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn_dim": 48,
             "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 8, "steps": 10, "lr": 3e-3, "warmup_steps": 2,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 5, "batches": 2 },
  "out_dir": "$W/out" }
JSON
baseline() {  # baseline NAME ARGS...: one process
    local name=$1; shift
    LLMC_DUMP_GRADS="$W/$name.grads.bin" "$BIN" "$W/c.json" "$@" "out_dir=$W/$name" > "$W/$name.txt" 2>&1 ||
        die "one-process baseline $name failed: $(tail -n 20 "$W/$name.txt")"
}
baseline base
grep -q 'llama: 4 layers, 4 heads (2 kv), d_model 32, ffn 48' "$W/base.txt" || die "the run does not describe a Llama"
[ -s "$W/base/model_00000010.safetensors" ] && [ -s "$W/base/config.json" ] || die "no safetensors export"
grep -q '"num_key_value_heads": 2' "$W/base/config.json" || die "config.json lacks num_key_value_heads"

check() {  # check BASE NAME NPROC ARGS...: the layout's run matches the baseline BASE
    local base=$1 name=$2 n=$3; shift 3
    local out="$W/$name"
    LLMC_DUMP_GRADS="$out.grads.bin" dp_run "$n" "$W/c.json" "$@" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "$name failed: $(tail -n 20 "$out.txt")"
    echo "$name ($*)"
    close_weights "$W/$base.grads.bin" "$out.grads.bin" 1e-5 1e-4
    close_losses "$W/$base/log.jsonl" "$out/log.jsonl"
    close_val "$W/$base/log.jsonl" "$out/log.jsonl"
    close_weights "$W/$base/model_00000010.bin" "$out/model_00000010.bin" 1e-5 1e-4
}
check base tp2 2 parallel.tp=2
check base tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
check base pp2_gpipe 2 parallel.pp=2 parallel.pp_schedule=gpipe
check base pp2_interleaved 2 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
check base pp4_1f1b 4 parallel.pp=4 parallel.pp_schedule=1f1b
for z in 0 1 2 3; do check base "dp2_zero$z" 2 parallel.dp=2 train.grad_accum=4 eval.batches=1 parallel.zero=$z; done
dp2=(parallel.dp=2 parallel.tp=2 parallel.pp=2 train.grad_accum=4 eval.batches=1)
check base dp2_tp2_pp2_sp_zero1 8 "${dp2[@]}" parallel.zero=1 parallel.sequence_parallel=true
check base dp2_tp2_pp2_zero3 8 "${dp2[@]}" parallel.zero=3 parallel.pp_schedule=interleaved parallel.pp_virtual=2

# the tied head: the first and last pipeline stages keep their copies of the embedding in sync
baseline tied model.tie_embeddings=true
check tied tied_pp2 2 model.tie_embeddings=true parallel.pp=2
check tied tied_dp2_tp2_pp2_zero2 8 model.tie_embeddings=true "${dp2[@]}" parallel.zero=2

# layout-independent checkpoints: saved at tp=2 x pp=2, resumed at dp=4
dp_run 4 "$W/c.json" parallel.tp=2 parallel.pp=2 checkpoint.every=5 "out_dir=$W/ck" > "$W/ck.txt" ||
    die "tp=2 x pp=2 run with checkpoints failed"
grep '"loss"' "$W/base/log.jsonl" | tail -n 5 > "$W/base_tail.jsonl"
dp_run 4 "$W/c.json" parallel.dp=4 train.grad_accum=2 eval.batches=1 checkpoint.every=5 \
    "checkpoint.resume=$W/ck/checkpoints/step_00000005" "out_dir=$W/resumed" > "$W/resumed.txt" 2>&1 ||
    die "resume at dp=4 failed: $(tail -n 20 "$W/resumed.txt")"
grep -q 'resumed from .*step_00000005 at step 5' "$W/resumed.txt" || die "dp=4 did not resume"
close_losses "$W/base_tail.jsonl" "$W/resumed/log.jsonl"
close_weights "$W/base/model_00000010.bin" "$W/resumed/model_00000010.bin" 1e-5 1e-4

# the final safetensors start a new run from exactly the trained weights: one step at lr 1e-30 (far
# below half an ulp of any weight) writes them back unchanged, bit for bit, in llm.c's format
"$BIN" "$W/c.json" "model.init=$W/base/model_00000010.safetensors" train.steps=1 train.lr=1e-30 train.warmup_steps=0 \
    eval.every=0 "out_dir=$W/from_st" > "$W/from_st.txt" 2>&1 ||
    die "model.init from the exported safetensors failed: $(tail "$W/from_st.txt")"
cmp -s "$W/base/model_00000010.bin" "$W/from_st/model_00000001.bin" ||
    die "the exported safetensors did not load back to the same weights"
# tp=3: 6 heads, 3 key/value heads, a vocabulary of 1003 padded to 1152 in memory (1024 in files)
tp3=(model.n_head=6 model.n_kv_head=3 model.d_model=48 model.vocab_size=1003)
baseline base3 "${tp3[@]}"
check base3 tp3 3 "${tp3[@]}" parallel.tp=3
cmp -s <(head -c 1024 "$W/base3/model_00000010.safetensors") <(head -c 1024 "$W/tp3/model_00000010.safetensors") ||
    die "tp=3 exported safetensors differ in their header from one process's"
# layouts the shape cannot take are refused before any work, naming the key
rc=0
dp_run 4 "$W/c.json" parallel.tp=4 "out_dir=$W/bad" > /dev/null 2> "$W/err.txt" || rc=$?
[ $rc -eq 2 ] && grep -q 'parallel.tp: 4 does not divide model.n_kv_head = 2' "$W/err.txt" ||
    die "expected exit 2 naming model.n_kv_head for tp=4: rc=$rc $(cat "$W/err.txt")"
echo "all Llama layouts match one process"
