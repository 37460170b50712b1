#!/usr/bin/env bash
# Runs every test: Catch2 unit tests (CPU), GPU op parity (where a CUDA device is present),
# and the end-to-end tests in test/e2e/ that drive the train_gpt binary.
# Ends with one line "N passed, M failed"; exit code 1 when anything failed.
# LLMC_BUILD (build) holds test_cpu, LLMC_BIN (empty: the repository root) prefixes train_gpt and
# the data tools: `make test SANITIZE=1` sets them to build-asan and LLMC_SANITIZE=1.
# E2E="test_a test_b" runs only those end-to-end tests.
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

[ -s data/tokenizer/encoder.json ] || bash scripts/get_tokenizer.sh

echo "== unit tests (Catch2, CPU backend)"
out=$($B/test_cpu 2>&1); rc=$?
echo "$out" | tail -n 25
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
        out=$(LLMC_TEST_GPU_ON_CPU=1 LLMC_GPU_DIGEST="$B/gpu_digest_1" $B/test_gpu 2>&1); rc=$?
        LLMC_TEST_GPU_ON_CPU=1 LLMC_GPU_DIGEST="$B/gpu_digest_2" $B/test_gpu >/dev/null 2>&1
        echo "$out" | grep -v '^PASS' | tail -n 20
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

if [ -x $B/test_gpu_emu ] && [ -x $B/cuemu_selftest ] && [ -n "${EMU_FLAGS:-}" ]; then
    # the CUDA source on the CPU emulator (make test-emu): one line, pass or fail
    echo "== CUDA source on the CPU emulator (test/cuemu/run.sh)"
    start=$(date +%s)
    out=$(LLMC_BUILD=$B bash test/cuemu/run.sh 2>&1); rc=$?
    echo "$out" | grep -v -E '^(CAUGHT|PASS) ' | tail -n 25
    if [ $rc -eq 0 ]; then
        echo "PASS test-emu ($(( $(date +%s) - start ))s)"; pass=$((pass + 1))
    else
        fail=$((fail + 1)); failed+=("test-emu")
    fi
fi

echo "== end-to-end tests"
for t in test/e2e/test_*.sh; do
    name=$(basename "$t" .sh)
    [ -n "${E2E:-}" ] && [[ " $E2E " != *" $name "* ]] && continue
    # the bundle packages the usual build, not build-asan's
    [ "${LLMC_SANITIZE:-0}" = 1 ] && [ "$name" = test_bundle ] && { echo "SKIP $name (SANITIZE=1)"; continue; }
    start=$(date +%s)
    if log=$(bash "$t" 2>&1); then
        echo "PASS $name ($(( $(date +%s) - start ))s)"
        pass=$((pass + 1))
    else
        echo "FAIL $name"
        echo "$log" | tail -n 30 | sed 's/^/    /'
        fail=$((fail + 1)); failed+=("$name")
    fi
done

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
