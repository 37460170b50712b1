# The planner is exact: `train_gpt CONFIG --plan=json` (one process, no mpirun, nothing allocated)
# gives for every kind of rank the bytes of each category that the real run then allocates, which
# the run logs as the first record of log.jsonl ({"memory": ...}); the two must be the same JSON,
# byte for byte, for GPT-2 and Llama over data parallelism at ZeRO 0-3, tensor parallelism with
# sequence parallelism, a pipeline, and dp2 x tp2 x pp2 (interleaved, with recomputation). A plan
# of a different micro-batch must differ from the run (the comparison can fail), and the text plan
# prints one block per kind of rank.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
config() {  # config FILE MODEL_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": $2,
  "data": { "train": "$W/data/train_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 1 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" '{ "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 }'
config "$W/llama.json" '{ "arch": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn_dim": 48,
                          "vocab_size": 512, "max_seq_len": 32 }'

check() {  # check FAMILY NAME NPROC ARGS...: the plan equals the run's allocation
    local fam=$1 name=$2 n=$3; shift 3
    local out="$W/$fam.$name"
    "$BIN" "$W/$fam.json" "$@" --plan=json > "$out.plan.json" 2> "$out.plan.err" ||
        die "$fam $name: --plan=json failed: $(cat "$out.plan.err")"
    if [ "$n" -eq 1 ]; then "$BIN" "$W/$fam.json" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$fam $name failed"
    else dp_run "$n" "$W/$fam.json" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$fam $name failed: $(tail "$out.txt")"; fi
    local plan run
    plan=$(jq -cS .memory "$out.plan.json")
    run=$(head -n 1 "$out/log.jsonl" | jq -cS .memory)
    [ "$run" != null ] || die "$fam $name: the first record of log.jsonl is not the memory record"
    [ "$plan" = "$run" ] || die "$fam $name: plan $plan differs from the run's allocation $run"
    echo "$fam $name: $(jq '.memory | length' "$out.plan.json") kind(s) of rank, totals $(jq -c '[.memory[].total]' "$out.plan.json") B"
}
dp2x2x2=(parallel.dp=2 parallel.tp=2 parallel.pp=2 parallel.zero=1 parallel.pp_schedule=interleaved parallel.pp_virtual=2)
for fam in gpt2 llama; do
    check "$fam" one 1 train.recompute=full
    for z in 0 1 2 3; do check "$fam" "dp2_zero$z" 2 parallel.dp=2 parallel.zero=$z; done
    check "$fam" tp2_sp 2 parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true
    check "$fam" pp2 2 parallel.dp=1 parallel.pp=2
    check "$fam" dp2_tp2_pp2 8 "${dp2x2x2[@]}" train.recompute=selective
    check "$fam" dp2_cp2_zero2 4 parallel.dp=2 parallel.cp=2 parallel.zero=2
    check "$fam" cp2_tp2_sp_pp2 8 parallel.dp=1 parallel.cp=2 parallel.tp=2 parallel.sequence_parallel=true parallel.pp=2
done
# mixture of experts: the experts' parameters and their permuted activations (top_k rows per token)
config "$W/moe.json" '{ "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32,
                        "moe": { "num_experts": 4, "top_k": 2, "every": 2, "capacity_factor": 1.0 } }'
for args in "one 1" "dp2_zero3 2 parallel.dp=2 parallel.zero=3" "pp2 2 parallel.dp=1 parallel.pp=2" \
            "tp2_sp 2 parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true"; do
    check moe $args
done
[ "$(jq '.memory[0].activations' "$W/moe.one.plan.json")" -gt "$(jq '.memory[0].activations' "$W/gpt2.dp2_zero0.plan.json")" ] ||
    die "the MoE plan's activations are not larger than the dense model's"
check gpt2 pp2_auto 2 parallel.dp=1 parallel.pp=2 parallel.pp_layers=auto  # the split resolved alike
# context parallelism holds seq_len / cp tokens of each sequence: fewer activation bytes per rank
# than the same layout at cp 1, and the memory table says how many at cp 1
act() { "$BIN" "$W/llama.json" "$@" --plan=json | jq '.memory[0].activations'; }
a1=$(act parallel.dp=2 parallel.zero=2 plan.world=2)
a2=$(act parallel.dp=2 parallel.cp=2 parallel.zero=2 plan.world=4)
a4=$(act parallel.dp=2 parallel.cp=4 parallel.zero=2 plan.world=8)
[ "$a4" -lt "$a2" ] && [ "$a2" -lt "$a1" ] || die "activations at cp 1, 2, 4: $a1 $a2 $a4 B do not shrink"
"$BIN" "$W/gpt2.json" parallel.dp=2 parallel.cp=2 plan.world=4 --plan | grep -q 'world 4 = dp 2 x cp 2 x tp 1 x pp 1' ||
    die "the text plan does not name cp"
