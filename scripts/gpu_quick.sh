# The quick run and the profiler of scripts/gpu_check.sh (issue 26), sourced by it: a GPU window
# is 15 minutes in all, so `--quick` fits what matters most into about 3 minutes under ONE global
# deadline (QUICK_SECONDS, default 170): every step's time limit is the smaller of its own and
# what is left, a step that no longer fits is a SKIP row, and each row is written as it comes
# (--out DIR/quick/rows.partial.md). In order of value:
#   env; build/test_gpu one process per filter (an abort ends only its filter); the whole model
#   GPU vs CPU (GPT-2 and Llama, fp32, bf16 and fp16); saves across processes (tp=2 over mpirun:
#   resume and checkpoint.async, quick_saves); GPT-2 124M at B=8 and B=32 (fp16 too at
#   B=32) and the 1.5B shape at B=8 in bf16 and FP8, each beside the PyTorch peer at the same
#   shape (its bf16; the peers' torch.compile done ahead, in the background while test_gpu and the
#   parity runs check results: peer_prewarm_start/_end); a kernel table from
#   ncu at 124M B=8 (each kernel's share of kernel time, and kernel time against wall time).
# `--profile CONFIG [key=value...]`: the kernel table of any run (two steps under ncu).
# `--kernels`: dev/cuda's kernel versions side by side, in order of what is still in question:
# attention (forward v4/v5: 16 or 32 query rows a warp; backward v3-v6: rows a warp, tiles, passes) at
# GPT-2 124M's shape and FlashAttention's benchmark shapes beside PyTorch's SDPA (issue 30's peer);
# the fp8 casts (fp8_cast v4: the output-gradient cast fused with the bias gradient, then v3) and GEMM forms (fp8_gemm); cuBLASLt's epilogues against kernels
# (matmul_epilogue v5/v6), the GELU backward fused into the bias gradient (v7) or into the GEMM (v8), LayerNorm v5 and
# the fused cross entropy v5 at GPT-2 124M B=32's shapes; then the old versions (matmul_epilogue v1-v4, LayerNorm v3, cross entropy v3).
# `--variants`: the training step with each kernels.* config way beside the default (stage_variants).
# `--dry-run`: every step printed with its time limit, nothing run, nothing written.

# test_gpu's filters, in the order they run (test/e2e/test_gpu_check_list.sh checks this list
# against test/gpu/test_gpu.cu)
TEST_GPU_FILTERS="ptx encoder encoder_slice layernorm host_copies residual matmul attention attention_gqa attention_mt2 attention_bwd32 attention_fused attention_wgmma attention_wgmma_mn rmsnorm rope
attention_ring swiglu moe cross_entropy cross_entropy_vp adamw sum_squares step_ops step_graph offload reference model_step fp8"
QUICK_STEPS=${QUICK_STEPS:-10}

exec 9>&1  # the script's own stdout, for --dry-run's lines (a step's stdout goes to its log)
DEADLINE=""  # --deadline SECONDS sets it for any stage; --quick sets one of QUICK_SECONDS if none
left() { if [ -n "$DEADLINE" ]; then echo $((DEADLINE - $(date +%s))); else echo 999999; fi; }
limit_text() { echo "global deadline, $(left) s left"; }
# tlimit N: a command's time limit, N seconds or what is left of the deadline less 5 s (at least 1)
tlimit() { local t=$(( $(left) - 5 )); [ "$t" -lt "$1" ] || t=$1; [ "$t" -ge 1 ] || t=1; echo "$t"; }

# step NAME LIMIT CMD...: CMD under min(LIMIT, time left - 5 s); a SKIP row when under 5 s remain.
# Under --dry-run prints the step instead. Returns CMD's status (124 when its limit ended it).
step() {
    local name=$1 lim=$2; shift 2
    if [ "$DRY_RUN" = 1 ]; then
        printf '[dry-run] %-44s <= %3ss: %s\n' "$name" "$lim" "$*" >&9  # fd 9: the terminal, not the step's log
        return 0
    fi
    local t=$(( $(left) - 5 ))
    [ "$t" -lt "$lim" ] || t=$lim
    if [ "$t" -lt 5 ]; then
        row "$name" "SKIP" "" "" "" "global deadline: $(left) s left"
        return 125
    fi
    timeout -k 3 "$t" "$@"
}

# quick_data: synthetic GPT-2 shards for the benchmarks and tiny shards for the parity runs
quick_data() {
    Q="$WORK/quick"
    mkdir -p "$Q"
    step "data: synthetic shards" 30 bash -c "dev/data/synth_shards --out '$Q/bench' --shards 1 --tokens 3000000 \
        --vocab 50257 >/dev/null && dev/data/synth_shards --out '$Q/tiny' --shards 1 --tokens 200000 --vocab 512 >/dev/null"
}

# quick_train NAME LIMIT OUT key=value...: train_gpt on the bench shards into OUT (log OUT/stdout.log)
quick_train() {
    local name=$1 lim=$2 out=$3; shift 3
    mkdir -p "$out"
    step "$name" "$lim" ./train_gpt - data.train="$Q/bench_*.bin" data.val= eval.every=0 eval.sample_every=0 \
        tokenizer= checkpoint.every=0 checkpoint.resume=never checkpoint.dir="$out/ckpt" out.format=none \
        log.jsonl="$out/log.jsonl" out_dir="$out" "$@" >"$out/stdout.log" 2>&1
}

quick_env() {
    echo "== quick: env"
    row "GPU" "INFO" "" "" "" "$GPU_NAME, sm_$GPU_CC, $GPU_MEM"
    [ "$DRY_RUN" = 1 ] && return
    local v
    v=$(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null) || v="not importable"
    row "PyTorch" "INFO" "" "" "" "$v"
    v=$(ldd ./train_gpt 2>/dev/null | awk '/nccl|cudart/ { printf "%s ", $1 }')
    # cuBLASLt is loaded on first use (llmc/cuda/common.cuh's lt()): the soname the loader's cache holds
    v+=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\./ { printf "%s (dlopen) ", $1; exit }')
    row "libraries" "INFO" "" "" "" "${v:-ldd found none}"
}

