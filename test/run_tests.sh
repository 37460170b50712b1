#!/usr/bin/env bash
# Runs every test: Catch2 unit tests (CPU), GPU op parity (where a CUDA device is present),
# and the end-to-end tests in test/e2e/ that drive the train_gpt binary.
# Ends with one line "N passed, M failed"; exit code 1 when anything failed.
# LLMC_BUILD (build) holds test_cpu, LLMC_BIN (empty: the repository root) prefixes train_gpt and
# the data tools: `make test SANITIZE=1` sets them to build-asan and LLMC_SANITIZE=1.
# E2E="test_a test_b" runs only those end-to-end tests; EMU=0 leaves out the CUDA emulator's tests.
# Each part prints its wall and CPU seconds; BESIDE_EMU's end-to-end tests run beside the emulator, the
# rest two at a time, ALONE's (which time themselves) one by one at the end.
# Every test writes its temporary files under a TMPDIR of this run's own: what a test leaves there
# (the tests, test_gpu_kit's kit scripts and OpenMPI's session folders use TMPDIR) fails the run.
set -u
cd "$(dirname "$0")/.."
export TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/llmc_tests.XXXXXX")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export LLMC_BIN=${LLMC_BIN:-}
B=${LLMC_BUILD:-build}
if [ "${LLMC_SANITIZE:-0}" = 1 ]; then
    # OpenMPI leaks by design (its own allocations live until exit): LeakSanitizer would report
    # every MPI run, so leak checking is off; ASan's memory errors and UBSan stay fatal.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:exitcode=99}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:exitcode=99}
fi
pass=0
fail=0
failed=()
# cpu_s: the CPU seconds (user + system) of the children this shell has waited for so far (cutime
# and cstime of /proc/$$/stat); the difference around a test is that test's CPU time, which other
# load on the machine changes far less than its wall time
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($16 + $17) / hz }' /proc/$$/stat; }
# selected NAME: the end-to-end test NAME is to run (E2E names the tests to run; empty: all)
selected() { [ -z "${E2E:-}" ] || [[ " $E2E " == *" $1 "* ]]; }
BESIDE_EMU="test_slurm test_device_comm test_local_sgd test_moe_layouts test_llama_layouts test_act_offload"
took() { echo "$(( $(date +%s) - $1 ))s, $(awk -v a="$(cpu_s)" -v b="$2" 'BEGIN { printf "%.1f", a - b }') s CPU"; }
# report NAME RC LOG TIMES: an end-to-end test's PASS or FAIL line (with its log's tail) and the counts
report() {
    if [ "$2" -eq 0 ]; then
        echo "PASS $1 ($4)"; pass=$((pass + 1))
    else
        echo "FAIL $1 ($4)"; echo "$3" | tail -n 30 | sed 's/^/    /'
        fail=$((fail + 1)); failed+=("$1")
    fi
}

[ -s data/tokenizer/encoder.json ] || bash scripts/get_tokenizer.sh

echo "== unit tests (Catch2, CPU backend)"
start=$(date +%s) cpu0=$(cpu_s)
out=$($B/test_cpu 2>&1); rc=$?
echo "$out" | tail -n 25
echo "(unit tests: $(took $start $cpu0))"
# Catch2 v2 summary: "All tests passed (A assertions in N test cases)" or "test cases: N | P passed | F failed"
if n=$(echo "$out" | sed -n 's/^All tests passed ([0-9]* assertions\{0,1\} in \([0-9]*\) test cases\{0,1\})$/\1/p') && [ -n "$n" ]; then
    pass=$((pass + n))
elif line=$(echo "$out" | grep -E '^test cases: ' | tail -n1) && [ -n "$line" ]; then
    p=$(echo "$line" | sed -n 's/.*| *\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.*| *\([0-9]*\) failed.*/\1/p')
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-1})); failed+=("unit tests")
else
    fail=$((fail + 1)); failed+=("unit tests (no summary, exit $rc)")
