# Expert parallelism (parallel.ep): each MoE layer's experts split over ep consecutive dp ranks,
# the routed rows moved to their experts by all-to-all and back. Routing and capacity stay
# per micro-batch and rank, so every layout equals one process with the same global batch (the
# same micro-batches, as test_moe_layouts.sh): dp4 x ep2, dp4 x ep4 (ZeRO-1 and 3), dp2 x ep2 x tp2 (ZeRO-1),
# dp4 x ep4 x tp2 (ZeRO-1), dp2 x ep2 x pp2 (ZeRO-2), dp4 x ep4 x pp2, dp4 x ep2 under ZeRO-3, dp2 x ep2
# with full recomputation, and with context parallelism (ep splitting dp x cp) cp2 x ep2, dp2 x cp2 x ep4
# (ZeRO-3) and dp2 x cp2 x ep2 (ZeRO-1), on a GPT-2 with MoE in layers 1 and 3 and a
# Llama with MoE in every layer: losses, validation losses and the MoE statistics (dropped
# fraction included: capacity_factor is below top_k's share) to 1e-5, step-1 gradients (whole
# experts, assembled over the ep ranks) and final weights to 1e-5 in norm; also dropless at ep 4. Checkpoints hold whole
# experts and whole optimizer state: saved at ep 4 (ZeRO-1 and ZeRO-3) resumed at ep 1 and at
# dp4 x ep2 ZeRO-3, saved at ep 1 resumed at ep 2 (ZeRO-0, 1, 3) and at cp2 x ep2, saved at dp2 x cp2 x ep4
# ZeRO-3 resumed on one process, all equal the uninterrupted
# run. Samples equal one process's. ZeRO's optimizer bytes per rank under ep (the dense state
# sharded over all of dp) by hand, and offload under ep bitwise. The planner's memory table
# equals the allocation of every layout. Then the refusals.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
config() {  # config FILE ARCH_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { $2, "n_layer": 4, "n_head": 2, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 4, "lr": 3e-3, "warmup_steps": 1,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 2, "batches": 4, "sample_every": 4, "sample_tokens": 6 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" '"arch": "gpt2", "moe": { "num_experts": 4, "top_k": 2, "expert_ffn_dim": 48, "every": 2,
    "aux_loss_coef": 0.05, "capacity_factor": 1.0 }'
config "$W/llama.json" '"arch": "llama", "ffn_dim": 48, "moe": { "num_experts": 4, "top_k": 2, "every": 1,
    "aux_loss_coef": 0.02, "capacity_factor": 0.8 }'
dp4=(parallel.dp=4 train.grad_accum=1 eval.batches=1)
dp2=(parallel.dp=2 train.grad_accum=2 eval.batches=2)

baseline() {  # baseline CONFIG NAME ARGS...
    local c=$1 name=$2; shift 2
    LLMC_DUMP_GRADS="$W/$name.grads.bin" "$BIN" "$c" "$@" "out_dir=$W/$name" > "$W/$name.txt" 2>&1 ||
        die "one-process baseline $name failed: $(tail -n 20 "$W/$name.txt")"
    grep -q 'step 4 | sample' "$W/$name.txt" || die "$name: no sample"
    # capacity drops happen (capacity_factor < top_k's share), and are logged
    moe_stats "$W/$name/log.jsonl" | awk '$4 > 0 { d++ } END { exit !(d > 0) }' ||
        die "$name: no (token, slot) pair was dropped; the capacity path is not exercised"
}
check() {  # check CONFIG BASE NAME NPROC ARGS...
    local c=$1 base=$2 name=$3 n=$4; shift 4
    local out="$W/$name"
    LLMC_DUMP_GRADS="$out.grads.bin" dp_run "$n" "$c" "$@" "out_dir=$out" > "$out.txt" 2>&1 ||
        die "$name failed: $(tail -n 20 "$out.txt")"
    echo "$name ($*)"
    grep -q "(ep [24])" "$out.txt" || die "$name: the banner does not name expert parallelism"
    close_run "$W/$base" "$out" model_00000004.bin
    close_moe "$W/$base/log.jsonl" "$out/log.jsonl" 4
    # every rank samples (the MoE layers' all-to-all), the same tokens as one process
    [ "$(grep 'sample' "$out.txt")" = "$(grep 'sample' "$W/$base.txt")" ] || die "$name: the samples differ"
    # the planner's memory table is the allocation (each (pp, tp) position: the largest of its ep
    # and expert-dp ranks, whose ZeRO optimizers differ)
    [ "$(jq -cS .memory <("$BIN" "$c" "$@" --plan=json))" = "$(head -n 1 "$out/log.jsonl" | jq -cS .memory)" ] ||
        die "$name: the plan $(jq -cS .memory <("$BIN" "$c" "$@" --plan=json)) differs from the run's allocation"
}
baseline "$W/gpt2.json" gpt2_base checkpoint.every=2
baseline "$W/llama.json" llama_base
check "$W/gpt2.json" gpt2_base gpt2_dp4_ep2 4 "${dp4[@]}" parallel.ep=2
check "$W/gpt2.json" gpt2_base gpt2_dp4_ep4_zero1 4 "${dp4[@]}" parallel.ep=4 parallel.zero=1 checkpoint.every=2
# (small buckets: the dense parts and their gradients cross the ep group in many pieces)
check "$W/gpt2.json" gpt2_base gpt2_dp4_ep4_zero3 4 "${dp4[@]}" parallel.ep=4 parallel.zero=3 checkpoint.every=2 \
    parallel.bucket_mb=0.01
