# Optimizer offload changes where AdamW's state lives, not training: on the CPU backend the host
# update is the same kernel on the same values, streamed in pieces (parallel.bucket_mb is small
# here, so pieces cut through tensors). For a GPT-2 and a Llama tiny model in one process, dp2 at
# ZeRO-1 and ZeRO-3, and a pipeline (GPT-2) or tensor parallelism (Llama), train.offload_optimizer
# =true trains 3 steps with exactly the losses, final weights and checkpointed optimizer state
# (state.bin) of offload off. The memory table moves the optimizer to the host row, the plan
# equals the run's allocation, and the host bytes are the state plus three staging pieces. A run
# saved with offload resumes without it and vice versa, bitwise.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
config() {  # config FILE MODEL_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": $2,
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 3, "lr": 3e-3, "warmup_steps": 1,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "parallel": { "bucket_mb": 0.01 },
  "checkpoint": { "every": 3 },
  "eval": { "every": 3, "batches": 1 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" '{ "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 }'
config "$W/llama.json" '{ "arch": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn_dim": 48,
                          "vocab_size": 512, "max_seq_len": 32 }'

run() {  # run NAME NPROC ARGS...
    local name=$1 n=$2; shift 2
    local out="$W/$name"
    if [ "$n" -eq 1 ]; then "$BIN" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$name failed: $(tail -n 20 "$out.txt")"
    else dp_run "$n" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$name failed: $(tail -n 20 "$out.txt")"; fi
}
row_bytes() { sed -n "s/^  $2 .* \([0-9][0-9]*\) B.*/\1/p" "$1" | head -n 1; }  # row_bytes FILE ROW: the memory table's
# the optimizer state of a checkpoint's state.bin: what follows the 32-byte header and the JSON
# metadata (whose length is the header's third int32; the metadata holds the config, which differs)
state_data() { tail -c +$((32 + $(od -An -t d4 -j 8 -N 4 "$1" | tr -d ' ') + 1)) "$1"; }
same_training() {  # same_training BASE OTHER WHAT: losses, final weights and optimizer state bitwise equal
    diff <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$1/log.jsonl") <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$2/log.jsonl") \
        > /dev/null || die "$3: losses differ"
    [ "$(losses "$2/log.jsonl" | wc -l)" -eq 3 ] || die "$3: expected 3 loss records"
    cmp -s "$1/model_00000003.bin" "$2/model_00000003.bin" || die "$3: final weights differ"
    local a="$1/checkpoints/step_00000003/state.bin" b="$2/checkpoints/step_00000003/state.bin"
    [ "$(state_data "$a" | wc -c)" -gt 0 ] || die "$3: no optimizer state in $a"
    cmp -s <(state_data "$a") <(state_data "$b") || die "$3: optimizer state (state.bin) differs"
}
check() {  # check FAMILY NAME NPROC ARGS...
    local fam=$1 name=$2 n=$3; shift 3
    local base="$W/$fam.$name.off" out="$W/$fam.$name.on"
    run "$fam.$name.off" "$n" "$W/$fam.json" "$@"
    run "$fam.$name.on" "$n" "$W/$fam.json" train.offload_optimizer=true "$@"
    same_training "$base" "$out" "$fam $name offload"
    # the memory table: the optimizer row moves to the host row
    local opt_off host_off opt_on host_on
    opt_off=$(row_bytes "$base.txt" optimizer); host_off=$(row_bytes "$base.txt" 'host memory')
    opt_on=$(row_bytes "$out.txt" optimizer); host_on=$(row_bytes "$out.txt" 'host memory')
    [ "$opt_off" -gt 0 ] && [ -z "$host_off" ] || die "$fam $name off: optimizer '$opt_off' B, host row '$host_off'"
    [ "$opt_on" = 0 ] && [ "$host_on" -gt "$opt_off" ] ||
        die "$fam $name offload: optimizer row '$opt_on' B (want 0), host row '$host_on' B (want > $opt_off)"
    # the plan is the run's allocation, host bytes included
    local plan rec
    plan=$("$BIN" "$W/$fam.json" train.offload_optimizer=true "$@" --plan=json | jq -cS .memory)
    rec=$(head -n 1 "$out/log.jsonl" | jq -cS .memory)
    [ "$plan" = "$rec" ] || die "$fam $name offload: plan $plan differs from the run's allocation $rec"
    printf '%s %-10s offload: bitwise equal; optimizer %8s B on the device -> host %8s B\n' "$fam" "$name" \
        "$opt_off" "$host_on"
}
for fam in gpt2 llama; do
    check "$fam" one 1
    check "$fam" dp2_zero1 2 parallel.dp=2 parallel.zero=1 train.grad_accum=2
    check "$fam" dp2_zero3 2 parallel.dp=2 parallel.zero=3 train.grad_accum=2