grep -q 'activations .*(context parallel: 8 tokens of each sequence, ring buffers; .* at cp 1' "$W/llama.dp2_cp2_zero2.txt" ||
    die "the memory table does not show context parallelism's activations"

# the comparison can fail: a plan for another micro-batch does not match the run
other=$("$BIN" "$W/gpt2.json" parallel.dp=1 parallel.pp=2 train.micro_batch=4 --plan=json | jq -cS .memory)
[ "$other" != "$(head -n 1 "$W/gpt2.pp2/log.jsonl" | jq -cS .memory)" ] || die "plans of different micro-batches agree"

# the text plan: a block per kind of rank with every category and the total; FLOPs per step
"$BIN" "$W/gpt2.json" "${dp2x2x2[@]}" --plan > "$W/plan.txt" || die "--plan failed"
[ "$(grep -c '^rank kind' "$W/plan.txt")" -eq "$(jq '.memory | length' "$W/gpt2.dp2_tp2_pp2.plan.json")" ] ||
    die "the text plan's kinds of rank differ from the JSON's: $(cat "$W/plan.txt")"
for row in parameters gradients optimizer 'comm buffers' 'unit params' 'unit grads' activations total; do
    grep -q "^  $row " "$W/plan.txt" || die "the text plan has no $row row"
done
grep -q 'world 8 = dp 2 x tp 2 x pp 2' "$W/plan.txt" || die "the text plan does not plan 8 processes"
grep -q 'model FLOPs per step' "$W/plan.txt" || die "the text plan has no FLOPs"
grep -q '^step time on 8 x h100 ' "$W/plan.txt" || die "the text plan has no step time"
grep -q 'exposed communication .* pipeline bubble' "$W/plan.txt" || die "the text plan does not split the step time"
[ "$(jq '.step_time.total_s > 0 and .step_time.bubble_s > 0 and .device.gpu == "h100"' "$W/gpt2.dp2_tp2_pp2.plan.json")" = true ] ||
    die "--plan=json has no step time"
expect_fail 2 'plan.efficiency' "$BIN" "$W/gpt2.json" plan.efficiency=0 --plan
expect_fail 2 'plan.gpu' "$BIN" "$W/gpt2.json" plan.gpu=v100 --plan
# --plan=search prints key=value overrides; the best one, planned, fits plan.gpu's memory
"$BIN" "$W/gpt2.json" parallel.dp=auto plan.world=8 plan.gpu_mem_gib=0.001 --plan=search > "$W/search.txt" ||
    die "--plan=search failed"
best=$(sed -n 3p "$W/search.txt")
echo "$best" | grep -q '^   parallel.dp=' || die "--plan=search printed no overrides: $(cat "$W/search.txt")"
# shellcheck disable=SC2086  # the overrides are words
most=$("$BIN" "$W/gpt2.json" $best plan.world=8 --plan=json | jq '[.memory[].total] | max')
[ "$most" -le $((1024 * 1024)) ] || die "the searched layout needs $most B, more than plan.gpu_mem_gib=0.001"
echo "search: $best ($most B)"
# plan.world: the world to plan; with parallel.dp "auto" it defaults to 1, which a pipeline does not fit
expect_fail 2 "parallel.dp: .auto. needs the world size" "$BIN" "$W/gpt2.json" parallel.pp=2 --plan
"$BIN" "$W/gpt2.json" parallel.pp=2 plan.world=4 --plan | grep -q "world 4 = dp 2 x tp 1 x pp 2" || die "plan.world=4 not planned"
expect_fail 2 'parallel' "$BIN" "$W/gpt2.json" parallel.dp=2 plan.world=3 --plan
# a plan reads no data: a cluster's data paths need not exist here (a run still refuses them)
"$BIN" "$W/gpt2.json" "data.train=/nonexistent/train_*.bin" "data.val=/nonexistent/val_*.bin" --plan > /dev/null ||
    die "--plan needed the data files"
expect_fail 2 "data.train: no file matches" "$BIN" "$W/gpt2.json" "data.train=/nonexistent/train_*.bin" "out_dir=$W/nodata"
# ZeRO's published memory per GPU (Rajbhandari et al., Figure 1: mixed precision, K = 12 bytes of
# fp32 master weights and Adam moments per parameter) for a 7B GPT on 64 GPUs, byte for byte:
# parameters + gradients + optimizer = 16P at stage 0, 4P + 12P/N at 1, 2P + 14P/N at 2, 16P/N at 3
# (P = the parameters of the planned buffer: the model's, padded to split evenly over N = 64)
g7b=(model.n_layer=32 model.d_model=4096 model.n_head=32 model.vocab_size=50257 model.max_seq_len=2048
     train.seq_len=2048 train.micro_batch=1 device=cuda precision=bf16 parallel.dp=64 plan.world=64)