check "$W/gpt2.json" gpt2_base gpt2_dp2_ep2_tp2_zero1 4 "${dp2[@]}" parallel.ep=2 parallel.tp=2 parallel.zero=1
check "$W/gpt2.json" gpt2_base gpt2_dp4_ep4_tp2_zero1 8 "${dp4[@]}" parallel.ep=4 parallel.tp=2 parallel.zero=1
check "$W/llama.json" llama_base llama_dp4_ep4 4 "${dp4[@]}" parallel.ep=4
check "$W/llama.json" llama_base llama_dp2_ep2_pp2_zero2 4 "${dp2[@]}" parallel.ep=2 parallel.pp=2 parallel.zero=2
check "$W/llama.json" llama_base llama_dp4_ep4_pp2 8 "${dp4[@]}" parallel.ep=4 parallel.pp=2
check "$W/llama.json" llama_base llama_dp4_ep2_zero3 4 "${dp4[@]}" parallel.ep=2 parallel.zero=3
check "$W/llama.json" llama_base llama_dp2_ep2_full 2 "${dp2[@]}" parallel.ep=2 train.recompute=full
grep -q '^expert parallel: 2 ranks, 2 of the 4 experts of each MoE layer each' "$W/llama_dp2_ep2_full.txt" ||
    die "the banner does not describe expert parallelism"
# with context parallelism ep splits the dp x cp ranks: the cp pair of one sequence (cp2 x ep2),
# every rank of dp2 x cp2 (ep4, ZeRO-3), the cp pairs of two dp ranks (ep2, ZeRO-1); the cp ranks
# make the micro-batch's plan together (capacity over its tokens), then trade the kept rows
check "$W/gpt2.json" gpt2_base gpt2_cp2_ep2 2 parallel.dp=1 parallel.cp=2 parallel.ep=2
check "$W/gpt2.json" gpt2_base gpt2_dp2_cp2_ep4_zero3 4 "${dp2[@]}" parallel.cp=2 parallel.ep=4 parallel.zero=3 \
    checkpoint.every=2
check "$W/llama.json" llama_base llama_dp2_cp2_ep2_zero1 4 "${dp2[@]}" parallel.cp=2 parallel.ep=2 parallel.zero=1
# dropless (capacity_factor 0): an owner may receive every pair of every rank of its group
LLMC_DUMP_GRADS="$W/dropless_base.grads.bin" "$BIN" "$W/gpt2.json" model.moe.capacity_factor=0 "out_dir=$W/dropless_base" \
    > "$W/dropless_base.txt" 2>&1 || die "dropless baseline failed: $(tail -n 20 "$W/dropless_base.txt")"
check "$W/gpt2.json" dropless_base gpt2_dropless_dp4_ep4 4 "${dp4[@]}" parallel.ep=4 model.moe.capacity_factor=0

# whole experts in the checkpoints: saved at ep 4 resumed at ep 1, saved at ep 1 resumed at ep 2
grep '"loss"' "$W/gpt2_base/log.jsonl" | tail -n 2 > "$W/base_tail.jsonl"
resume() {  # resume NAME FROM NPROC ARGS...
    local name=$1 from=$2 n=$3; shift 3
    dp_run "$n" "$W/gpt2.json" "$@" "checkpoint.resume=$W/$from/checkpoints/step_00000002" "out_dir=$W/$name" \
        > "$W/$name.txt" 2>&1 || die "$name failed: $(tail -n 20 "$W/$name.txt")"
    grep -q 'resumed from .*step_00000002 at step 2' "$W/$name.txt" || die "$name did not resume"
    echo "$name"
    close_losses "$W/base_tail.jsonl" "$W/$name/log.jsonl"
    close_weights "$W/gpt2_base/model_00000004.bin" "$W/$name/model_00000004.bin" 1e-5 1e-4
}
resume ep4_to_ep1 gpt2_dp4_ep4_zero1 1
resume ep4_zero3_to_ep1 gpt2_dp4_ep4_zero3 1
resume ep4_to_ep2_zero3 gpt2_dp4_ep4_zero1 4 "${dp4[@]}" parallel.ep=2 parallel.zero=3
resume ep1_to_ep2 gpt2_base 2 "${dp2[@]}" parallel.ep=2
resume ep1_to_ep2_zero1 gpt2_base 2 "${dp2[@]}" parallel.ep=2 parallel.zero=1
resume ep1_to_ep2_zero3 gpt2_base 2 "${dp2[@]}" parallel.ep=2 parallel.zero=3
resume cp2_ep4_zero3_to_ep1 gpt2_dp2_cp2_ep4_zero3 1
resume ep1_to_cp2_ep2 gpt2_base 2 parallel.dp=1 parallel.cp=2 parallel.ep=2

