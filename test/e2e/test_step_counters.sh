# A training step that stays on the device (issue 29), proven on the CPU: under LLMC_SIM_DEVICE=1
# the CPU backend counts what a GPU run would move (Ops::counters, llmc/backend/ops.h) and every
# step record of log.jsonl carries host_syncs, h2d_bytes, d2h_bytes and launches (the most of any
# rank). For one process (its group of one, and the simulated NCCL), dp2 under ZeRO-1 and ZeRO-3
# over the simulated NCCL, tp2 and pp2, every step must:
#  - move no gradient or parameter bytes across: down only the norm's doubles, the decision and
#    the per-token losses (32 + 4 x tokens bytes), up only the token ids and targets (8 x tokens);
#  - wait for the device at most twice;
#  - queue at most A x (PER_LAYER x layers + PER_MICRO) + PER_STEP launches (A micro-batches, the
#    layers this rank holds): nothing per tensor. The norm, the clip decision and AdamW are
#    multi-tensor ops; per tensor (12 a layer) they would add two launches each, far past the
#    slack (this run measured 15 a layer and 9 a micro-batch at ZeRO-0, 5 a step; ZeRO-3 adds
#    3.5 a layer: the unit gradient's zeroing and its reduce-scatter's staging and accumulation);
#  - after the first step, allocate or free no backend memory (allocs: on a GPU each cudaMalloc or
#    cudaFree waits for the whole device, and a CUDA graph holds the pointers): the buffers are
#    sized before, or in, the first step. Also for dp2 x ep2 MoE (allocs alone), whose routed rows
#    vary by step: its message buffer is sized at start-up for the most rows its experts can
#    receive.
# The same bounds hold in precision fp8, one process and dp2: its scaling state advances on the
# device (Fp8Device), so the step reads back no amaxes and waits once (before, the amaxes went to
# the host each step: 2 waits and 192 more bytes down for this model, failing the d2h bound).
# (Activation offload moves the kept layer inputs on purpose: test_act_offload.sh checks those bytes
# exactly, offload on against off. Here it is off, the default.)
# On the code before (counters added, nothing else) every layout fails: 31 to 69 syncs a step, one
# process 274 KB each way (the gradient through the host), 343 to 412 launches.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
L=4 B=2 T=16 A=4
PER_MICRO=12 PER_STEP=8
cat > "$W/c.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": $L, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin" },
  "train": { "micro_batch": $B, "seq_len": $T, "grad_accum": $A, "steps": 3, "lr": 3e-3, "warmup_steps": 2 },
  "out_dir": "$W/out" }
JSON
field() { grep '"step":' "$1" | grep -o "\"$2\":[0-9]*" | cut -d: -f2; }  # field LOG NAME: one value per step
check() {  # check NAME NPROC LAYERS PER_LAYER ARGS...: LAYERS held by a rank
    local name=$1 n=$2 layers=$3 per_layer=$4; shift 4
    local o="$W/$name"
    LLMC_SIM_DEVICE=1 dp_run "$n" "$W/c.json" "$@" "out_dir=$o" > "$o.txt" 2>&1 || die "$name failed: $(tail -n 20 "$o.txt")"
    local log="$o/log.jsonl" tokens=$((A * B * T))
    [ "$(field "$log" host_syncs | wc -l)" -eq 3 ] || die "$name: the step records lack the counters: $(grep '"step":' "$log" | head -1)"
    local s syncs up down launches
    for s in 1 2 3; do
        syncs=$(field "$log" host_syncs | sed -n ${s}p); up=$(field "$log" h2d_bytes | sed -n ${s}p)
        down=$(field "$log" d2h_bytes | sed -n ${s}p); launches=$(field "$log" launches | sed -n ${s}p)
        echo "  $name step $s: host_syncs $syncs, h2d $up bytes, d2h $down bytes, launches $launches (comm_waits $(field "$log" comm_waits | sed -n ${s}p))"
        [ "$syncs" -le 2 ] || die "$name step $s: $syncs host synchronizations (at most 2)"
        [ "$down" -le $((32 + 4 * tokens)) ] || die "$name step $s: $down bytes read back (at most $((32 + 4 * tokens)): the norm and the losses)"
        [ "$up" -le $((8 * tokens)) ] || die "$name step $s: $up bytes uploaded (at most $((8 * tokens)): the tokens and targets)"
        local most=$((A * (per_layer * layers + PER_MICRO) + PER_STEP))
        [ "$launches" -le "$most" ] || die "$name step $s: $launches launches (at most $most)"
    done
    no_allocs "$log" "$name"
}
no_allocs() {  # no_allocs LOG NAME: the steps after the first allocate and free nothing
    local a
    a=$(field "$1" allocs | tr '\n' ' ')
    [ "$(field "$1" allocs | wc -l)" -eq 3 ] || die "$2: the step records lack allocs: $a"
    [ "$(field "$1" allocs | tail -n +2 | tr '\n' ' ')" = "0 0 " ] || die "$2: allocations in steps 2 and 3 (allocs per step: $a)"
    echo "  $2: allocs per step $a"
}
# one process: its group of one (comm self: no collective, no copy), and the simulated NCCL
check one_self 1 $L 16 parallel.zero=0
check one_nccl 1 $L 16 parallel.comm=nccl parallel.zero=1
check dp2_zero1 2 $L 16 parallel.dp=2 parallel.zero=1 parallel.comm=nccl
check dp2_zero3 2 $L 20 parallel.dp=2 parallel.zero=3 parallel.comm=nccl
check tp2 2 $L 16 parallel.tp=2 parallel.comm=nccl
check pp2 2 $((L / 2)) 16 parallel.pp=2 parallel.comm=nccl
check one_fp8 1 $L 16 parallel.zero=0 precision=fp8
check dp2_fp8 2 $L 16 parallel.dp=2 parallel.zero=1 parallel.comm=nccl precision=fp8
[ "$(field "$W/one_fp8/log.jsonl" host_syncs | tr '\n' ' ')" = "$(field "$W/one_self/log.jsonl" host_syncs | tr '\n' ' ')" ] ||
    die "fp8 waits for the device more often than fp32: $(field "$W/one_fp8/log.jsonl" host_syncs | tr '\n' ' ')"
# MoE over dp2 x ep2 (dropless top-2 of 4 experts: the rows an expert receives vary by step)
LLMC_SIM_DEVICE=1 dp_run 2 "$W/c.json" parallel.dp=2 parallel.ep=2 parallel.comm=nccl model.moe.num_experts=4 \
    model.moe.top_k=2 model.moe.expert_ffn_dim=48 "out_dir=$W/ep2" > "$W/ep2.txt" 2>&1 || die "ep2 failed: $(tail -n 20 "$W/ep2.txt")"
no_allocs "$W/ep2/log.jsonl" dp2_ep2
echo "step counters: no parameter or gradient bytes cross, at most 2 syncs, a bounded number of launches and no allocation per step"