fi
[ $rc -ne 0 ] && [ ${#failed[@]} -eq 0 ] && { fail=$((fail + 1)); failed+=("unit tests (exit $rc)"); }

if [ -x $B/test_gpu ]; then
    echo "== GPU tests"
    out=$($B/test_gpu 2>&1); rc=$?
    echo "$out" | grep -v '^PASS' | tail -n 40
    if echo "$out" | grep -q '^GPU tests: skipped (no CUDA device)'; then
        # no GPU: the GPU tests' own harness (cases, indexing, the two-process digests) with the CPU
        # backend in the GPU's place, so that test_gpu cannot rot unseen between GPU runs
        echo "== GPU test harness on the CPU (LLMC_TEST_GPU_ON_CPU=1; proves the harness, not the GPU)"
        start=$(date +%s) cpu0=$(cpu_s)
        out=$(LLMC_TEST_GPU_ON_CPU=1 LLMC_GPU_DIGEST="$B/gpu_digest_1" $B/test_gpu 2>&1); rc=$?
        LLMC_TEST_GPU_ON_CPU=1 LLMC_GPU_DIGEST="$B/gpu_digest_2" $B/test_gpu >/dev/null 2>&1
        echo "$out" | grep -v '^PASS' | tail -n 20
        echo "(GPU test harness on the CPU: $(took $start $cpu0))"
        if [ $rc -eq 0 ] && [ -s "$B/gpu_digest_1" ] && cmp -s "$B/gpu_digest_1" "$B/gpu_digest_2"; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1)); failed+=("GPU test harness on the CPU")
        fi
    elif [ $rc -eq 0 ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1)); failed+=("GPU tests")
    fi
else
    echo "GPU tests: skipped (no CUDA device)"
fi

