# Device-resident communication, proven on the CPU (test hook LLMC_SIM_DEVICE=1, llmc/comm/device_sim.h):
# the CPU backend acts as device memory, and parallel.comm=nccl runs every group NCCL would carry
# (dp, cp, tp, pp, embed, ep, expert-dp; local SGD's sync, PowerSGD's factors) on MPI communicators that act as NCCL (device buffers only,
# operations in posting order) and end the run should any buffer they are given lie outside the
# backend's memory. parallel.comm=mpi under the hook runs the MPI-with-CUDA routes (every tensor
# staged through host copies). Each layout trains 4 steps three ways: plain MPI on the CPU, the
# simulated NCCL, the staged MPI; the three must give bitwise the same losses and final weights.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
cat > "$W/c.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 },
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 4, "lr": 3e-3, "warmup_steps": 2 },
  "eval": { "every": 4, "batches": 1 },
  "out_dir": "$W/out" }
JSON
check() {  # check NAME NPROC ARGS...
    local name=$1 n=$2; shift 2
    local o="$W/$name"
    dp_run "$n" "$W/c.json" "$@" "out_dir=$o.plain" > "$o.plain.txt" 2>&1 || die "$name (plain MPI) failed: $(tail -n 20 "$o.plain.txt")"
    LLMC_SIM_DEVICE=1 dp_run "$n" "$W/c.json" "$@" parallel.comm=nccl "out_dir=$o.nccl" > "$o.nccl.txt" 2>&1 ||
        die "$name (simulated NCCL) failed: $(tail -n 20 "$o.nccl.txt")"
    grep -q 'nccl (simulated over ' "$o.nccl.txt" || die "$name: the run did not use the simulated NCCL groups"
    LLMC_SIM_DEVICE=1 dp_run "$n" "$W/c.json" "$@" parallel.comm=mpi "out_dir=$o.staged" > "$o.staged.txt" 2>&1 ||
        die "$name (MPI staged through the host) failed: $(tail -n 20 "$o.staged.txt")"
    for v in nccl staged; do
        [ "$(losses "$o.plain/log.jsonl")" = "$(losses "$o.$v/log.jsonl")" ] || die "$name: the $v run's losses differ"
        [ "$(grep -o '"val_loss":[^,}]*' "$o.plain/log.jsonl")" = "$(grep -o '"val_loss":[^,}]*' "$o.$v/log.jsonl")" ] ||
            die "$name: the $v run's validation losses differ"
        cmp -s "$o.plain/model_00000004.bin" "$o.$v/model_00000004.bin" || die "$name: the $v run's final weights differ"
    done
    echo "$name ($*): plain, simulated NCCL and host-staged runs bitwise equal ($(losses "$o.plain/log.jsonl" | wc -l) losses)"
}
check tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
check pp2_1f1b 2 parallel.pp=2 parallel.pp_schedule=1f1b
check pp2_interleaved 2 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
check dp2_cp2_zero3 4 parallel.dp=2 parallel.cp=2 parallel.zero=3 train.grad_accum=2
# MoE under cp: the router's choices all-gathered over the cp group (host values through device memory)
check cp2_moe 2 parallel.cp=2 model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=32 \
    model.moe.capacity_factor=1.0
# ... and with ep over the cp pair: the plan made over cp, the kept rows traded over ep
check cp2_ep2_moe 2 parallel.dp=1 parallel.cp=2 parallel.ep=2 model.moe.num_experts=4 model.moe.top_k=2 \
    model.moe.expert_ffn_dim=32 model.moe.capacity_factor=1.0
check dp2_pp2_zero2 4 parallel.dp=2 parallel.pp=2 parallel.zero=2 train.grad_accum=2
check dp4_ep2_moe 4 parallel.dp=4 parallel.ep=2 parallel.zero=1 train.grad_accum=1 model.moe.num_experts=4 \
    model.moe.top_k=2 model.moe.expert_ffn_dim=32
check dp2_ep2_zero3 2 parallel.dp=2 parallel.ep=2 parallel.zero=3 train.grad_accum=2 model.moe.num_experts=4 \
    model.moe.top_k=2 model.moe.expert_ffn_dim=32 model.moe.capacity_factor=1.0
# local SGD: the sync's reduce-scatter and all-gather (ZeRO-1) and a mid-interval checkpoint's gathers
# of the outer state and the replicas, host vectors through device scratch
check dp2_local_sgd 2 parallel.dp=2 parallel.zero=1 parallel.local_sgd.every=2 parallel.local_sgd.outer_lr=0.7 \
    parallel.local_sgd.outer_momentum=0.5 checkpoint.every=3
# PowerSGD: the gradients copied to the host, P and Q all-reduced as host vectors through device
# scratch, and a checkpoint's gathers of every rank's error feedback
check dp2_powersgd 2 parallel.grad_compression=powersgd parallel.powersgd_rank=2 checkpoint.every=3
# one process: the dp group of one is the simulated NCCL too
check one 1 parallel.zero=1
echo "device-resident groups: every route bitwise equal"
