#!/usr/bin/env bash
# Runs every fuzz target (built by `make fuzz`) for SECONDS each, one after the other, on one core
# at low priority: first over its seeds and kept findings (test/fuzz/corpus/<target>/: a finding
# fixed stays there as a regression input), then mutating. New inputs go to
# build/fuzz/corpus/<target>/, a crashing input to build/fuzz/crash/<target>-*.
# Prints one line per target (runs, seconds, result); exit code 1 when any target failed.
set -u
cd "$(dirname "$0")/../.."
seconds=${1:-60}
failed=()
for bin in build/fuzz/bin/fuzz_*; do
    t=$(basename "$bin")
    mkdir -p "build/fuzz/corpus/$t" build/fuzz/crash
    log="build/fuzz/$t.log"
    nice -n 10 "$bin" "build/fuzz/corpus/$t" "test/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=20 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -artifact_prefix="build/fuzz/crash/$t-" \
        -print_final_stats=1 > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    if [ $rc -eq 0 ]; then
        echo "PASS $t: ${runs:-?} runs in ${seconds} s"
    else
        echo "FAIL $t (exit $rc; ${runs:-?} runs): see $log"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -n 5 | sed 's/^/    /'
        failed+=("$t")
    fi
done
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
