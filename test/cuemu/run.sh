#!/usr/bin/env bash
# make test-emu: the CUDA source on the CPU emulator (test/cuemu/cuemu.h).
#  1. the emulator's own tests (build/cuemu_selftest): the good kernels and the cuBLASLt rules and epilogues
#     pass in three schedules, each broken kernel is caught with its message (the two async ones
#     under reverse-warp, the schedule that lands copies late and lets wgmma read early; the
#     unfenced one, whose wgmma reads what the async proxy was not shown, in any);
#  2. test_gpu's op cases on CudaOps compiled for the emulator (build/test_gpu_emu), in the
#     schedules forward-lockstep and reverse-warp: every case passes and the two runs' digests of
#     the determinism-checked results are equal (reverse-warp runs fp32 and bf16 only: fp16's
#     kernels are bf16's templates, whose races the second schedule already looks for; and it
#     leaves out the long cases, T = 1024 attention: the same kernels and tile loops as T = 257's,
#     more tiles. Those results of forward-lockstep are left out of the comparison; forward-lockstep
#     runs them in fp32 and bf16, not fp16);
#  3. planted bugs in copies of the kernels, each caught (test/cuemu/planted_bugs.sh).
# CUEMU_FILTER=NAME runs only test_gpu's cases NAME (its filter argument; default: all).
# Ends with "test-emu: passed" or "test-emu: FAILED (...)"; exit 1 on failure.
set -u
cd "$(dirname "$0")/../.."
B=${LLMC_BUILD:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
problems=()
# the CPU seconds of the children waited for so far (as in test/run_tests.sh), for each part's time
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($16 + $17) / hz }' /proc/$$/stat; }
took() { echo "$(( $(date +%s) - $1 ))s, $(awk -v a="$(cpu_s)" -v b="$2" 'BEGIN { printf "%.1f", a - b }') s CPU"; }

echo "== emulator self-tests"
start=$(date +%s) cpu0=$(cpu_s)
for s in forward-lockstep reverse-warp random7-lockstep; do
    for c in reduce ballot dynamic_smem lt_rules lt_epilogues capture wgmma_tile; do
        if out=$(CUEMU_SCHEDULE=$s $B/cuemu_selftest $c 2>&1); then :; else
            problems+=("selftest $c ($s)"); echo "FAIL selftest $c ($s): $out" | head -n 5
        fi
    done
done
expect_caught() {  # case, expected message
    if out=$($B/cuemu_selftest "$1" 2>&1); then
        problems+=("selftest $1 not caught"); echo "FAIL selftest $1: not caught: $out"
    elif ! grep -q -- "$2" <<< "$out"; then
        problems+=("selftest $1 message"); echo "FAIL selftest $1: caught without '$2':"; echo "$out" | head -n 5
    else
        echo "CAUGHT $1: $(grep -m1 -- "$2" <<< "$out" | cut -c1-150)"
    fi
}
expect_caught missing_barrier 'FAIL block'
expect_caught divergent_shuffle 'lane 16 of the mask has exited'
expect_caught barrier_in_branch 'reached by 96 threads while 160 have exited'
expect_caught smem_short 'wrote past the 51072 bytes of dynamic shared memory'
expect_caught off_by_one 'wrote past the end of a device allocation of 4000 bytes'
expect_caught no_optin 'without opting in'
expect_caught bad_pointer 'is not inside a device or pinned host allocation'
# (a read of a copy before its wait, a wgmma issued before its operand is written: the schedules
# that land copies late and read early, reverse and random, show them; forward hides them)
CUEMU_SCHEDULE=reverse-warp expect_caught copy_unwaited 'copy read before its wait'
CUEMU_SCHEDULE=reverse-warp expect_caught wgmma_early 'wgmma read B before it was written'
expect_caught proxy_unfenced "differs from the async proxy's view"
echo "(self-tests: $(took $start $cpu0))"

echo "== test_gpu's op cases on CudaOps under the emulator${CUEMU_FILTER:+ (filter $CUEMU_FILTER)}"
for s in forward-lockstep reverse-warp; do
    start=$(date +%s) cpu0=$(cpu_s)
    dtypes=fp32,bf16,fp16 long=0; [ $s = reverse-warp ] && dtypes=fp32,bf16 long=1
    CUEMU_SCHEDULE=$s CUEMU_LT_QUIET=1 LLMC_TEST_DTYPES=$dtypes LLMC_TEST_SKIP_LONG=$long LLMC_TEST_LONG_DTYPES=fp32,bf16 \
        LLMC_GPU_DIGEST="$B/emu_digest.$s" $B/test_gpu_emu ${CUEMU_FILTER:-} > "$B/emu_out.$s" 2>&1
    rc=$?
    summary=$(tail -n 1 "$B/emu_out.$s")
    echo "$s: $summary ($(took $start $cpu0), exit $rc)"
    failed=$(grep '^FAIL' "$B/emu_out.$s")
    if [ $rc -ne 0 ] || [ -n "$failed" ]; then
        problems+=("op cases ($s)"); echo "$failed" | head -n 20
    fi
    if ! grep -q -E '^[0-9]+ passed, [0-9]+ failed$' <<< "$summary"; then
        problems+=("op cases ($s) did not finish"); tail -n 15 "$B/emu_out.$s"
    fi
done
grep -v -e ' \[fp16 ' -e ' T=1024 ' "$B/emu_digest.forward-lockstep" > "$B/emu_digest.forward-lockstep.common"
if [ -s "$B/emu_digest.reverse-warp" ] && cmp -s "$B/emu_digest.forward-lockstep.common" "$B/emu_digest.reverse-warp"; then
    echo "digests equal in both schedules ($(wc -l < "$B/emu_digest.reverse-warp") results; fp16's and" \
         "T=1024's $(grep -c -e ' \[fp16 ' -e ' T=1024 ' "$B/emu_digest.forward-lockstep") in forward-lockstep only)"
else
    problems+=("digests differ between schedules")
    diff "$B/emu_digest.forward-lockstep.common" "$B/emu_digest.reverse-warp" | head -n 10
fi

echo "== planted bugs"
start=$(date +%s) cpu0=$(cpu_s)
bash test/cuemu/planted_bugs.sh || problems+=("planted bugs")
echo "(planted bugs: $(took $start $cpu0))"

if [ ${#problems[@]} -eq 0 ]; then
    echo "test-emu: passed"
else
    echo "test-emu: FAILED (${problems[*]})"
    exit 1
fi
