#!/bin/bash
# Communication hidden behind computation (parallel.overlap; Comm's non-blocking calls), measured on
# the CPU with the test hook LLMC_COMM_DELAY_MS=D: every collective completes no sooner than D ms
# after it was posted, as over a slow network, without occupying a core. Each log.jsonl step
# record carries comm_ms (time inside communication waits) and compute_ms (the rest of the step).
#  - dp=2 ZeRO-1 (bucket reduce-scatters during backward, waited for before the optimizer; the
#    parameter all-gathers posted together) and dp=2 ZeRO-3 (the next layer's all-gather during the
#    current layer, forward and backward; layer reduce-scatters waited for at the next layer's):
#    with overlap a step spends waiting for communication at most the delay of its scalar
#    all-reduces (loss, gradient norm: blocking calls, their results are needed at once) and 30%
#    of the rest of the delay injected per step, without overlap at least 90% of all of it.
#  - dp=1 x pp=2 1F1B (receives posted ahead of their action, sends waited for later): likewise,
#    counting only the waits the delay adds (the pipeline's bubble is a wait without any delay).
#  - with and without overlap the losses and the final weights are bitwise the same.
# The injected delay per step is D times the collectives a step makes, counted here from the layout:
#   ZeRO-1: B bucket reduce-scatters + B bucket all-gathers + 2 scalar all-reduces (loss, norm)
#   ZeRO-3 (every unit one piece: bucket_mb above the largest): gathers of the embedding, the L
#          layers and the head forward, of the head and the L layers backward (the embedding's
#          backward reads no parameters), reduce-scatters of the L layers, the embedding and the
#          head, and the 2 scalars: 3L + 7.
# Over MPI one progress thread runs a communicator's posted operations in turn, so the delays add
# up: overlap hides them only when the compute they run under takes longer than their sum. A fast
# machine breaks that first, not a slow one (at D = 20 ms and micro-batches of 16 and 24 a 2-core
# EPYC of 2026-11 computed a ZeRO-1 step in 170 ms against 240 ms of serialized bucket delays, and
# the test failed there at every commit); so D = 10 ms and micro-batches that give each case 2-3x
# its injected delay in compute there (ZeRO-1 640 ms vs 260, ZeRO-3 1020 vs 430). The pipeline
# hides a receive's delay behind the kRecvAhead actions between its post and its use, so what counts
# there is one micro-batch's compute against D: at micro-batches of 4 (12 ms of forward and
# backward a micro-batch on stage 0) the CI machine of 2026-11-27 waited 36-38% of the delay
# (over the bound twice) where a slower one waited 14%; at 8, a delay of 25 ms (as a machine 2.5x
# faster sees 10) leaves 19% here. A slower machine only widens the margin.
# Robust on a loaded machine: comm_ms counts waits only, so slow computation does not move it;
# load adds waits (a rank descheduled while its peer waits), never removes them, so each run is
# judged by its least-waiting step after the first: that only makes the no-overlap bound harder
# to meet; and what a machine adds to the delays themselves (the run without overlap waits past
# what was injected: 165 ms of 260 here on 2026-11-27's evening, with overlapped waits of 141-153 ms
# against a bound of 92) is added to the overlap bound: the operations' own time queues at the
# step's end. Without overlap a run still waits the whole delay plus that, far over the bound.
# (The watchdog over a stalled non-blocking operation: test_dp_failures.sh, whose ZeRO-3 case
# stalls in a posted reduce-scatter.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data 100000
# one thread per rank: the two ranks and their communication threads fit the 2 cores CI has, so
# a rank is not descheduled while its peer waits (that adds waits the overlap cannot hide)
export OMP_NUM_THREADS=1
D=10
L=12
cat > "$W/c.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": $L, "n_head": 4, "d_model": 128, "vocab_size": 512, "max_seq_len": 64 },
  "data": { "train": "$W/data/train_*.bin" },
  "train": { "micro_batch": 16, "seq_len": 64, "grad_accum": 1, "steps": 4, "lr": 3e-3, "warmup_steps": 1 },
  "out_dir": "$W/out" }
JSON

# typical RUN: the median comm_ms of the steps after the first (the bubble's estimate)
typical() {
    python3 - "$W/$1/log.jsonl" <<'PY'
import json, statistics, sys
print(statistics.median([json.loads(l)["comm_ms"] for l in open(sys.argv[1]) if '"loss"' in l][1:]))
PY
}
# least RUN: "<comm_ms> <compute_ms>" of the step after the first that waited least
least() {
    python3 - "$W/$1/log.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
r = min(recs, key=lambda r: r["comm_ms"])
print(r["comm_ms"], r["compute_ms"])
PY
}