P=$("$BIN" "$W/gpt2.json" "${g7b[@]}" parallel.zero=0 --plan=json | jq '.memory[0].params / 2')
[ "$P" -gt 6000000000 ] || die "the 7B plan holds $P parameters"
for z in 0 1 2 3; do
    got=$("$BIN" "$W/gpt2.json" "${g7b[@]}" parallel.zero=$z --plan=json | jq '.memory[0] | .params + .grads + .optimizer')
    want=$(echo "$z $P" | awk '{ z = $1; p = $2; n = 64
        w = z == 0 ? 16 * p : z == 1 ? 4 * p + 12 * p / n : z == 2 ? 2 * p + 14 * p / n : 16 * p / n
        printf "%.0f\n", w }')
    [ "$got" = "$want" ] || die "ZeRO-$z: params + grads + optimizer = $got B, ZeRO's formula says $want B (P = $P)"
    echo "7B on 64 GPUs, ZeRO-$z: $got B per GPU = ZeRO's formula"
done
echo "plans equal the runs' allocations"

# issue 34: a plan answers in moments for any input, allocating nothing in proportion to the model,
# and a stop signal ends it at once (it has nothing to save: the signal's own exit, 128 + n)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
huge=(model.n_layer=67108864 model.d_model=67108864 model.n_head=1 model.max_seq_len=67108864
      train.seq_len=67108864 model.vocab_size=16777216)
t0=$(date +%s.%N)
expect_fail 2 'model: 3\.63e\+24 parameters \(model\.n_layer = 67108864, model\.d_model = 67108864\)' \
    timeout -k 1 10 "$BIN" "$W/gpt2.json" "${huge[@]}" --plan
t=$(elapsed "$t0")
awk -v t="$t" 'BEGIN { exit !(t < 1) }' || die "--plan on the huge shape took $t s (more than 1 s)"
echo "--plan on 2^26 layers of d_model 2^26: refused naming the sizes in $t s"
searches=("plan.world=1000000 model.n_layer=64 model.n_head=64 model.d_model=8192 train.grad_accum=1024"
          "plan.world=1024 model.n_layer=4096 model.d_model=65536 model.n_head=64 model.max_seq_len=65536 train.seq_len=65536")
# the bound is on the search's CPU time (user + system, bash's time): the tests run two at a time on
# two cores, where a wall-clock bound failed beside a build; timeout still ends a hung search at 30 s
TIMEFORMAT='%U %S'
for args in "${searches[@]}"; do
    t0=$(date +%s.%N)
    rc=0
    # shellcheck disable=SC2086
    { time { timeout -k 1 30 "$BIN" "$W/gpt2.json" $args --plan=search > "$W/big_search.txt" 2>&1 || rc=$?; }; } \
        2> "$W/search_cpu.txt"
    t=$(elapsed "$t0")
    cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$W/search_cpu.txt")
    [ $rc -eq 0 ] || die "--plan=search $args: exit $rc after $t s: $(tail -n 3 "$W/big_search.txt")"
    awk -v t="$cpu" 'BEGIN { exit !(t < 10) }' || die "--plan=search $args took $cpu s of CPU (more than 10 s)"
    grep -q '^skipped [0-9]* layouts' "$W/big_search.txt" || die "--plan=search $args: no word of what it skipped"
    echo "--plan=search $args: answered in $t s ($cpu s of CPU)"
done
for sig in TERM INT; do
    LLMC_FAULT=hang:plan "$BIN" "$W/gpt2.json" --plan=search > /dev/null 2> "$W/sig.err" &
    pid=$!
    for _ in $(seq 400); do grep -q 'LLMC_FAULT=hang:plan' "$W/sig.err" 2>/dev/null && break; sleep 0.05; done
    grep -q 'LLMC_FAULT=hang:plan' "$W/sig.err" ||
        { kill -9 $pid; die "the plan did not reach its hang point in 20 s: $(cat "$W/sig.err")"; }
    t0=$(date +%s.%N)
    kill -$sig $pid
    for _ in $(seq 20); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
    t=$(elapsed "$t0")
    if kill -0 $pid 2>/dev/null; then kill -9 $pid; die "SIG$sig did not end --plan=search within 1 s"; fi
    rc=0
    wait $pid || rc=$?
    want=$([ $sig = TERM ] && echo 143 || echo 130)
    [ $rc -eq "$want" ] || die "SIG$sig during --plan=search: exit $rc, expected $want (128 + the signal)"
    echo "SIG$sig ended --plan=search in $t s, exit $rc"
done
