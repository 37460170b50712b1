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
echo "gpu_check --list: $(echo "$out" | wc -l) stages"
