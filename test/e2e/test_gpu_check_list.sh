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