done
check gpt2 pp2 2 parallel.dp=1 parallel.pp=2
check llama tp2 2 parallel.dp=1 parallel.tp=2

# the host bytes by hand: m and v (8 B per element of the optimizer's range: the whole padded
# model, or a ZeRO shard of it) and three staging slots of a piece of gradients and parameters
# (fp32: 24 B per piece element); with bf16 (a GPU plan) also the master (12 B per element),
# the slots in bf16 (12 B) and a piece of fp32 gradients (4 B). A piece is a gradient bucket
# (parallel.bucket_mb in fp32 elements) capped at the range.
host_want() {  # host_want RANGE BUCKET BYTES_PER_ELEMENT BYTES_PER_PIECE_ELEMENT
    awk -v n="$1" -v b="$2" -v e="$3" -v p="$4" 'BEGIN { pc = b < n ? b : n; printf "%.0f\n", n * e + pc * p }'
}
P=$(jq '.memory[0].params / 4' <("$BIN" "$W/gpt2.json" --plan=json))  # the padded parameters at dp 1
P2=$(jq '.memory[0].params / 4' <("$BIN" "$W/gpt2.json" parallel.dp=2 --plan=json))  # padded for dp 2
bucket=$(awk 'BEGIN { printf "%d\n", 0.01 * 1024 * 1024 / 4 }')
for spec in "1 0 $P 8 24" "2 1 $((P2 / 2)) 8 24" "2 3 $((P2 / 2)) 8 24"; do
    read -r dp z range e pe <<<"$spec"
    got=$("$BIN" "$W/gpt2.json" train.offload_optimizer=true parallel.dp=$dp parallel.zero=$z plan.world=$dp --plan=json |
          jq '.memory[0].host')
    [ "$got" = "$(host_want "$range" "$bucket" "$e" "$pe")" ] ||
        die "dp$dp zero$z: host $got B, want $(host_want "$range" "$bucket" "$e" "$pe") B"
done
got=$("$BIN" "$W/gpt2.json" train.offload_optimizer=true device=cuda precision=bf16 parallel.bucket_mb=1 --plan=json |
      jq '.memory[0] | [.optimizer, .host] | @tsv' -r)
[ "$got" = "0	$(host_want "$P" 262144 12 16)" ] || die "bf16 plan: optimizer, host $got; want 0, $(host_want "$P" 262144 12 16)"

# resume across offload on and off: 3 steps straight equal 2 steps, stop, resume for the third
for first in false true; do
    second=$([ $first = true ] && echo false || echo true)
    half="$W/resume.$first"
    resume_flipped train.offload_optimizer "$W/gpt2.json" "$half" $first
    diff <(losses "$W/gpt2.one.off/log.jsonl") <(losses "$half/log.jsonl") > /dev/null ||
        die "saved with offload=$first, resumed with $second: losses differ"
    cmp -s "$W/gpt2.one.off/model_00000003.bin" "$half/model_00000003.bin" ||
        die "saved with offload=$first, resumed with $second: final weights differ"
    echo "saved with offload=$first, resumed with offload=$second: bitwise the straight run"
done

expect_fail 2 "train.offload_optimizer: expected a boolean" "$BIN" "$W/gpt2.json" train.offload_optimizer=yes
echo "optimizer offload is bitwise no offload; the plan equals the allocation; resume crosses it"