# ZeRO shards the dense optimizer state over all of dp: at dp 2 x ep 2 (one expert-dp rank),
# ZeRO-1, fp32 (m and v: 8 B per element), a rank owns its experts (2 MoE layers x 2 of the 4
# experts x 3152 elements: fcw 48x32, fcb 48, fcprojw 32x48, fcprojb 32) and half of the other
# elements of the padded buffer (the parameters row / 4 B), the larger half for the table
mem=$(head -n 1 "$W/ep1_to_ep2_zero1/log.jsonl" | jq -c '.memory[0]')
padded=$(( $(jq .params <<< "$mem") / 4 ))
experts=$(( 2 * 2 * (48 * 32 + 48 + 32 * 48 + 32) ))
want=$(( (experts + (padded - experts + 1) / 2) * 8 ))
[ "$(jq .optimizer <<< "$mem")" -eq "$want" ] ||
    die "dp2 x ep2 ZeRO-1: optimizer $(jq .optimizer <<< "$mem") B, want $want B ($experts expert + half of $((padded - experts)) dense elements)"
[ "$(jq -cS . <<< "$mem")" = "$("$BIN" "$W/gpt2.json" "${dp2[@]}" parallel.ep=2 parallel.zero=1 --plan=json | jq -cS '.memory[0]')" ] ||
    die "dp2 x ep2 ZeRO-1: the plan differs from the run's allocation $mem"
echo "dp2 x ep2 ZeRO-1 optimizer: $want B per rank (replicated dense state: $(( padded * 8 )) B)"

# optimizer offload under ep (pieces of a small bucket cut through the owned runs): bitwise the
# same training and checkpointed optimizer state as without
state_data() { tail -c +$((32 + $(od -An -t d4 -j 8 -N 4 "$1" | tr -d ' ') + 1)) "$1"; }
for off in false true; do
    dp_run 4 "$W/gpt2.json" "${dp4[@]}" parallel.ep=2 parallel.zero=1 parallel.bucket_mb=0.01 checkpoint.every=4 \
        train.offload_optimizer=$off "out_dir=$W/offload_$off" > "$W/offload_$off.txt" 2>&1 ||
        die "offload=$off under ep failed: $(tail -n 20 "$W/offload_$off.txt")"
done
cmp -s "$W/offload_false/model_00000004.bin" "$W/offload_true/model_00000004.bin" || die "offload under ep: weights differ"
a="$W/offload_false/checkpoints/step_00000004/state.bin" b="$W/offload_true/checkpoints/step_00000004/state.bin"
[ "$(state_data "$a" | wc -c)" -gt 0 ] && cmp -s <(state_data "$a") <(state_data "$b") ||
    die "offload under ep: the optimizer state differs"
echo "offload under ep: bitwise equal"

# the planner's memory table is the allocation (expert parameters: E/ep experts per rank)
"$BIN" "$W/llama.json" "${dp4[@]}" parallel.ep=4 --plan=json > "$W/plan.json" || die "--plan=json with parallel.ep failed"
[ "$(jq -cS .memory "$W/plan.json")" = "$(head -n 1 "$W/llama_dp4_ep4/log.jsonl" | jq -cS .memory)" ] ||
    die "the ep plan $(jq -cS .memory "$W/plan.json") differs from the run's allocation"
[ "$(jq '.memory[0].params' "$W/plan.json")" -lt "$(jq '.memory[0].params' <("$BIN" "$W/llama.json" "${dp4[@]}" --plan=json))" ] ||
    die "expert parallelism does not shrink the planned parameters"

# refusals: clear messages naming the key, exit 2
expect_fail 2 'parallel.ep: 2 does not divide parallel.dp = 1' "$BIN" "$W/gpt2.json" parallel.ep=2 "out_dir=$W/x"
expect_fail 2 'parallel.ep: 4 does not divide parallel.dp \* parallel.cp = 1 x 2' "$BIN" "$W/gpt2.json" parallel.ep=4 \
    parallel.cp=2 plan.world=2 --plan
expect_fail 2 'parallel.ep: 3 does not divide model.moe.num_experts = 4' "$BIN" "$W/gpt2.json" parallel.ep=3 "out_dir=$W/x"
expect_fail 2 'parallel.ep: 2 needs model.moe' "$BIN" "$W/gpt2.json" parallel.ep=2 model.moe.num_experts=0 "out_dir=$W/x"
expect_fail 2 'parallel.ep: 0 is out of range' "$BIN" "$W/gpt2.json" parallel.ep=0 "out_dir=$W/x"
echo "PASS: test_ep_layouts"
