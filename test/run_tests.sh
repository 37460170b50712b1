#!/usr/bin/env bash
# Runs every test: Catch2 unit tests (CPU), GPU op parity (where a CUDA device is present),
# and the end-to-end tests in test/e2e/ that drive the train_gpt binary.
# Ends with one line "N passed, M failed"; exit code 1 when anything failed.
# LLMC_BUILD (build) holds test_cpu, LLMC_BIN (empty: the repository root) prefixes train_gpt and
# the data tools: `make test SANITIZE=1` sets them to build-asan and LLMC_SANITIZE=1.
# E2E="test_a test_b" runs only those end-to-end tests; EMU=0 leaves out the CUDA emulator's tests.
# Each part prints its wall and CPU seconds; BESIDE_EMU's end-to-end tests run beside the emulator.
set -u
cd "$(dirname "$0")/.."
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
BESIDE_EMU="test_slurm test_device_comm test_local_sgd test_moe_layouts"
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
rm -rf "$B/beside"  # (a previous run's results of the tests run beside the emulator)

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

if [ "${EMU:-1}" = 1 ] && [ -x $B/test_gpu_emu ] && [ -x $B/cuemu_selftest ] && [ -n "${EMU_FLAGS:-}" ]; then
    # the CUDA source on the CPU emulator (make test-emu, about 5 minutes): one line, pass or fail
    echo "== CUDA source on the CPU emulator (test/cuemu/run.sh)"
    # BESIDE_EMU's end-to-end tests leave a core idle much of their time (waiting on timeouts, on
    # Slurm's daemons, on MPI start-ups and one-thread ranks: their CPU time is 10-70% of their wall
    # time) and none of them times the emulator, whose checks do not depend on time: they run one
    # after another in one process beside this stage, each leaving its result in $B/beside/; the
    # rest of the end-to-end tests (some time themselves and need the cores) start only once they
    # have ended. The loop below reports each in its place.
    mkdir -p "$B/beside"
    ( bash -c 'for name in "$@"; do
                   start=$(date +%s) cpu0=$(awk -v hz="$(getconf CLK_TCK)" '"'"'{ print ($16 + $17) / hz }'"'"' /proc/$$/stat)
                   bash "test/e2e/$name.sh" > "$0/$name.log" 2>&1; rc=$?
                   cpu=$(awk -v hz="$(getconf CLK_TCK)" -v c0="$cpu0" '"'"'{ printf "%.1f", ($16 + $17) / hz - c0 }'"'"' /proc/$$/stat)
                   echo "$rc $(( $(date +%s) - start )) $cpu" > "$0/$name.rc"
               done
               touch "$0/.done"' "$B/beside" $(for name in $BESIDE_EMU; do selected "$name" && echo "$name"; done) & )
    start=$(date +%s) cpu0=$(cpu_s)
    out=$(LLMC_BUILD=$B bash test/cuemu/run.sh 2>&1); rc=$?
    echo "$out" | grep -v -E '^(CAUGHT|PASS) ' | tail -n 25
    if [ $rc -eq 0 ]; then
        echo "PASS test-emu ($(took $start $cpu0))"; pass=$((pass + 1))
    else
        fail=$((fail + 1)); failed+=("test-emu")
    fi
    start=$(date +%s)
    while [ ! -e "$B/beside/.done" ]; do sleep 1; done
    echo "(the tests beside it ended $(( $(date +%s) - start ))s after the emulator's stage)"
fi

echo "== end-to-end tests"
for t in test/e2e/test_*.sh; do
    name=$(basename "$t" .sh)
    selected "$name" || continue
    # the bundle packages the usual build, not build-asan's
    [ "${LLMC_SANITIZE:-0}" = 1 ] && [ "$name" = test_bundle ] && { echo "SKIP $name (SANITIZE=1)"; continue; }
    if [ -d "$B/beside" ] && [[ " $BESIDE_EMU " == *" $name "* ]]; then
        # run beside the emulator's stage: its result (exit code, seconds, CPU seconds)
        read -r rc secs cpu < "$B/beside/$name.rc"
        report "$name" "$rc" "$(cat "$B/beside/$name.log")" "${secs}s beside the emulator's stage, $cpu s CPU"
        continue
    fi
    start=$(date +%s) cpu0=$(cpu_s)
    log=$(bash "$t" 2>&1); rc=$?
    report "$name" "$rc" "$log" "$(took $start $cpu0)"
done

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
