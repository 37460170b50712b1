# Activation offload changes where full recompute's kept layer inputs live, not training: with
# train.recompute=full, train.offload_activations=true trains 3 steps with exactly the losses (the
# log's text) and final weights (cmp) of offload off, for a GPT-2 and a Llama tiny model in one
# process and under a pipeline (pp2 1F1B over 4 micro-batches: several in flight on the first
# stage, whose slots share the two staging buffers) and dp2 ZeRO-1. Under LLMC_SIM_DEVICE the step
# records count the copies exactly: each step moves every layer's input down once and up once, i.e.
# per micro-batch the rank's layers x rows x d_model x 4 bytes each way more than offload off, with
# no more host waits. Also tp2 with SP, interleaved pp2, cp2 and an MoE Llama at dp2 x ep2. The memory table's activation row
# shrinks, its host row holds the kept inputs of every slot, and --plan equals the run's allocation.
# A run saved with offload resumes without it and vice versa, bitwise; offload without full
# recompute is refused (exit 2, both keys named).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
L=4 B=2 T=16 A=4 C=32
config() {  # config FILE MODEL_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": $2,
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": $B, "seq_len": $T, "grad_accum": $A, "steps": 3, "lr": 3e-3, "warmup_steps": 1,
             "weight_decay": 0.1, "grad_clip": 1.0, "recompute": "full" },
  "eval": { "every": 3, "batches": 1 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" "{ \"n_layer\": $L, \"n_head\": 4, \"d_model\": $C, \"vocab_size\": 512, \"max_seq_len\": 32 }"
config "$W/moe.json" "{ \"arch\": \"llama\", \"n_layer\": $L, \"n_head\": 2, \"d_model\": $C, \"ffn_dim\": 48,
                        \"vocab_size\": 512, \"max_seq_len\": 32, \"moe\": { \"num_experts\": 4, \"top_k\": 2,
                        \"every\": 2, \"aux_loss_coef\": 0.02, \"capacity_factor\": 0.8 } }"
config "$W/llama.json" "{ \"arch\": \"llama\", \"n_layer\": $L, \"n_head\": 4, \"n_kv_head\": 2, \"d_model\": $C,
                          \"ffn_dim\": 48, \"vocab_size\": 512, \"max_seq_len\": 32 }"

run() {  # run NAME NPROC ARGS... (under the simulated device: the step records count the copies)
    local name=$1 n=$2; shift 2
    LLMC_SIM_DEVICE=1 dp_run "$n" "$@" "out_dir=$W/$name" > "$W/$name.txt" 2>&1 ||
        die "$name failed: $(tail -n 20 "$W/$name.txt")"
}
row_bytes() { sed -n "s/^  $2 .* \([0-9][0-9]*\) B.*/\1/p" "$1" | head -n 1; }  # row_bytes FILE ROW: the memory table's
field() { grep '"step":' "$1" | grep -o "\"$2\":[0-9]*" | cut -d: -f2; }  # field LOG NAME: one value per step
same_training() {  # same_training BASE OTHER WHAT
    diff <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$1/log.jsonl") <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$2/log.jsonl") \
        > /dev/null || die "$3: losses differ"
    [ "$(losses "$2/log.jsonl" | wc -l)" -eq 3 ] || die "$3: expected 3 loss records"
    cmp -s "$1/model_00000003.bin" "$2/model_00000003.bin" || die "$3: final weights differ"
}
check() {  # check FAMILY NAME NPROC MICRO ROWS KEPT HOST ARGS...
    # MICRO micro-batches a rank runs a step, ROWS rows of the residual stream a rank holds of one;
    # KEPT layer inputs per micro-batch on the rank that moves the most (the step records carry the
    # most of any rank); HOST layer inputs in host memory on rank 0 (its slots in flight x its layers;
    # - leaves it to the plan's comparison)
    local fam=$1 name=$2 n=$3 micro=$4 rows=$5 kept=$6 host_kept=$7; shift 7
    local base="$W/$fam.$name.off" out="$W/$fam.$name.on"
    run "$fam.$name.off" "$n" "$W/$fam.json" "$@"
    run "$fam.$name.on" "$n" "$W/$fam.json" train.offload_activations=true "$@"
    same_training "$base" "$out" "$fam $name activation offload"
    # the copies: each kept input down and up once a step, nothing else changes
    local each=$((rows * C * 4)) s f d
    local want=$((micro * kept * each))
    for s in 1 2 3; do
        for f in d2h_bytes h2d_bytes; do
            d=$(( $(field "$out/log.jsonl" $f | sed -n ${s}p) - $(field "$base/log.jsonl" $f | sed -n ${s}p) ))
            [ "$d" -eq "$want" ] || die "$fam $name step $s: offload adds $d $f, want $want ($micro x $kept x $each)"
        done
        [ "$(field "$out/log.jsonl" host_syncs | sed -n ${s}p)" -eq "$(field "$base/log.jsonl" host_syncs | sed -n ${s}p)" ] ||
            die "$fam $name step $s: offload adds host waits"
    done
    # the memory table: fewer device activations, the kept inputs of every slot on the host
    local act_off act_on host
    act_off=$(row_bytes "$base.txt" activations); act_on=$(row_bytes "$out.txt" activations)
    host=$(row_bytes "$out.txt" 'host memory')
    [ -z "$(row_bytes "$base.txt" 'host memory')" ] || die "$fam $name off: a host memory row"
    [ "$act_on" -lt "$act_off" ] || die "$fam $name: activations $act_on B with offload, not below $act_off B"
    [ -n "$host" ] && { [ "$host_kept" = - ] || [ "$host" = $((host_kept * each)) ]; } ||
        die "$fam $name: host memory '$host' B, want $host_kept x $each"
    grep -q '^  activations .*offloaded' "$out.txt" || die "$fam $name: the activation row does not say offloaded"
    local plan rec
    plan=$("$BIN" "$W/$fam.json" train.offload_activations=true "$@" --plan=json | jq -cS .memory)
    rec=$(head -n 1 "$out/log.jsonl" | jq -cS .memory)
    [ "$plan" = "$rec" ] || die "$fam $name offload: plan $plan differs from the run's allocation $rec"
    printf '%s %-10s bitwise equal; activations %6s -> %6s B, host %6s B, %6s B each way a step\n' \
        "$fam" "$name" "$act_off" "$act_on" "$host" "$want"
}
N=$((B * T))
# one process: the L layers' inputs; pp2: L/2 a stage, the first holding 2 micro-batches in flight
# (1F1B); dp2: 2 micro-batches a rank; tp2 with SP and cp2: half the rows; interleaved: 2 chunks of
# one layer a rank
for fam in gpt2 llama; do
    check "$fam" one 1 $A $N $L $L
    check "$fam" pp2_1f1b 2 $A $N $((L / 2)) $L parallel.dp=1 parallel.pp=2 parallel.pp_schedule=1f1b
done
check gpt2 dp2_zero1 2 2 $N $L $L parallel.dp=2 parallel.zero=1 train.grad_accum=2
check llama tp2_sp 2 $A $((N / 2)) $L $L parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true
check gpt2 pp2_inter 2 $A $N 2 - parallel.dp=1 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
check llama cp2 2 $A $((N / 2)) $L $L parallel.dp=1 parallel.cp=2
check moe dp2_ep2 2 2 $N $L $L parallel.dp=2 parallel.ep=2 parallel.zero=1 train.grad_accum=2

# resume across offload on and off: 3 steps straight equal 2 steps, stop, resume for the third
for first in false true; do
    second=$([ $first = true ] && echo false || echo true)
    half="$W/resume.$first"
    resume_flipped train.offload_activations "$W/gpt2.json" "$half" $first
    same_training "$W/gpt2.one.off" "$half" "saved with offload=$first, resumed with $second"
    echo "saved with offload=$first, resumed with offload=$second: bitwise the straight run"
done

for rc in none selective; do
    expect_fail 2 'train.offload_activations: true needs train.recompute = "full" \(got "'$rc'"\)' \
        "$BIN" "$W/gpt2.json" train.offload_activations=true train.recompute=$rc
    expect_fail 2 'train.offload_activations: true needs train.recompute' \
        "$BIN" "$W/gpt2.json" train.offload_activations=true train.recompute=$rc --plan
done
expect_fail 2 "train.offload_activations: expected a boolean" "$BIN" "$W/gpt2.json" train.offload_activations=yes
echo "activation offload is bitwise full recompute; the copies, the memory table and the plan as counted; resume crosses it"