quick_ops() {
    echo "== quick: test_gpu, one process per filter"
    local f rc log summary
    for f in $TEST_GPU_FILTERS; do
        log="$WORK/test_gpu_$f.log"
        step "test_gpu $f" 60 env LLMC_GPU_DIGEST="$WORK/digest_$f" build/test_gpu "$f" >"$log" 2>&1
        rc=$?
        [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && continue
        summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n1)
        if [ $rc -eq 0 ] && [ -n "$summary" ]; then
            row "test_gpu $f" "PASS" "" "" "" "$summary"
        else
            row "test_gpu $f" "FAIL" "" "" "" "exit $rc; ${summary:-no summary}; $(grep -m1 -E '^FAIL|error|Error' "$log" | cut -c1-100)"
            grep -q 'cuBLASLt' "$log" && quick_lt_log "$f"
        fi
    done
}

# quick_lt_log FILTER: the filter again with cuBLASLt's own log (errors, trace and hints), for a
# refusal whose reason only cuBLASLt knows (fp8 on an H200, 2026-11-26: every candidate refused)
quick_lt_log() {
    local lt="$WORK/cublaslt_$1.log"
    step "test_gpu $1 (CUBLASLT_LOG_LEVEL=3)" 20 env CUBLASLT_LOG_LEVEL=3 CUBLASLT_LOG_FILE="$lt" \
        build/test_gpu "$1" >/dev/null 2>&1
    [ -s "$lt" ] && row "cuBLASLt log of test_gpu $1" "INFO" "" "" "" \
        "$(grep -m2 -iE 'error|fail|not supported|hint' "$lt" | cut -c1-200) (all: $lt)"
}

