#!/usr/bin/env bash
# Runs every fuzz target (built by `make fuzz`) for SECONDS each, FUZZ_JOBS at a time (default: one
# per core; each target one core, at low priority): first over its seeds and kept findings
# (test/fuzz/corpus/<target>/: a finding fixed stays there as a regression input), then mutating.
# New inputs go to build/fuzz/corpus/<target>/, a crashing input to build/fuzz/crash/<target>-*.
# Prints one line per target (runs, seconds, result) in the targets' order; exit code 1 when any
# target failed.
set -u
cd "$(dirname "$0")/../.."
seconds=${1:-60}
jobs_max=${FUZZ_JOBS:-$(nproc)}
# fuzz T: runs target T, leaving its line in build/fuzz/T.result
fuzz() {
    local t=$1 log="build/fuzz/$1.log" rc runs
    mkdir -p "build/fuzz/corpus/$t" build/fuzz/crash
    nice -n 10 "build/fuzz/bin/$t" "build/fuzz/corpus/$t" "test/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=20 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -artifact_prefix="build/fuzz/crash/$t-" \
        -print_final_stats=1 > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    if [ $rc -eq 0 ]; then
        echo "PASS $t: ${runs:-?} runs in ${seconds} s"
    else
        echo "FAIL $t (exit $rc; ${runs:-?} runs): see $log"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -n 5 | sed 's/^/    /'
    fi > "build/fuzz/$t.result"
}
targets=()
for bin in build/fuzz/bin/fuzz_*; do targets+=("$(basename "$bin")"); done
rm -f build/fuzz/*.result
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    fuzz "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
    cat "build/fuzz/$t.result" 2>/dev/null || echo "FAIL $t: no result"
    grep -q '^PASS ' "build/fuzz/$t.result" 2>/dev/null || failed+=("$t")
done
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