# lane DIR TAG NAMES...: the end-to-end tests NAMES one after another, in the background, each leaving
# DIR/NAME.log and DIR/NAME.rc ("exit-code seconds CPU-seconds"), then DIR/.done-TAG; with TAG "-",
# in the foreground (no .done file). With no NAMES the lane takes its tests one at a time from the
# queue DIR/queue (one name a line, under flock), so that lanes sharing it stay busy until it is empty.
lane() {
    local script='dir=$0 tag=$1; shift
        next() {  # the queue'"'"'s first name, taken off it
            flock "$dir/queue" bash -c '"'"'n=$(head -n 1 "$0"); [ -z "$n" ] || sed -i 1d "$0"; echo "$n"'"'"' "$dir/queue"
        }
        fixed=$#
        while :; do
            if [ $fixed -gt 0 ]; then [ $# -gt 0 ] || break; name=$1; shift; else name=$(next); [ -n "$name" ] || break; fi
            start=$(date +%s) cpu0=$(awk -v hz="$(getconf CLK_TCK)" '"'"'{ print ($16 + $17) / hz }'"'"' /proc/$$/stat)
            bash "test/e2e/$name.sh" > "$dir/$name.log" 2>&1; rc=$?
            cpu=$(awk -v hz="$(getconf CLK_TCK)" -v c0="$cpu0" '"'"'{ printf "%.1f", ($16 + $17) / hz - c0 }'"'"' /proc/$$/stat)
            echo "$rc $(( $(date +%s) - start )) $cpu" > "$dir/$name.rc"
        done
        [ "$tag" = - ] || touch "$dir/.done-$tag"'
    if [ "$2" = - ]; then bash -c "$script" "$@"; else ( bash -c "$script" "$@" & ); fi
}
# wait_lane DIR TAG: until lane TAG has ended
wait_lane() { while [ ! -e "$1/.done-$2" ]; do sleep 1; done; }
L="$B/lanes"
rm -rf "$L" && mkdir -p "$L"
e2e_names() { for t in test/e2e/test_*.sh; do name=$(basename "$t" .sh); selected "$name" && echo "$name"; done; }
emu_lane=0  # 1: lane "emu" runs BESIDE_EMU's tests

if [ "${EMU:-1}" = 1 ] && [ -x $B/test_gpu_emu ] && [ -x $B/cuemu_selftest ] && [ -n "${EMU_FLAGS:-}" ]; then
    # the CUDA source on the CPU emulator (make test-emu, about 3-4 minutes): one line, pass or fail
    echo "== CUDA source on the CPU emulator (test/cuemu/run.sh)"
    # BESIDE_EMU's end-to-end tests leave a core idle much of their time (waiting on timeouts, on
    # Slurm's daemons, on MPI start-ups and one-thread ranks) or need little of one, and none of them
    # times the emulator, whose checks do not depend on time: they run one after another beside this
    # stage (lane "emu"); the loop at the end reports each in its place.
    emu_lane=1
    lane "$L" emu $(for name in $BESIDE_EMU; do selected "$name" && echo "$name"; done)
    start=$(date +%s) cpu0=$(cpu_s)
    out=$(LLMC_BUILD=$B bash test/cuemu/run.sh 2>&1); rc=$?
    echo "$out" | grep -v -E '^(CAUGHT|PASS) ' | tail -n 25
    if [ $rc -eq 0 ]; then
        echo "PASS test-emu ($(took $start $cpu0))"; pass=$((pass + 1))
    else
        fail=$((fail + 1)); failed+=("test-emu")
    fi
fi

echo "== end-to-end tests"
# The rest two at a time (lane "pair" and this shell take them from one queue, the longest known
# first: LONG_FIRST, from the CI logs), starting as the emulator's stage ends, beside what is left
# of lane "emu" (a core waiting for that lane to end would idle), except ALONE's:
# they time themselves or their timeouts (a rank declared dead after 3 s, a save slower than a 2 s
# timeout, signals into a running step; test_dev_cuda builds dev/cuda, which test_gpu_kit's kit also
# does: the two must not build it at once) and run after, one by one.
ALONE="test_overlap test_dp_failures test_plan test_bad_input test_preempt test_gpu_check_list test_dev_cuda"
rest=()
for name in $(e2e_names); do
    [ $emu_lane = 1 ] && [[ " $BESIDE_EMU " == *" $name "* ]] && continue
    [[ " $ALONE " == *" $name "* ]] && continue
    [ "${LLMC_SANITIZE:-0}" = 1 ] && [ "$name" = test_bundle ] && continue
    rest+=("$name")
done
LONG_FIRST="test_gpu_kit test_fp8_cpu test_ep_layouts test_model_parallel test_bundle test_dp_equivalence"
: > "$L/queue"
for name in $LONG_FIRST; do [[ " ${rest[*]} " == *" $name "* ]] && echo "$name" >> "$L/queue"; done
for name in "${rest[@]}"; do [[ " $LONG_FIRST " == *" $name "* ]] || echo "$name" >> "$L/queue"; done
start=$(date +%s)
lane "$L" pair
lane "$L" -
wait_lane "$L" pair
echo "(${#rest[@]} tests two at a time: $(( $(date +%s) - start ))s)"
if [ $emu_lane = 1 ]; then
    wait_lane "$L" emu
    echo "(lane emu, the tests begun beside the emulator's stage, ended $(( $(stat -c %Y "$L/.done-emu") - start ))s after it)"
fi
for name in $(e2e_names); do
    # the bundle packages the usual build, not build-asan's
    [ "${LLMC_SANITIZE:-0}" = 1 ] && [ "$name" = test_bundle ] && { echo "SKIP $name (SANITIZE=1)"; continue; }
    if [ -e "$L/$name.rc" ]; then  # run in a lane: its result (exit code, seconds, CPU seconds)
        read -r rc secs cpu < "$L/$name.rc"
        where="beside another test"
        [[ " $BESIDE_EMU " == *" $name "* ]] && [ -e "$L/.done-emu" ] && where="in lane emu"
        report "$name" "$rc" "$(cat "$L/$name.log")" "${secs}s $where, $cpu s CPU"
        continue
    fi
    start=$(date +%s) cpu0=$(cpu_s)
    log=$(bash "test/e2e/$name.sh" 2>&1); rc=$?
    report "$name" "$rc" "$log" "$(took $start $cpu0)"
done

left=$(cd "$TMPDIR" && ls -A | head -n 10)
if [ -n "$left" ]; then
    echo "FAIL temporary files left in $TMPDIR by the tests:" $left
    fail=$((fail + 1)); failed+=("temporary files left")
else
    rmdir "$TMPDIR"
fi
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
