# scripts/gpu_check.sh names its six stages in order (--list, no GPU needed), refuses an unknown
# stage (exit 2, naming it), and on a machine without a GPU refuses to run a stage (exit 1).
source "$(dirname "$0")/lib.sh"
G="$ROOT/scripts/gpu_check.sh"
out=$(bash "$G" --list) || die "--list failed"
[ "$(echo "$out" | awk '{print $1}' | tr '\n' ' ')" = "env ops parity bench layouts fp8 " ] || die "--list: $out"
expect_fail 2 "unknown stage 'nope'" bash "$G" --stage nope
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    err=$(bash "$G" --stage env --out "$W/o" 2>&1) && die "--stage env ran without a GPU: $err"
    echo "$err" | grep -q 'no NVIDIA GPU visible.*stage env needs one' || die "--stage env without a GPU: $err"
    [ ! -e "$W/o" ] || die "--stage env without a GPU wrote $W/o"
fi
# the bench stage's PyTorch peer: valid Python everywhere; where torch imports, a tiny run on
# whatever device there is ends with the RESULT line the stage parses
python3 -m py_compile "$ROOT/dev/bench/torch_gpt2.py" || die "dev/bench/torch_gpt2.py does not compile"
for py in python3 /usr/bin/python3; do
    if "$py" -c 'import torch' 2>/dev/null; then
        res=$("$py" "$ROOT/dev/bench/torch_gpt2.py" --n_layer 2 --n_head 2 --d_model 64 --vocab 512 --seq 64 \
              --batch 2 --steps 2 --warmup 1 --no-compile 2>&1 | tail -n1)
        echo "$res" | grep -qE '^RESULT tokens_per_s=[0-9.]+ .*batch=2 ' || die "torch_gpt2.py ($py): $res"
        echo "PyTorch peer ($py): $res"
        break
    fi
done
echo "gpu_check --list: $(echo "$out" | wc -l) stages"

# --quick --dry-run (issue 26): every step printed with its time limit, nothing run or written:
# the data, test_gpu once per filter, the parity runs, the benches with their PyTorch peers, ncu
before=$(md5sum "$ROOT/dev/bench/RESULTS.md")
dry=$(bash "$G" --quick --dry-run --out "$W/q") || die "--quick --dry-run failed: $dry"
[ "$(md5sum "$ROOT/dev/bench/RESULTS.md")" = "$before" ] || die "--dry-run wrote dev/bench/RESULTS.md"
[ ! -e "$W/q" ] || die "--dry-run wrote --out"
# the filter list of scripts/gpu_quick.sh is test_gpu's (test/gpu/test_gpu.cu: run(op, filter) and want(filter))
filters=$(grep -oE 'run\("[a-z_0-9]+", "[a-z_0-9]+"|want\("[a-z_0-9]+"\)' "$ROOT/test/gpu/test_gpu.cu" |
          sed -E 's/.*"([a-z_0-9]+)"\)?$/\1/' | sort -u)
for f in $filters; do
    grep -qE "^\[dry-run\] test_gpu $f +<=" <<<"$dry" || die "--quick runs no 'test_gpu $f'"
done
for s in "data: synthetic shards" "parity gpt2 cuda_bf16" "parity llama cuda_fp32" "bench gpt2_124m bf16 B=8" \
         "bench gpt2_124m bf16 B=32" "bench gpt2_1558m bf16 B=8" "bench gpt2_1558m fp8 B=8" \
         "PyTorch peer gpt2_124m B=32" "PyTorch peer gpt2_1558m B=8" "ncu gpt2_124m_B8"; do
    grep -qF "[dry-run] $s " <<<"$dry" || die "--quick --dry-run lacks the step '$s'"
done
n=$(echo "$dry" | grep -c '^\[dry-run\]')
echo "gpu_check --quick --dry-run: $n steps ($(echo "$filters" | wc -w) test_gpu filters)"
# the PyTorch peers compiled ahead: started before test_gpu, over before the first timed run
order=$(grep -nE '^\[dry-run\] (PyTorch peers compiled ahead|test_gpu ptx|bench gpt2_124m bf16 B=8) ' <<<"$dry" | cut -d: -f1 | tr '\n' ' ')
awk '{ exit !(NF == 3 && $1 < $2 && $2 < $3) }' <<<"$order" ||
    die "the peers' compilation ahead is not between the data and test_gpu: lines $order"
