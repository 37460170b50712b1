# Launch errors and failures under mpirun end the whole job, never hang it:
#  - a layout that does not match the world size, or is not supported, is one clear message from
#    rank 0 and exit code 2 on every rank, before any work;
#  - a rank killed mid-run (SIGKILL inside a step, the others waiting in a collective) ends the job
#    with a non-zero exit and a message naming the rank, and leaves no process behind;
#  - a rank that hangs mid-run (alive, never reaching the next collective) ends the job once the
#    others' watchdog passes parallel.timeout_s: exit 5, a message naming the stalled call, its
#    group, the ranks that waited and the rank that stalled, and no process left behind.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
bad() {  # bad N PATTERN ARGS...: exit code 2, stderr matches, one "error:" line, from rank 0, no out_dir
    local n=$1 pat=$2; shift 2
    local rc=0
    dp_run "$n" "$W/c.json" "out_dir=$W/bad" "$@" > /dev/null 2> "$W/err.txt" || rc=$?
    [ $rc -eq 2 ] || die "expected exit 2 from -np $n $*, got $rc: $(cat "$W/err.txt")"
    grep -qE -- "$pat" "$W/err.txt" || die "stderr of -np $n $* does not match /$pat/: $(cat "$W/err.txt")"
    [ "$(grep -c 'error:' "$W/err.txt")" -eq 1 ] && grep -q '^\[rank 0\] error:' "$W/err.txt" ||
        die "expected one error line from rank 0: $(cat "$W/err.txt")"
    [ ! -e "$W/bad" ] || die "out_dir created on a launch error ($*)"
}
bad 3 'parallel\.dp.*2 x 1 x 1 = 2.*3 processes' parallel.dp=2
bad 3 'parallel\.tp.*model\.n_head' parallel.tp=3
bad 3 'model\.n_layer.*pipeline stages' parallel.pp=3
bad 2 'parallel\.comm.*nccl.*cuda' parallel.comm=nccl
bad 2 'parallel\.dp.*auto.*4 processes|parallel.dp' parallel.dp=4
# a single process asked for dp=2
expect_fail 2 'parallel\.dp.*1 process' "$BIN" "$W/c.json" parallel.dp=2 "out_dir=$W/bad"
# parallel.dp="auto" is the default and resolves to the world size
# (into a file: `| grep -q` closes the pipe at the first match, and mpirun, still writing, aborts
# on SIGPIPE, which pipefail turns into a failure: seen once in CI)
dp_run 2 "$W/c.json" train.steps=1 train.warmup_steps=0 parallel.dp=auto "out_dir=$W/auto" > "$W/auto.txt" 2>&1 &&
    grep -q 'dp 2 x tp 1 x pp 1' "$W/auto.txt" || die "auto dp: $(tail -n 5 "$W/auto.txt")"

# kill rank 1 at step 5: the job ends (within the timeout), non-zero, naming rank 1
start=$(date +%s)
rc=0
LLMC_FAULT=train_step_5 LLMC_FAULT_RANK=1 dp_run 4 "$W/c.json" train.steps=50 "out_dir=$W/killed" \
    > "$W/kill.out" 2> "$W/kill.err" || rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || die "killed rank: expected a non-zero exit before the timeout, got $rc"
grep -q 'rank 1' "$W/kill.err" || die "no message naming rank 1: $(cat "$W/kill.err")"
echo "killed rank 1 at step 5: job ended with exit $rc after $(( $(date +%s) - start ))s"
grep -q 'step     4/50' "$W/kill.out" || die "the run did not get to step 4 before the kill"
! grep -q 'step     6/50' "$W/kill.out" || die "the job went on after rank 1 died"
sleep 1
left=$(ps -eo stat=,args= | awk -v w="$W/killed" 'index($0, w) && $1 !~ /^Z/' | grep -v awk || true)
[ -z "$left" ] || die "processes left running: $left"

