# Mixture of experts (model.moe) in the layouts that need no expert parallelism: ZeRO-1 and
# ZeRO-3 over dp=2, a 2-stage pipeline (alone and with dp=2), tensor parallelism (the experts
# split like the MLP, the router replicated; with and without sequence parallelism) equal one process with the same
# global batch: losses (which include the load-balancing term) and validation losses to 1e-5,
# step-1 gradients and final weights to 1e-5 in norm (as test_llama_layouts.sh), and the MoE
# statistics of every step agree: the same load-balancing loss, the same expert loads and the
# same fraction of (token, slot) pairs dropped past capacity (capacity is per micro-batch, and
# every layout runs the same micro-batches). Recomputation (selective, full) too. A GPT-2 with MoE in layers 1 and 3 (every 2) and a
# Llama with MoE in every layer. Context parallelism (cp2, dp2 x cp2 ZeRO-1, cp2 x tp2 with SP, cp2
# with full recompute; with capacity and dropless): the cp ranks decide capacity over the whole
# micro-batch, so they drop exactly the pairs one process drops (the logged fraction is the same to
# the last digit), and sample the same tokens. Then the refusals (an expert width tp does not
# divide, fp8, bad keys). Expert parallelism, with cp too: test_ep_layouts.sh.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
config() {  # config FILE ARCH_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { $2, "n_layer": 4, "n_head": 2, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 6, "lr": 3e-3, "warmup_steps": 2,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 3, "batches": 2 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" '"arch": "gpt2", "moe": { "num_experts": 4, "top_k": 2, "expert_ffn_dim": 48, "every": 2,
    "aux_loss_coef": 0.05, "capacity_factor": 1.0 }'
config "$W/llama.json" '"arch": "llama", "ffn_dim": 48, "moe": { "num_experts": 3, "top_k": 2, "every": 1,
    "aux_loss_coef": 0.02, "capacity_factor": 0.8 }'

baseline() {  # baseline CONFIG NAME ARGS...
    local c=$1 name=$2; shift 2
    LLMC_DUMP_GRADS="$W/$name.grads.bin" OMP_NUM_THREADS=1 "$BIN" "$c" "$@" "out_dir=$W/$name" > "$W/$name.txt" 2>&1 ||
        die "one-process baseline $name failed: $(tail -n 20 "$W/$name.txt")"
    grep -q 'moe aux .* load .* dropped' "$W/$name.txt" || die "$name: no MoE statistics on the step line"
    grep -q '^mixture of experts: .* experts, top-2' "$W/$name.txt" || die "$name: the banner does not describe the MoE"
}
check() {  # check CONFIG BASE NAME NPROC ARGS...
    local c=$1 base=$2 name=$3 n=$4; shift 4
    local out="$W/$name"
    LLMC_DUMP_GRADS="$out.grads.bin" dp_run "$n" "$c" "$@" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "$name failed: $(tail -n 20 "$out.txt")"
    echo "$name ($*)"
    close_run "$W/$base" "$out" model_00000006.bin
    close_moe "$W/$base/log.jsonl" "$out/log.jsonl"
}
smp=(eval.sample_every=6 eval.sample_tokens=12)  # samples of the one-process runs, compared with cp's
for arch in gpt2 llama; do
    baseline "$W/$arch.json" "${arch}_base" "${smp[@]}"
    # capacity drops happen (capacity_factor < top_k's share), and are logged
    moe_stats "$W/${arch}_base/log.jsonl" | awk '$4 > 0 { d++ } END { exit !(d > 0) }' ||
        die "$arch: no (token, slot) pair was dropped; the capacity path is not exercised"
    check "$W/$arch.json" "${arch}_base" "${arch}_dp2_zero1" 2 parallel.dp=2 train.grad_accum=2 eval.batches=1 parallel.zero=1
    check "$W/$arch.json" "${arch}_base" "${arch}_pp2" 2 parallel.pp=2
    check "$W/$arch.json" "${arch}_base" "${arch}_tp2" 2 parallel.tp=2
done
check "$W/gpt2.json" gpt2_base gpt2_tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
# context parallelism: each sequence split over the cp ranks, capacity over the whole micro-batch
drops() { grep -o '"moe_dropped":[^,}]*' "$1" | cut -d: -f2; }
check_cp() {  # check_cp CONFIG BASE NAME NPROC ARGS...: check, the same pairs dropped exactly, the same samples
    check "$@" "${smp[@]}"
    grep -q "context parallel: .* ranks" "$W/$3.txt" || die "$3: no context parallelism in the banner"
    [ "$(drops "$W/$2/log.jsonl")" = "$(drops "$W/$3/log.jsonl")" ] || die "$3: the drops differ from $2's"
    # sampling pads its window to the cp split; the padding takes no capacity (Model::set_valid_tokens)
    [ -n "$(samples "$W/$3.txt")" ] && [ "$(samples "$W/$2.txt")" = "$(samples "$W/$3.txt")" ] ||
        die "$3: samples differ: $(samples "$W/$3.txt") vs $(samples "$W/$2.txt")"
}
for arch in gpt2 llama; do
    check_cp "$W/$arch.json" "${arch}_base" "${arch}_cp2" 2 parallel.cp=2
    check_cp "$W/$arch.json" "${arch}_base" "${arch}_dp2_cp2_zero1" 4 parallel.dp=2 parallel.cp=2 train.grad_accum=2 \
        eval.batches=1 parallel.zero=1