quick_parity() {
    echo "== quick: the whole model, GPU against CPU"
    local arch run tol res extra
    for arch in gpt2 llama; do
        extra=""; [ $arch = llama ] && extra="model.n_kv_head=2"
        for run in cpu_fp32 cuda_fp32 cuda_bf16 cpu_fp16 cuda_fp16; do
            mkdir -p "$Q/parity_${arch}_$run"
            step "parity $arch $run" 40 ./train_gpt - device=${run%_*} precision=${run#*_} model.arch=$arch $extra \
                model.n_layer=4 model.n_head=4 model.d_model=128 model.vocab_size=512 model.max_seq_len=64 \
                data.train="$Q/tiny_*.bin" train.micro_batch=4 train.seq_len=64 train.grad_accum=2 train.steps=10 \
                train.lr=1e-3 checkpoint.every=0 checkpoint.resume=never out.format=llmc \
                out_dir="$Q/parity_${arch}_$run" >"$Q/parity_${arch}_$run.txt" 2>&1
        done
        [ "$DRY_RUN" = 1 ] && continue
        for run in cuda_fp32 cuda_bf16; do
            tol=1e-4; [ $run = cuda_bf16 ] && tol=2e-2
            loss_tol_row "parity $arch ${run#*_}: losses GPU vs CPU" "$Q/parity_${arch}_cpu_fp32/log.jsonl" \
                "$Q/parity_${arch}_$run/log.jsonl" $tol
        done
        # fp16 against the CPU's exact emulation of it (on the emulator of CI: 4.4e-5 apart)
        loss_tol_row "parity $arch fp16: losses GPU vs CPU fp16" "$Q/parity_${arch}_cpu_fp16/log.jsonl" \
            "$Q/parity_${arch}_cuda_fp16/log.jsonl" 1e-3
    done
    # train.cuda_graphs: the bf16 GPT-2 run again with graphs, bitwise the run without
    local g="$Q/parity_gpt2_cuda_bf16_graphs"
    mkdir -p "$g"
    step "parity gpt2 cuda_bf16 cuda_graphs" 40 ./train_gpt - device=cuda precision=bf16 model.arch=gpt2 \
        model.n_layer=4 model.n_head=4 model.d_model=128 model.vocab_size=512 model.max_seq_len=64 \
        data.train="$Q/tiny_*.bin" train.micro_batch=4 train.seq_len=64 train.grad_accum=2 train.steps=10 \
        train.lr=1e-3 checkpoint.every=0 checkpoint.resume=never out.format=llmc train.cuda_graphs=true \
        out_dir="$g" >"$g.txt" 2>&1
    [ "$DRY_RUN" = 1 ] && return
    local modes
    modes=$(grep -o '"cuda_graph":"[a-z-]*' "$g/log.jsonl" 2>/dev/null | cut -d'"' -f4 | sort | uniq -c | tr -s ' \n' ' ')
    if cmp -s <(grep -o '"loss":[^,}]*' "$Q/parity_gpt2_cuda_bf16/log.jsonl") <(grep -o '"loss":[^,}]*' "$g/log.jsonl") &&
        cmp -s "$Q/parity_gpt2_cuda_bf16/model_00000010.bin" "$g/model_00000010.bin"; then
        row "parity gpt2 bf16: cuda_graphs bitwise the plain run" "PASS" "" "" "" "losses and final weights; steps:$modes"
    else
        row "parity gpt2 bf16: cuda_graphs bitwise the plain run" "FAIL" "" "" "" \
            "steps:$modes; $(grep -m1 -iE 'error|abort' "$g.txt" | cut -c1-120)"
    fi
}

# quick_saves: saves across processes on the GPU (PieceServer, llmc/train/layout.h: each rank sends
# world rank 0 the chunks it holds, read from its device memory; checkpoint.async: each rank's
# snapshot, served on a thread). The parity runs' GPT-2 in bf16 at tp=2 over mpirun, checkpoints
# at steps 3 and 6: resumed from step 3 it ends bitwise the uninterrupted run (losses and final
# weights); with checkpoint.async its checkpoints and final weights are the same bytes.
quick_saves() {
    echo "== quick: saves across processes (tp=2 over mpirun on the one GPU)"
    local s="$Q/saves" name
    mkdir -p "$s"
    if [ "$DRY_RUN" != 1 ] && ! command -v mpirun >/dev/null 2>&1; then
        row "saves tp=2" "FAIL" "" "" "" "no mpirun"
        return
    fi
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local run=(mpirun --oversubscribe -np 2 ./train_gpt - device=cuda precision=bf16 model.arch=gpt2 model.n_layer=4
        model.n_head=4 model.d_model=128 model.vocab_size=512 model.max_seq_len=64 data.train="$Q/tiny_*.bin" data.val=
        tokenizer= eval.every=0 eval.sample_every=0 train.micro_batch=4 train.seq_len=64 train.grad_accum=2
        train.steps=6 train.lr=1e-3 checkpoint.every=3 checkpoint.keep=5 out.format=llmc parallel.tp=2)
    step "saves tp=2" 30 "${run[@]}" out_dir="$s/full" >"$s/full.txt" 2>&1
    step "saves tp=2 resumed" 30 "${run[@]}" checkpoint.resume="$s/full/checkpoints/step_00000003" out_dir="$s/res" \
        >"$s/res.txt" 2>&1
    step "saves tp=2 async" 30 "${run[@]}" checkpoint.async=true out_dir="$s/async" >"$s/async.txt" 2>&1
    [ "$DRY_RUN" = 1 ] && return
    name="saves tp=2: resumed from step 3, bitwise the run"
    if [ ! -f "$s/full/model_00000006.bin" ] || [ ! -f "$s/res/model_00000006.bin" ]; then
        row "$name" "FAIL" "" "" "" "$(grep -h -m1 -iE 'error|abort' "$s/full.txt" "$s/res.txt" | cut -c1-120)"
    elif cmp -s <(grep -o '"loss":[^,}]*' "$s/full/log.jsonl" | tail -n 3) <(grep -o '"loss":[^,}]*' "$s/res/log.jsonl") &&
        cmp -s "$s/full/model_00000006.bin" "$s/res/model_00000006.bin"; then
        row "$name" "PASS" "" "" "" "losses of steps 4-6 and final weights"
    else
        row "$name" "FAIL" "" "" "" "the losses or final weights differ"
    fi
    name="saves tp=2: checkpoint.async the same bytes"
    local f same=1
    for f in checkpoints/step_00000003/model.bin checkpoints/step_00000006/model.bin model_00000006.bin; do
        cmp -s "$s/full/$f" "$s/async/$f" || same=0
    done
    # state.bin after its 32-byte header and metadata (header int32 #2; the metadata holds the
    # config, which differs), as test/e2e/lib.sh's tensors
    arrays() { tail -c +$((33 + $(od -An -t d4 -j 8 -N 4 "$1" | tr -d ' '))) "$1"; }
    local a b
    for f in 3 6; do
        a="$s/full/checkpoints/step_0000000$f/state.bin" b="$s/async/checkpoints/step_0000000$f/state.bin"
        [ -f "$a" ] && [ -f "$b" ] && cmp -s <(arrays "$a") <(arrays "$b") || same=0
    done
    if [ $same = 1 ]; then
        row "$name" "PASS" "" "" "" "model.bin and state.bin's arrays at steps 3 and 6, final weights"
    else
        row "$name" "FAIL" "" "" "" "files differ or missing $(grep -m1 -iE 'error|abort' "$s/async.txt" | cut -c1-100)"
    fi
}

# quick_bench NAME "MODEL KEYS" B PREC: train_gpt's row; the PyTorch peer's at the same shape (bf16)
quick_bench() {  # name "model keys" B prec [nopeer: the PyTorch peer later, by quick_peer]
    local name=$1 model=$2 b=$3 prec=$4 out="$Q/bench_${1}_${4}_B$3" parsed peer=${5:-peer}
    echo "== quick: bench $name $prec B=$b"
    # shellcheck disable=SC2086
    # (the 1.5B runs took 42-48 s on the H200, most of it start-up: the row gives the run's seconds)
    local t0
    t0=$(date +%s)
    quick_train "bench $name $prec B=$b" "$([[ "$name" == gpt2_1558m* ]] && echo 90 || echo 60)" "$out" device=cuda precision=$prec $model train.micro_batch=$b \
        train.seq_len=1024 train.grad_accum=1 train.steps=$QUICK_STEPS train.lr=3e-4 train.lr_schedule=constant
    local rc=$? secs=$(( $(date +%s) - t0 ))
    [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && { [ "$peer" = nopeer ] || quick_peer "$name" "$model" "$b" "$prec"; return; }
    if [ $rc -eq 0 ] && [ -s "$out/log.jsonl" ]; then
        parsed=$(parse_log "$out/log.jsonl")
        local ms enq
        # medians from step 3 on: the step's wall time, and the host's time to queue it (enqueue_ms)
        median_of() { grep -o "\"$1\": *[0-9.eE+-]*" "$out/log.jsonl" | sed 's/.*: *//' | tail -n +3 | sort -g |
                      awk '{ a[NR] = $1 } END { if (NR) printf "%.1f", a[int((NR + 1) / 2)] }'; }
        ms=$(median_of ms)
        enq=$(median_of enqueue_ms)
        row "train_gpt $name $prec (B=$b, T=1024)" "PASS" "$(echo "$parsed" | cut -f1)" "$(echo "$parsed" | cut -f2)" \
            "$(grep -i 'peak' "$out/stdout.log" | tail -n1 | sed 's/^[[:space:]]*//' | cut -c1-40)" \
            "median ms/step $ms, host queuing $enq; run $secs s (start-up and $QUICK_STEPS steps)"
        eval "TOK_q_${name}_${prec}_$b=$(echo "$parsed" | cut -f1)"
        eval "MS_q_${name}_${prec}_$b=$ms"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        row "train_gpt $name $prec (B=$b)" "FAIL" "" "" "" "stopped at its time limit ($(limit_text)); $(grep -c '^step ' "$out/stdout.log") steps logged"
    else
        row "train_gpt $name $prec (B=$b)" "FAIL" "" "" "" "exit $rc: $(grep -m1 -iE 'error|out of memory' "$out/stdout.log" | cut -c1-100)"
    fi
    [ "$peer" = nopeer ] || quick_peer "$name" "$model" "$b" "$prec"
}

quick_peer() {  # name "model keys" B prec [limit]: the PyTorch peer once per shape (bf16; FP8 is compared with it)
    local name=$1 b=$3 prec=$4 out="$Q/torch_${1}_B$3" nl nh dm res tok limit=${5:-90}
    [ "$prec" = bf16 ] || return 0
    nl=$(echo "$2" | sed -n 's/.*model.n_layer=\([0-9]*\).*/\1/p'); nh=$(echo "$2" | sed -n 's/.*model.n_head=\([0-9]*\).*/\1/p')
    dm=$(echo "$2" | sed -n 's/.*model.d_model=\([0-9]*\).*/\1/p')
    step "PyTorch peer $name B=$b" "$limit" python3 dev/bench/torch_gpt2.py --n_layer "$nl" --n_head "$nh" --d_model "$dm" \
        --seq 1024 --batch "$b" --steps "$QUICK_STEPS" --warmup 3 >"$out.log" 2>&1
    local rc=$?
    [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && return 0
    res=$(grep '^RESULT ' "$out.log" | tail -n1)
    if [ -z "$res" ]; then
        row "PyTorch peer $name (B=$b)" "FAIL" "" "" "" "exit $rc: $(grep -m1 -iE 'error|Traceback' "$out.log" | cut -c1-100)"
        return 0
    fi
    tok=$(echo "$res" | sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p')
    # (the first warm-up step holds the compilation, or the load from the caches peer_prewarm filled)
    row "PyTorch peer $name bf16 (B=$(echo "$res" | sed -n 's/.*batch=\([^ ]*\).*/\1/p'), T=1024)" "PASS" "$tok" \
        "$(echo "$res" | sed -n 's/.*mfu=\([^ ]*\).*/\1/p' | awk '{ printf "%.1f%%", 100 * $1 }')" \
        "$(echo "$res" | sed -n 's/.*peak_mem_gib=\([^ ]*\).*/\1/p') GiB" \
        "$(echo "$res" | grep -q 'compiled=1' && echo compiled || echo eager); first step $(sed -n 's/^step 1: loss [^ ]* \([0-9.]*\) ms.*/\1/p' "$out.log") ms"
    local mine="TOK_q_${name}_bf16_$b"
    [ -n "${!mine:-}" ] && row "train_gpt / PyTorch ($name B=$b)" "INFO" "" "" "" \
        "$(awk -v a="${!mine}" -v b="$tok" 'BEGIN { printf "%.3f", a / b }')"
}

# The PyTorch peers' torch.compile ahead of their timed runs (each compiled for 30-130 s of the
# window: the 1.5B peer ran 94-133 s in all): one step of each peer shape in the background, in two
# lanes (the 1.5B shape's 43 GiB beside the 124M ones' 5 and 15, which an 80 GiB H100 holds too),
# while test_gpu and the parity runs check results (their times are not asked for), so that the
# timed peers load Inductor's caches (FX graph, AOTAutograd, Triton kernels) instead of compiling.
# Stopped, where not done, before the first timed run (peer_prewarm_end): nothing shares the GPU
# with a measurement. The peers' rows give their first step's time (the compilation's, or the load's).
PEER_LANES=("48 25 1600 8" "12 12 768 8,12 12 768 32")  # n_layer n_head d_model batch, a lane's shapes by commas
PREWARM_PIDS=()
# peer_shapes LANE...: the lanes' shapes, one a line; prewarm_log SHAPE: its log (L<layers>_B<batch>)
peer_shapes() { local lane; for lane in "$@"; do tr ',' '\n' <<<"$lane"; done; }
# shellcheck disable=SC2086
prewarm_log() { set -- $1; echo "$Q/prewarm_L$1_B$4.log"; }
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
peer_prewarm_start() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '[dry-run] %-44s <= %3ss: %s\n' "PyTorch peers compiled ahead (background)" 150 \
            "one step each, lanes: ${PEER_LANES[*]} (n_layer n_head d_model batch)" >&9
        return
    fi
    local lane  # (without torch each lane ends at once: its logs say so, the INFO row says "not")
    PREWARM_PIDS=()
    PREWARM_T0=$(date +%s)
    for lane in "${PEER_LANES[@]}"; do
        (
            while read -r spec; do  # (in the lane itself, not a pipeline's subshell: its timeout is the lane's child)
                # shellcheck disable=SC2086
                set -- $spec
                timeout -k 3 150 python3 dev/bench/torch_gpt2.py --n_layer "$1" --n_head "$2" --d_model "$3" \
                    --seq 1024 --batch "$4" --steps 1 --warmup 0 >"$(prewarm_log "$spec")" 2>&1 </dev/null
            done < <(peer_shapes "$lane")
        ) 9>&- &
        PREWARM_PIDS+=($!)
    done
}
# peer_prewarm_end: waits for the lanes (at most 45 s more, and never into the last 150 s of the
# deadline), then stops what still runs; an INFO row says which shapes were compiled
peer_prewarm_end() {
    [ "${#PREWARM_PIDS[@]}" -gt 0 ] || return 0
    local pid waited=0 running spec n=0 done_n=0 notes=""
    while [ $waited -lt 45 ] && [ "$(left)" -gt 150 ]; do
        running=0
        for pid in "${PREWARM_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
        [ $running = 0 ] && break
        sleep 1; waited=$((waited + 1))
    done
    for pid in "${PREWARM_PIDS[@]}"; do  # a lane (no next shape), then its timeout (which stops its python)
        local kids
        kids=$(pgrep -P "$pid" 2>/dev/null)
        kill "$pid" 2>/dev/null
        # shellcheck disable=SC2086
        [ -z "$kids" ] || kill $kids 2>/dev/null
    done
    for pid in "${PREWARM_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    while read -r spec; do
        # shellcheck disable=SC2086
        set -- $spec
        n=$((n + 1))
        if grep -qs '^RESULT ' "$(prewarm_log "$spec")"; then
            done_n=$((done_n + 1)); notes+="L$1 B$4 compiled; "
        else
            notes+="L$1 B$4 not; "
        fi
    done < <(peer_shapes "${PEER_LANES[@]}")
    row "PyTorch peers compiled ahead" "INFO" "" "" "" "$done_n of $n in $(( $(date +%s) - PREWARM_T0 )) s: ${notes%; }"
    PREWARM_PIDS=()
}

# find_ncu: on PATH or in the toolkit
find_ncu() {
    local c
    for c in "$(command -v ncu 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /usr/local/cuda/nsight-compute*/ncu; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    echo ncu
}

# kernel_table CSV STEPS WALL_MS_PER_STEP: rows of the kernels' shares from ncu's CSV
# (gpu__time_duration.sum per launch), the kernel time per step, and the host's share of the wall time
kernel_table() {
    local csv=$1 steps=$2 wall=$3
    awk -F'","' 'NR > 1 && $0 ~ /gpu__time_duration.sum/ {
            gsub(/[",]/, "", $NF); v = $NF + 0; name = $5  # ncu writes 5,000 for 5000
            sub(/\(.*/, "", name); unit = $(NF - 1)
            if (unit ~ /usecond/) v *= 1e3; else if (unit ~ /msecond/) v *= 1e6; else if (unit ~ /^second/) v *= 1e9
            t[name] += v; n[name]++; total += v }
         END { for (k in t) printf "%.6f\t%d\t%s\t%.3f\n", t[k] / total, n[k], k, t[k] / 1e6; printf "TOTAL\t%.3f\n", total / 1e6 }' \
        "$csv" | sort -t$'\t' -k1,1gr >"$csv.table"
    local total
    total=$(awk -F'\t' '$1 == "TOTAL" { print $2 }' "$csv.table")
    if [ -z "$total" ] || [ "$total" = "0.000" ]; then
        row "kernel table" "FAIL" "" "" "" "no gpu__time_duration rows in $csv"
        return
    fi
    local per_step
    per_step=$(awk -v t="$total" -v s="$steps" 'BEGIN { printf "%.1f", t / s }')
    row "kernel time per step" "INFO" "" "" "" "$per_step ms of kernels; $(awk -F'\t' '$1 != "TOTAL" { n += $2 } END { print n }' "$csv.table") launches in $steps steps"
    [ -n "$wall" ] && row "host share of the step" "INFO" "" "" "" \
        "$(awk -v k="$per_step" -v w="$wall" 'BEGIN { printf "%.0f%% (wall %s ms/step vs kernels %s ms)", 100 * (1 - k / w), w, k }')"
    grep -v '^TOTAL' "$csv.table" | head -n 15 | while IFS=$'\t' read -r share count name ms; do
        row "kernel $name" "INFO" "" "" "" "$(awk -v s="$share" 'BEGIN { printf "%.1f%%", 100 * s }') of kernel time, $ms ms, $count launches"
    done
}

# profile_run NAME CONFIG [key=value...]: two steps under ncu, then the kernel table
profile_run() {
    local name=$1 cfg=$2; shift 2
    local out="$WORK/profile_$name" ncu_bin
    mkdir -p "$out"
    ncu_bin=$(find_ncu)
    step "ncu $name" 120 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv \
        ./train_gpt "$cfg" "$@" train.steps=2 eval.every=0 eval.sample_every=0 checkpoint.every=0 \
        checkpoint.resume=never checkpoint.dir="$out/ckpt" out.format=none out_dir="$out" log.jsonl="$out/log.jsonl" \
        >"$out/ncu.csv" 2>"$out/stderr.log"
    local rc=$?
    [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && return 0
    if [ $rc -ne 0 ]; then
        row "ncu $name" "FAIL" "" "" "" "exit $rc: $(grep -m1 -iE 'error' "$out/stderr.log" "$out/ncu.csv" | cut -c1-100)"
        return 0
    fi
    # the wall time of a step without the profiler: the bench run of the same shape when there was one
    kernel_table "$out/ncu.csv" 2 "${PROFILE_WALL_MS:-}"
}

stage_quick() {
    [ -n "$DEADLINE" ] || DEADLINE=$(( $(date +%s) + ${QUICK_SECONDS:-330} ))
    local start=$(date +%s)
    local m124="model.arch=gpt2 model.n_layer=12 model.n_head=12 model.d_model=768 model.vocab_size=50257 model.max_seq_len=1024"
    local m1558="model.arch=gpt2 model.n_layer=48 model.n_head=25 model.d_model=1600 model.vocab_size=50257 model.max_seq_len=1024"
    quick_env
    quick_data
    peer_prewarm_start
    quick_ops
    quick_parity
    quick_saves
    peer_prewarm_end
    quick_bench gpt2_124m "$m124" 8 bf16
    quick_bench gpt2_124m "$m124" 32 bf16
    quick_bench gpt2_124m "$m124" 32 fp16
    # the kernel table of 124M B=8, its host share against the bench run's ms/step
    PROFILE_WALL_MS=${MS_q_gpt2_124m_bf16_8:-}
    # shellcheck disable=SC2086
    profile_run gpt2_124m_B8 - device=cuda precision=bf16 $m124 train.micro_batch=8 train.seq_len=1024 \
        train.grad_accum=1 data.train="$Q/bench_*.bin" data.val= tokenizer=
    # the 1.5B shape last, its PyTorch peer at the very end: torch.compile of 48 layers took 133 s
    # on the H200 (2026-11-27; a 90 s limit cut it, and the fp8 row after it found no time left)
    quick_bench gpt2_1558m "$m1558" 8 bf16 nopeer
    quick_bench gpt2_1558m "$m1558" 8 fp8 nopeer
    if [ -n "${TOK_q_gpt2_1558m_bf16_8:-}" ] && [ -n "${TOK_q_gpt2_1558m_fp8_8:-}" ]; then
        row "fp8 / bf16 (gpt2_1558m B=8)" "INFO" "" "" "" \
            "$(awk -v a="$TOK_q_gpt2_1558m_fp8_8" -v b="$TOK_q_gpt2_1558m_bf16_8" 'BEGIN { printf "%.3f (target 1.3)", a / b }')"
    fi
    # train.cuda_graphs (off by default until measured): B=8, where the host's share is the largest
    # (after the 1.5B rows, which FP8's ratio needs, before the 1.5B peer, measured before)
    quick_bench gpt2_124m_graphs "$m124 train.cuda_graphs=true" 8 bf16 nopeer
    if [ -n "${TOK_q_gpt2_124m_graphs_bf16_8:-}" ] && [ -n "${TOK_q_gpt2_124m_bf16_8:-}" ]; then
        row "cuda_graphs / plain (gpt2_124m B=8)" "INFO" "" "" "" \
            "$(awk -v a="$TOK_q_gpt2_124m_graphs_bf16_8" -v b="$TOK_q_gpt2_124m_bf16_8" 'BEGIN { printf "%.3f", a / b }')"
    fi
    # the 1.5B peer compiles for about a minute and ran 94-133 s in the third and fourth windows:
    # started only with the time to finish (else a SKIP row, the deadline left to the later stages);
    # compiled ahead (peer_prewarm), it loads from the caches: 60 s are asked for then
    local need=140
    grep -qs '^RESULT ' "$(prewarm_log "48 25 1600 8")" && need=60
    if [ "$DRY_RUN" = 1 ] || [ "$(left)" -ge $need ]; then
        quick_peer gpt2_1558m "$m1558" 8 bf16 180
    else
        row "PyTorch peer gpt2_1558m (B=8)" "SKIP" "" "" "" "needs about $need s; $(left) s left"
    fi
    [ "$DRY_RUN" = 1 ] || echo "gpu_check --quick: $(( $(date +%s) - start )) s"
}

# ncu_stalls KIND VERSION HS NH: why a flash kernel runs at a fraction of the tensor cores (issue 30:
# the backward at HS 64 and the forward at HS 128 are SDPA's furthest behind): each kernel of
# dev/cuda/attention_KIND VERSION once (B=8 T=1024) under ncu's warp-state, occupancy and compute
# sections, a row each with its registers, occupancy, cycles between issues and what ncu's rules
# say stalls it; the sections' text is in the logs (ncu_flash_KIND_vVER_HS*.txt)
ncu_stalls() {
    local kind=$1 ver=$2 hs=$3 nh=$4 log="$WORK/ncu_flash_$1_v$2_HS$3.txt" rc
    step "ncu flash $kind v$ver HS $hs: stalls" 50 "$(find_ncu)" --clock-control none -k "regex:flash_$kind" \
        --launch-count 2 --section WarpStateStats --section Occupancy --section LaunchStats \
        --section ComputeWorkloadAnalysis dev/cuda/attention_"$kind" "$ver" 8 1024 "$nh" "$hs" >"$log" 2>&1
    rc=$?
    [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && return
    if [ $rc -ne 0 ] || ! grep -q "flash_$kind" "$log"; then
        row "ncu flash $kind v$ver HS $hs" "FAIL" "" "" "" "exit $rc: $(grep -m1 -iE 'error' "$log" | cut -c1-100)"
        return
    fi
    # a row per kernel: its name, then the metrics and the stall sentences of its sections
    awk '/flash_[a-z_]*kernel/ && /Context/ { if (k) print k "\t" m; k = $1; sub(/<.*/, "", k); m = ""; next }
         /Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Issue Slots Busy|SM Busy/ {
             line = $0; gsub(/  +/, " ", line); m = m ";" line; next }
         /stalled|Stall/ { line = $0; gsub(/^ +| +$/, "", line); m = m "; " substr(line, 1, 160) }
         END { if (k) print k "\t" m }' "$log" |
        while IFS=$'\t' read -r k m; do row "ncu $k v$ver (HS $hs)" "INFO" "" "" "" "${m#;}"; done
}

# B T NH HS per shape: GPT-2 124M's, then FlashAttention's benchmark shapes (d_model 2048)
ATTN_SHAPES=${ATTN_SHAPES:-"8 1024 12 64 8 1024 32 64 8 1024 16 128"}
# kernel_row NAME LOG RC: a PASS row with the log's timing lines, or a FAIL row
kernel_row() {
    local res
    res=$(grep -E '[0-9.]+ ms' "$2" | sed 's/^[[:space:]]*//' | tr '\n' ';' | sed 's/;$//')
    if [ "$3" -eq 0 ] && [ -n "$res" ]; then
        row "$1" "PASS" "" "" "" "$res"
    else
        row "$1" "FAIL" "" "" "" "exit $3; ${res:-no time}; $(grep -m1 -iE 'mismatch|error|max|FAIL' "$2" | cut -c1-100)"
    fi
}
# attn_runs: dev/cuda's attention programs VERSIONS at every shape of ATTN_SHAPES (those of head
# size ONLY_HS where it is set), a row each (each shape's CPU reference computed by the first version
# and read back from /tmp by the others: dev/cuda/common.h's cached_reference)
attn_runs() {
    local b t nh hs v kind ver log rc
    # shellcheck disable=SC2086
    set -- $ATTN_SHAPES
    while [ $# -ge 4 ]; do
        b=$1; t=$2; nh=$3; hs=$4; shift 4
        [ -z "${ONLY_HS:-}" ] || [ "$hs" = "$ONLY_HS" ] || continue
        for v in "${VERSIONS[@]}"; do
            kind=${v% *}; ver=${v#* }
            log="$WORK/attention_${kind}_v${ver}_B${b}_T${t}_NH${nh}_HS${hs}.log"
            step "attention $kind v$ver B=$b T=$t NH=$nh HS=$hs" 60 dev/cuda/attention_$kind "$ver" "$b" "$t" "$nh" "$hs" >"$log" 2>&1
            rc=$?
            [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && continue
            kernel_row "attention $kind v$ver B=$b T=$t NH=$nh HS=$hs" "$log" $rc
        done
    done
}
# kernel_run "PROGRAM ARGS": one of dev/cuda's programs (one minute at most), its row
kernel_run() {
    local v=$1 log rc
    log="$WORK/kernel_$(echo "$v" | tr ' ' '_').log"
    # shellcheck disable=SC2086
    step "$v" 60 dev/cuda/$v >"$log" 2>&1
    rc=$?
    [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ] && return
    kernel_row "$v" "$log" $rc
}
stage_kernels() {
    [ -n "$DEADLINE" ] || DEADLINE=$(( $(date +%s) + ${QUICK_SECONDS:-170} ))
    local log rc v
    local -a VERSIONS
    # attention first: at each shape the trainer's versions and Hopper's wgmma ones beside them
    # (forward v5, v7 and v8 (pipelined), backward v6, v10, v11 (pipelined) and v12 (K and V from
    # shared memory) at head size 64; forward v4, v7 and v8, backward v3, v9 and v12 at 128; forward
    # v10 and backward v13, V, K, Q and dO read MN-major, at both, and v15, v11 so, at 64; backward
    # v11 at 128 too: its dQ kernel pipelined, Q and dO from shared memory), then
    # PyTorch's SDPA at the same shapes (the peer), then the other versions in question (backward v9, forward v9 and backward
    # v14 at 64, v8: one kernel, dQ in fp32 accumulators, v7: dQ from dS^T in memory; forward v5 at
    # 128, where its two m-tiles ran 192 TFLOP/s in the fourth window against v4's 173 in the third;
    # forward v6: 128-key tiles, at 64), ncu's stall rows (the trainer's backward at HS 64, v8,
    # forward v7 and v8, the forward's two m-tiles at HS 128), then backward v4, v5
    VERSIONS=("forward 5" "forward 7" "forward 8" "forward 10" "backward 6" "backward 10" "backward 11" "backward 12"
              "backward 13" "backward 15")
    ONLY_HS=64 attn_runs
    VERSIONS=("forward 4" "forward 7" "forward 8" "forward 10" "backward 3" "backward 9" "backward 11" "backward 12"
              "backward 13")
    ONLY_HS=128 attn_runs
    log="$WORK/torch_attention.log"
    # shellcheck disable=SC2086
    step "PyTorch SDPA" 90 python3 dev/bench/torch_attention.py $ATTN_SHAPES >"$log" 2>&1
    rc=$?
    if ! { [ "$DRY_RUN" = 1 ] || [ $rc -eq 125 ]; }; then
        grep -q '^TORCH_ATTN' "$log" || row "PyTorch SDPA" "FAIL" "" "" "" "exit $rc: $(grep -m1 -iE 'error|Traceback' "$log" | cut -c1-100)"
        while read -r res; do
            row "PyTorch SDPA $(echo "$res" | cut -d' ' -f2-5)" "PASS" "" "" "" "$(echo "$res" | cut -d' ' -f6-)"
        done < <(grep '^TORCH_ATTN' "$log")
    fi
    # the cross entropy with the row kept in shared memory (issue 29; v6 checks itself bitwise
    # against v5 and times v5 beside it: one process), at 124M B=8's 8192 rows (the host's inputs and
    # CPU check of 32768 rows take tens of seconds)
    kernel_run "classifier 6 8192 50257 50304"
    VERSIONS=("backward 9" "forward 9" "backward 14")
    ONLY_HS=64 attn_runs
    VERSIONS=("backward 8" "backward 7")
    attn_runs
    VERSIONS=("forward 5")
    ONLY_HS=128 attn_runs
    VERSIONS=("forward 6")
    ONLY_HS=64 attn_runs
    ncu_stalls backward 6 64 12
    ncu_stalls backward 8 64 12
    ncu_stalls forward 7 64 12
    ncu_stalls forward 8 64 12
    ncu_stalls forward 5 128 16
    VERSIONS=("backward 4" "backward 5")
    attn_runs
    # fp8 (issue 31: fp8_cast v4, the output-gradient cast with the GELU backward and the bias
    # gradient, is the one in question; v1-v3 were timed in the fourth window), LayerNorm's
    # backward with the row in registers (v6) against v5 at the 1.5B and 124M B=32 shapes, then the
    # memory-bound kernels of issue 29 at 124M B=32 (the old version, then the new; the old cross
    # entropy's CPU check alone takes tens of seconds)
    for v in "fp8_cast 4" "layernorm 6 8192 1600" "layernorm 5 8192 1600" "layernorm 6 32768 768" "fp8_cast 3" \
             "fp8_gemm 6400 8192 1600" "fp8_gemm 48 32 64" "matmul_epilogue 5" "matmul_epilogue 7" "matmul_epilogue 8" \
             "matmul_epilogue 6" "layernorm 5 32768 768" "classifier 5 32768 50257 50304" "matmul_epilogue 1" \
             "matmul_epilogue 2" "matmul_epilogue 3" "matmul_epilogue 4" "layernorm 3 32768 768" \
             "classifier 3 32768 50257 50304"; do
        kernel_run "$v"
    done
}

# `--variants`: the training step with each kernels.* way a GPU has not yet chosen (config
# section "kernels"), beside the default in the same call: GPT-2 124M bf16 B=32 with the flash
# forward and backward both pipelined on wgmma with V, K, Q and dO read MN-major (forward v10,
# backward v15) and transposed (v8, v11), then the forward on wgmma alone (v7, v8), the backward
# (v10, v11: pipelined, v12: K and V from shared memory) and its dQ alone (v9), in one kernel (v8)
# and from dS (v7), and the forward's 128-key tiles (v6); then the 1.5B shape in bf16 with
# LayerNorm's backward streamed (the default keeps rows in registers) when the time allows.
# A ratio row each (variant / default): above 1, the default should follow.
variant_ratio() {  # label TOK_variant TOK_default
    [ -n "$2" ] && [ -n "$3" ] || return 0
    row "$1" "INFO" "" "" "" "$(awk -v a="$2" -v b="$3" 'BEGIN { printf "%.3f (variant / default)", a / b }')"
}
stage_variants() {
    [ -n "$DEADLINE" ] || DEADLINE=$(( $(date +%s) + ${QUICK_SECONDS:-170} ))
    local m124="model.arch=gpt2 model.n_layer=12 model.n_head=12 model.d_model=768 model.vocab_size=50257 model.max_seq_len=1024"
    local m1558="model.arch=gpt2 model.n_layer=48 model.n_head=25 model.d_model=1600 model.vocab_size=50257 model.max_seq_len=1024"
    quick_data
    quick_bench gpt2_124m "$m124" 32 bf16 nopeer
    # first both pipelined ways together, V, K, Q and dO MN-major and transposed (the candidates for a
    # new default), then each way alone
    local pipe="kernels.attention_forward=wgmma_pipelined kernels.attention_backward=wgmma_pipelined"
    quick_bench gpt2_124m_wgmma_all_mn "$m124 $pipe kernels.attention_wgmma_layout=mn_major" 32 bf16 nopeer
    variant_ratio "attention_forward=wgmma_pipelined, attention_backward=wgmma_pipelined, mn_major (gpt2_124m B=32)" \
        "${TOK_q_gpt2_124m_wgmma_all_mn_bf16_32:-}" "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_all "$m124 $pipe" 32 bf16 nopeer
    variant_ratio "attention_forward=wgmma_pipelined, attention_backward=wgmma_pipelined (gpt2_124m B=32)" \
        "${TOK_q_gpt2_124m_wgmma_all_bf16_32:-}" "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma "$m124 kernels.attention_forward=wgmma" 32 bf16 nopeer
    variant_ratio "kernels.attention_forward=wgmma (gpt2_124m B=32)" "${TOK_q_gpt2_124m_wgmma_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_pipe "$m124 kernels.attention_forward=wgmma_pipelined" 32 bf16 nopeer
    variant_ratio "kernels.attention_forward=wgmma_pipelined (gpt2_124m B=32)" \
        "${TOK_q_gpt2_124m_wgmma_pipe_bf16_32:-}" "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_bwd "$m124 kernels.attention_backward=wgmma" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=wgmma (gpt2_124m B=32)" "${TOK_q_gpt2_124m_wgmma_bwd_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_bwd_pipe "$m124 kernels.attention_backward=wgmma_pipelined" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=wgmma_pipelined (gpt2_124m B=32)" \
        "${TOK_q_gpt2_124m_wgmma_bwd_pipe_bf16_32:-}" "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_ss "$m124 kernels.attention_backward=wgmma_ss" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=wgmma_ss (gpt2_124m B=32)" "${TOK_q_gpt2_124m_wgmma_ss_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_wgmma_dq "$m124 kernels.attention_backward=wgmma_dq" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=wgmma_dq (gpt2_124m B=32)" "${TOK_q_gpt2_124m_wgmma_dq_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_fused "$m124 kernels.attention_backward=fused" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=fused (gpt2_124m B=32)" "${TOK_q_gpt2_124m_fused_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_dq_from_ds "$m124 kernels.attention_backward=dq_from_ds" 32 bf16 nopeer
    variant_ratio "kernels.attention_backward=dq_from_ds (gpt2_124m B=32)" "${TOK_q_gpt2_124m_dq_from_ds_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    quick_bench gpt2_124m_keys128 "$m124 kernels.attention_forward=keys128" 32 bf16 nopeer
    variant_ratio "kernels.attention_forward=keys128 (gpt2_124m B=32)" "${TOK_q_gpt2_124m_keys128_bf16_32:-}" \
        "${TOK_q_gpt2_124m_bf16_32:-}"
    if [ "$DRY_RUN" = 1 ] || [ "$(left)" -ge 110 ]; then
        quick_bench gpt2_1558m "$m1558" 8 bf16 nopeer
        quick_bench gpt2_1558m_ln_streamed "$m1558 kernels.layernorm_backward=streamed" 8 bf16 nopeer
        variant_ratio "kernels.layernorm_backward=streamed (gpt2_1558m B=8)" \
            "${TOK_q_gpt2_1558m_ln_streamed_bf16_8:-}" "${TOK_q_gpt2_1558m_bf16_8:-}"
    else
        row "variants at the 1.5B shape" "SKIP" "" "" "" "needs about 100 s; $(left) s left"
    fi
}

stage_profile() {
    [ -n "$DEADLINE" ] || DEADLINE=$(( $(date +%s) + ${QUICK_SECONDS:-170} ))
    PROFILE_WALL_MS=""
    profile_run "$(basename "${PROFILE_ARGS[0]}" .json)" "${PROFILE_ARGS[@]}"
}