# rank 1 hangs at step 5 (sleeps forever, alive): with parallel.timeout_s=3 the ranks waiting for it
# in the data-parallel collective end the job within seconds, not at the 120 s test timeout; under
# ZeRO-0 they wait in a gradient all-reduce, under ZeRO-3 in the step-long units' reduce-scatter.
# The two jobs run at once (each mostly waits on the timeout), each into its own files.
for zero in 0 3; do
    ( start=$(date +%s.%N) rc=0
      LLMC_FAULT=hang:train_step_5 LLMC_FAULT_RANK=1 dp_run 4 "$W/c.json" train.steps=50 parallel.timeout_s=3 \
          parallel.zero=$zero "out_dir=$W/hung$zero" > "$W/hang$zero.out" 2> "$W/hang$zero.err" || rc=$?
      echo "$rc $(echo "$(date +%s.%N) - $start" | bc)" > "$W/hang$zero.rc" ) &
done
wait
sleep 1  # (then no process of either job may be left)
for zero in 0 3; do
    want=all_reduce; [ $zero -eq 3 ] && want=reduce_scatter
    read -r rc took < "$W/hang$zero.rc"
    [ $rc -eq 5 ] || die "hung rank (zero=$zero): expected exit 5 (a collective stalled) before the timeout, got $rc: $(tail -n 5 "$W/hang$zero.err")"
    echo "rank 1 hung at step 5 (zero=$zero): job ended with exit $rc after ${took}s (parallel.timeout_s = 3)"
    [ "$(echo "$took < 30" | bc)" -eq 1 ] || die "hung rank: the job took ${took}s to end (timeout_s = 3)"
    [ "$(echo "$took > 3" | bc)" -eq 1 ] || die "hung rank: the job ended after ${took}s, before timeout_s = 3"
    grep -q '^\[rank 1\] LLMC_FAULT=hang:train_step_5: this process hangs' "$W/hang$zero.err" ||
        die "rank 1 did not hang at step 5: $(cat "$W/hang$zero.err")"
    # the waiting ranks name the call, its number on the group and whom they wait with, and, from
    # the reports the ranks exchange on a timeout, the rank that stalled (the one that sent none)
    grep -qE "^\[rank [023]\] error: $want #[0-9]+ on the dp group \([0-9]+ (float|double)s?; waiting with world ranks ([0-9]+, )*1(, [0-9]+)*\) did not complete within parallel\.timeout_s = 3 s; stalled: world rank 1 \(no report within 3 s: in no call, hung or dead\); waiting: rank [023] in [a-z_]+ #[0-9]+ on [a-z]+, rank [023] in [a-z_]+ #[0-9]+ on [a-z]+; ending the job\$" \
        "$W/hang$zero.err" || die "no message naming the stalled collective ($want) and the rank: $(cat "$W/hang$zero.err")"
    ! grep -q '^\[rank 1\] error:' "$W/hang$zero.err" || die "the stalled rank reported a call: $(cat "$W/hang$zero.err")"
    grep -q 'step     4/50' "$W/hang$zero.out" || die "the run did not get to step 4 before the hang"
    ! grep -q 'step     6/50' "$W/hang$zero.out" || die "the job went on after rank 1 hung"
    left=$(ps -eo stat=,args= | awk -v w="$W/hung$zero" 'index($0, w) && $1 !~ /^Z/' | grep -v awk || true)
    [ -z "$left" ] || die "processes left running: $left"
done