# ops_zero1 / ops_zero3: the collectives per step (above); the bucket count as the trainer prints it
ops_zero1() {
    local b
    b=$(grep -o '[0-9]* gradient buckets' "$W/zero1-true.txt" | cut -d' ' -f1)
    [ -n "$b" ] && [ "$b" -ge 6 ] || die "expected at least 6 gradient buckets, got '$b'"
    echo $(( 2 * b + 2 ))
}
ops_zero3() { echo $(( 3 * L + 7 )); }
# 1F1B on stage 0 (world rank 0, which logs) of 2 stages, M micro-batches: Send(a0), then M - 1
# SendRecv(a_m, g_m-1), then Recv(g_M-1): M + 1 transfers; the loss (pp), the tied embedding's
# gradient (first and last stage) and the gradient norm (model-parallel group): 3 all-reduces
ops_pp() { echo $(( M + 4 )); }
# the scalar all-reduces among them (blocking calls: their delay is waited for whatever the overlap)
scalars_zero1() { echo 2; }
scalars_zero3() { echo 2; }
scalars_pp() { echo 3; }

# measure NAME ARGS...: runs the layout with and without overlap under the delay. A pipeline waits
# for its neighbour also without any delay (the schedule's bubble), so with BASE=1 the overlapped
# run's typical (median) waits without the delay are subtracted from its waits with it: the delay
# it did not hide remains. (The run without overlap is held to its waits as they are: bubble included.)
measure() {
    local name=$1 base_on=0 base_off=0; shift
    for ov in true false; do
        LLMC_COMM_DELAY_MS=$D dp_run 2 "$W/c.json" "out_dir=$W/$name-$ov" parallel.overlap=$ov "$@" > "$W/$name-$ov.txt" ||
            die "$name overlap=$ov failed: $(tail -5 "$W/$name-$ov.txt")"
        [ -z "${BASE:-}" ] || dp_run 2 "$W/c.json" "out_dir=$W/$name-$ov-0" parallel.overlap=$ov "$@" > /dev/null ||
            die "$name overlap=$ov without the delay failed"
    done
    diff <(losses "$W/$name-true/log.jsonl") <(losses "$W/$name-false/log.jsonl") || die "$name: losses differ with overlap"
    cmp "$W/$name-true/model_00000004.bin" "$W/$name-false/model_00000004.bin" || die "$name: weights differ with overlap"
    read -r comm_on compute_on <<< "$(least "$name-true")"
    read -r comm_off compute_off <<< "$(least "$name-false")"
    if [ -n "${BASE:-}" ]; then
        base_on=$(typical "$name-true-0")
        base_off=$(typical "$name-false-0")
        echo "  $name without the delay: waits $base_on ms (overlap), $base_off ms (none) per step"
        comm_on=$(echo "$comm_on - $base_on" | bc -l)
    fi
    local ops injected blocking excess bound
    ops=$(ops_$name)
    injected=$(( ops * D ))
    blocking=$(( $(scalars_$name) * D ))
    # what the machine adds to the delay (the run without overlap waits for each collective in
    # full: its waits past those injected, bubble left out, are the operations' own time and the
    # ranks' descheduling), which the overlapped run cannot hide where the operations queue behind
    # one another at the step's end: its bound allows it on top
    excess=$(echo "e = $comm_off - $base_off - $injected; if (e < 0) e = 0; e" | bc -l)
    bound=$(echo "$blocking + 0.3 * ($injected - $blocking) + $excess" | bc -l)
    printf "  %s: delay %d ms x %d collectives = %d ms per step; overlap: compute %.0f + comm %.0f ms; none: compute %.0f + comm %.0f ms (%.0f ms past the delay)\n" \
        "$name" $D "$ops" $injected "$compute_on" "$comm_on" "$compute_off" "$comm_off" "$excess"
    [ "$(echo "$comm_on <= $bound" | bc -l)" -eq 1 ] ||
        { printf "  %s: with overlap a step waits %.0f ms for communication, over its bound of %.0f ms: the %d ms of its scalar all-reduces, 30%% of the other %d ms injected and the %.0f ms the machine added\n" \
              "$name" "$comm_on" "$bound" $blocking $(( injected - blocking )) "$excess"; return 1; }
    [ "$(echo "$comm_off >= 0.9 * $injected" | bc -l)" -eq 1 ] ||
        die "$name: without overlap a step waits only $comm_off ms for communication, under 90% of the $injected ms injected"
}
# check NAME ARGS...: as measure; a machine busy with other work deschedules a rank while its peer
# waits, which adds waits overlap cannot hide: a run over the overlap bound is measured again (three
# times in all; on 2026-11-27 CI's machine waited 96 and 124 ms against a bound of 92)
check() {
    local attempt
    for attempt in 1 2; do
        measure "$@" && return 0
        echo "  $1: measuring again (a loaded machine adds waits)"
    done
    measure "$@" || die "$1: over the overlap bound three times"
}

check zero1 parallel.zero=1 parallel.bucket_mb=0.8 train.micro_batch=64  # buckets a little over a layer: one per layer at most
check zero3 parallel.zero=3 parallel.bucket_mb=100 train.micro_batch=96  # a layer's forward well over D
# pp=2 1F1B: receives posted ahead, sends waited for later; 3 layers per stage
M=24
BASE=1 check pp parallel.pp=2 parallel.pp_schedule=1f1b train.grad_accum=$M train.micro_batch=8 model.n_layer=6
echo "PASS test_overlap"