done
check_cp "$W/gpt2.json" gpt2_base gpt2_cp2_tp2_sp 4 parallel.cp=2 parallel.tp=2 parallel.sequence_parallel=true
check_cp "$W/llama.json" llama_base llama_cp2_full 2 parallel.cp=2 train.recompute=full
baseline "$W/llama.json" llama_dropless model.moe.capacity_factor=0 "${smp[@]}"
moe_stats "$W/llama_dropless/log.jsonl" | awk '$4 != 0 { d++ } END { exit d > 0 }' || die "llama_dropless: pairs dropped"
check_cp "$W/llama.json" llama_dropless llama_dropless_cp2 2 parallel.cp=2 model.moe.capacity_factor=0
check "$W/llama.json" llama_base llama_pp2_selective 2 parallel.pp=2 train.recompute=selective
check "$W/gpt2.json" gpt2_base gpt2_dp2_full 2 parallel.dp=2 train.grad_accum=2 eval.batches=1 train.recompute=full
check "$W/llama.json" llama_base llama_full 1 train.recompute=full
check "$W/gpt2.json" gpt2_base gpt2_dp2_zero3 2 parallel.dp=2 train.grad_accum=2 eval.batches=1 parallel.zero=3
check "$W/llama.json" llama_base llama_dp2_pp2_zero2 4 parallel.dp=2 parallel.pp=2 train.grad_accum=2 eval.batches=1 \
    parallel.zero=2

# the Llama with MoE in every layer exports as transformers' MixtralForCausalLM
jq -e '.architectures == ["MixtralForCausalLM"] and .num_local_experts == 3 and .num_experts_per_tok == 2' \
    "$W/llama_base/config.json" > /dev/null || die "config.json does not describe a Mixtral: $(cat "$W/llama_base/config.json")"
# layout-independent checkpoints: saved at pp=2, resumed at dp=2
dp_run 2 "$W/gpt2.json" parallel.pp=2 checkpoint.every=3 "out_dir=$W/ck" > "$W/ck.txt" 2>&1 ||
    die "pp=2 run with checkpoints failed: $(tail "$W/ck.txt")"
dp_run 2 "$W/gpt2.json" parallel.dp=2 train.grad_accum=2 eval.batches=1 "checkpoint.resume=$W/ck/checkpoints/step_00000003" \
    "out_dir=$W/resumed" > "$W/resumed.txt" 2>&1 || die "resume at dp=2 failed: $(tail -n 20 "$W/resumed.txt")"
grep -q 'resumed from .*step_00000003 at step 3' "$W/resumed.txt" || die "dp=2 did not resume"
grep '"loss"' "$W/gpt2_base/log.jsonl" | tail -n 3 > "$W/base_tail.jsonl"
close_losses "$W/base_tail.jsonl" "$W/resumed/log.jsonl"
close_weights "$W/gpt2_base/model_00000006.bin" "$W/resumed/model_00000006.bin" 1e-5 1e-4

# refusals: clear messages naming the key, exit 2
expect_fail 2 'parallel.tp: 4 does not divide model.moe.expert_ffn_dim = 6' dp_run 4 "$W/gpt2.json" parallel.tp=4 \
    model.n_head=4 model.moe.expert_ffn_dim=6 "out_dir=$W/x"
expect_fail 2 'precision: fp8 with model.moe' "$BIN" "$W/gpt2.json" precision=fp8 "out_dir=$W/x"
expect_fail 2 'model.moe.top_k: 5 exceeds model.moe.num_experts = 4' "$BIN" "$W/gpt2.json" model.moe.top_k=5 "out_dir=$W/x"
expect_fail 2 'model.moe.num_experts: 1' "$BIN" "$W/gpt2.json" model.moe.num_experts=1 "out_dir=$W/x"
expect_fail 2 'model.moe.num_experts\?' "$BIN" "$W/gpt2.json" model.moe.num_expert=4 "out_dir=$W/x"
expect_fail 2 'model.moe: is a section.*num_experts' "$BIN" "$W/gpt2.json" model.moe=4 "out_dir=$W/x"
echo "PASS: test_moe_layouts"