# issue 34: kill -9 from outside of rank 1 of a dp=2 run, mid-run. (a) mpirun as launched here ends
# the job itself as soon as it sees the death (exit 137, its message naming rank 1), before the
# watchdog's parallel.timeout_s; (b) under a launcher that leaves the survivor running (mpirun with
# recovery on; like srun without --kill-on-bad-exit), rank 0's watchdog ends it after timeout_s
# (plus at most 5 s of report exchange), naming world rank 1 as stalled, with MPI_Abort(5) (which
# that mpirun reports as 0: the launcher's own code, as README's exit-code table says)
kill_rank1() {  # kill_rank1 DIR MPIRUN_ARGS...: prints "rc seconds" (from the kill to the end)
    local dir=$1; shift
    timeout 60 mpirun --oversubscribe "$@" -np 2 -x OMP_NUM_THREADS "$BIN" "$W/c.json" train.steps=100000 \
        parallel.timeout_s=3 "out_dir=$dir" > "$dir.out" 2> "$dir.err" &
    local mp=$! pid="" p
    for _ in $(seq 300); do grep -q 'step    10/' "$dir.out" 2>/dev/null && break; sleep 0.1; done
    # (looked for again for up to 5 s: once in CI, beside another test, the first look found none)
    for _ in $(seq 50); do
        for p in $(pgrep -f "out_dir=$dir\$"); do
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && pid=$p
        done
        [ -n "$pid" ] && break
        sleep 0.1
    done
    [ -n "$pid" ] || die "no rank 1 process found for $dir: $(pgrep -af "out_dir=$dir\$"; tail -n 3 "$dir.out" "$dir.err")"
    local t0 rc=0
    t0=$(date +%s.%N)
    kill -9 "$pid"
    wait $mp || rc=$?
    echo "$rc $(echo "$(date +%s.%N) - $t0" | bc)"
}
read -r rc took < <(kill_rank1 "$W/k9")
echo "kill -9 of rank 1 (dp=2, mpirun): job ended with exit $rc ${took}s after the kill"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || die "kill -9 of rank 1: expected a non-zero exit before the timeout, got $rc"
[ "$(echo "$took < 8" | bc)" -eq 1 ] || die "kill -9 of rank 1: the job took ${took}s to end (timeout_s = 3)"
grep -q 'rank 1 .*exited on signal 9' "$W/k9.err" || die "no message naming rank 1: $(cat "$W/k9.err")"
read -r rc took < <(kill_rank1 "$W/k9r" --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0)
echo "kill -9 of rank 1 (dp=2, survivor left running): job ended with exit $rc ${took}s after the kill"
[ $rc -ne 124 ] || die "kill -9 of rank 1, survivor left running: the job did not end"
[ "$(echo "$took < 3 + 5 + 4" | bc)" -eq 1 ] || die "kill -9 of rank 1, survivor left running: ${took}s (timeout_s = 3)"
grep -qE '^\[rank 0\] error: [a-z_]+ #[0-9]+ on the [a-z]+ group .*did not complete within parallel\.timeout_s = 3 s; stalled: world rank 1 ' \
    "$W/k9r.err" || die "rank 0 does not name the dead rank 1: $(cat "$W/k9r.err")"
# OpenMPI's MPI_ABORT text carries the code; sometimes its show_help loses the text to the dead
# rank, with an ORTE_ERROR_LOG line from show_help.c ("Data unpack would read past end of buffer",
# "Data unpack had inadequate space", "Out of resource": three seen in CI runs here): then only such
# a lost-message line is accepted in its place (the job still ended in time, after rank 0's
# "ending the job", above)
if grep -q 'MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD' "$W/k9r.err"; then
    grep -q 'with errorcode 5' "$W/k9r.err" || die "rank 0 did not end the job with code 5: $(cat "$W/k9r.err")"
elif grep -qE 'ORTE_ERROR_LOG: [A-Za-z ]+ in file [^ ]*/show_help\.c' "$W/k9r.err"; then
    echo "kill -9 of rank 1, survivor left running: OpenMPI lost its MPI_ABORT message (show_help unpack error)"
else
    die "rank 0 did not end the job with MPI_Abort: $(cat "$W/k9r.err")"
fi
sleep 1
left=$(ps -eo stat=,args= | awk -v w="$W/k9" 'index($0, w) && $1 !~ /^Z/' | grep -v awk || true)
[ -z "$left" ] || die "processes left running: $left"
