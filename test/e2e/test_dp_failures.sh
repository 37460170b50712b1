# Launch errors and failures under mpirun end the whole job, never hang it:
#  - a layout that does not match the world size, or is not supported, is one clear message from
#    rank 0 and exit code 2 on every rank, before any work;
#  - a rank killed mid-run (SIGKILL inside a step, the others waiting in a collective) ends the job
#    with a non-zero exit and a message naming the rank, and leaves no process behind.
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
bad 2 'parallel\.tp > 1 is not supported yet' parallel.tp=2
bad 2 'parallel\.pp > 1 is not supported yet' parallel.pp=2
bad 2 'parallel\.comm.*nccl.*cuda' parallel.comm=nccl
bad 2 'parallel\.zero: 3.*not supported yet' parallel.zero=3
bad 2 'parallel\.dp.*auto.*4 processes|parallel.dp' parallel.dp=4
# a single process asked for dp=2
expect_fail 2 'parallel\.dp.*1 process' "$BIN" "$W/c.json" parallel.dp=2 "out_dir=$W/bad"
# parallel.dp="auto" is the default and resolves to the world size
dp_run 2 "$W/c.json" train.steps=1 train.warmup_steps=0 parallel.dp=auto "out_dir=$W/auto" | grep -q 'dp 2 x tp 1 x pp 1' || die "auto dp"

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