# ... its plumbing, with a stand-in python3: the 124M shapes compile in a second, the 1.5B one would
# take a minute and is stopped when the wait reaches the deadline's last 150 s; nothing is left running
mkdir -p "$W/shim"
cat > "$W/shim/python3" <<'PY'
#!/usr/bin/env bash
[ "$1" = -c ] && exit 0
case "$*" in *"--n_layer 48"*) sleep 60 ;; *) sleep 1 ;; esac
echo "RESULT tokens_per_s=1 mfu=0.1 peak_mem_gib=1 batch=8 torch=stand-in compiled=1"
PY
chmod +x "$W/shim/python3"
pw=$( row() { echo "ROW|$1|$2|$6"; }; DRY_RUN=0; source "$ROOT/scripts/gpu_quick.sh"; Q="$W/pw"; mkdir -p "$Q"
      PATH="$W/shim:$PATH"; DEADLINE=$(( $(date +%s) + 158 )); peer_prewarm_start; sleep 3; peer_prewarm_end
      if pgrep -f "$W/shim/python3" >/dev/null; then echo "a stand-in peer still runs after peer_prewarm_end"; fi )
grep -qE '^ROW\|PyTorch peers compiled ahead\|INFO\|2 of 3 in [0-9]+ s: L48 B8 not; L12 B8 compiled; L12 B32 compiled$' <<<"$pw" &&
    ! grep -q 'still runs' <<<"$pw" || die "peers compiled ahead: $pw"
echo "PyTorch peers compiled ahead: between the data and test_gpu, stopped before the first timed run"
prof=$(bash "$G" --profile "$ROOT/configs/tiny_cpu.json" train.micro_batch=2 --dry-run 2>&1) && die "--profile took --dry-run after the config's overrides: $prof"
prof=$(bash "$G" --dry-run --profile "$ROOT/configs/tiny_cpu.json" train.micro_batch=2) || die "--profile --dry-run: $prof"
grep -qE '^\[dry-run\] ncu tiny_cpu .*--clock-control none .*configs/tiny_cpu.json train.micro_batch=2 train.steps=2' \
    <<<"$prof" || die "--profile --dry-run: $prof"
expect_fail 2 "no config file 'nope.json'" bash "$G" --profile nope.json

# the kernel table from ncu's CSV: shares of kernel time, units converted, kernel time against wall time
cat > "$W/ncu.csv" <<'CSV'
==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","train_gpt","127.0.0.1","attention_forward_kernel<__nv_bfloat16, 64, 64>(const float *, int)","1","7","(128, 1, 1)","(16, 12, 8)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","30"
"1","1","train_gpt","127.0.0.1","adamw_kernel(float *)","1","7","(512, 1, 1)","(96, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","5,000"
"2","1","train_gpt","127.0.0.1","adamw_kernel(float *)","1","7","(512, 1, 1)","(96, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","5000000"
CSV
table=$( row() { echo "ROW|$1|$2|$6"; }; DRY_RUN=0; source "$ROOT/scripts/gpu_quick.sh"; kernel_table "$W/ncu.csv" 2 40 )
grep -qF 'ROW|kernel time per step|INFO|20.0 ms of kernels; 3 launches in 2 steps' <<<"$table" || die "kernel table: $table"
grep -qF 'ROW|host share of the step|INFO|50% (wall 40 ms/step vs kernels 20.0 ms)' <<<"$table" || die "kernel table: $table"
grep -qF 'ROW|kernel attention_forward_kernel<__nv_bfloat16, 64, 64>|INFO|75.0% of kernel time, 30.000 ms, 1 launches' <<<"$table" || die "kernel table: $table"
grep -qF 'ROW|kernel adamw_kernel|INFO|25.0% of kernel time, 10.000 ms, 2 launches' <<<"$table" || die "kernel table: $table"
echo "kernel table from ncu's CSV: shares and host share as computed by hand"

# the global deadline: a step's limit is the smaller of its own and what is left less 5 s; under 5 s
# left, a SKIP row instead of the step
dl=$( row() { echo "ROW|$1|$2|$6"; }; DRY_RUN=0; source "$ROOT/scripts/gpu_quick.sh"
      DEADLINE=$(( $(date +%s) + 12 )); echo "limit $(tlimit 420)"; step "short" 60 true && echo "short ran"
      DEADLINE=$(( $(date +%s) + 8 )); step "late" 60 true; echo "late: $?" )
grep -qE '^limit (6|7)$' <<<"$dl" || die "tlimit under a 12 s deadline: $dl"
grep -qx 'short ran' <<<"$dl" || die "a step within the deadline did not run: $dl"
grep -qE '^ROW\|late\|SKIP\|global deadline' <<<"$dl" && grep -qx 'late: 125' <<<"$dl" || die "a step past the deadline: $dl"
echo "global deadline: limits shrink to the time left, late steps are SKIP rows"
