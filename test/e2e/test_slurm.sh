# scripts/slurm/train.sbatch on a real Slurm (Debian's slurm-wlm and munge, which
# scripts/setup.sh installs; without them this test fails): munged, slurmctld and slurmd for one
# node on localhost, started here without systemd, state in the test's temp folder, stopped at
# the end whatever happens. Checks:
#  - 2 and 4 tasks under srun --mpi=pmix give the losses and final weights of mpirun, bit for bit;
#  - LAUNCHER=mpirun inside the allocation does too;
#  - `scontrol requeue` mid-run: the ranks get SIGTERM, save, exit 3; the job runs again, resumes
#    from that checkpoint and ends bit-identical to an uninterrupted run, one log across restarts;
#  - the same under LAUNCHER=mpirun;
#  - SIGUSR1 to the batch shell (what --signal=B:USR1@120 sends before the time limit): the
#    script forwards it, the ranks save and exit 3, the script requeues the job, which resumes;
#  - scancel: the ranks save and exit 3, and the job stays cancelled;
#  - a launcher that returns 0 without running the trainer: launched again, then the job fails.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
for cmd in munged slurmctld slurmd sbatch scontrol srun; do
    command -v $cmd > /dev/null || die "$cmd not found: install Slurm and munge (bash scripts/setup.sh)"
done

# A job requeued or cancelled mid-run kills mpirun before it removes OpenMPI's session folder
# ($TMPDIR/ompi.*): the daemons and jobs take this test's own TMPDIR, removed with $W.
export TMPDIR="$W/tmp"
mkdir -p "$TMPDIR"

# ---- a one-node cluster on localhost ----
S="$W/slurm"
mkdir -p "$S/state" "$S/spool"
cp /etc/munge/munge.key "$S/munge.key" 2> /dev/null || dd if=/dev/urandom of="$S/munge.key" bs=128 count=1 status=none
chmod 400 "$S/munge.key"
port=$((20000 + RANDOM % 20000))
user=$(id -un)
cat > "$S/slurm.conf" <<EOF
ClusterName=llmctest
SlurmctldHost=localhost
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge.sock
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmdSpoolDir=$S/spool
StateSaveLocation=$S/state
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
KillWait=10
NodeName=localhost CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$S/slurm.conf"
# the node claims 8 CPUs whatever the machine has: ranks waiting in MPI yield the core (as
# mpirun --oversubscribe makes them do) instead of spinning against the rank they wait for
export OMPI_MCA_mpi_yield_when_idle=1
daemons=()
stop_slurm() {
    scancel --full --quiet $(squeue -h -o %i 2> /dev/null) 2> /dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h 2> /dev/null)" ] && break; sleep 0.1; done
    for pid in "${daemons[@]}"; do kill "$pid" 2> /dev/null || true; done
    [ -f "$S/munged.pid" ] && kill "$(cat "$S/munged.pid")" 2> /dev/null
    for pid in "${daemons[@]}"; do wait "$pid" 2> /dev/null || true; done
    rm -rf "$W"
}
trap stop_slurm EXIT
munged --force --socket="$S/munge.sock" --key-file="$S/munge.key" --pid-file="$S/munged.pid" \
    --log-file="$S/munged.log" --seed-file="$S/munged.seed" || die "munged did not start"
slurmctld -D -f "$S/slurm.conf" > "$S/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$S/slurm.conf" > "$S/slurmd.out" 2>&1 &
daemons+=($!)
for _ in $(seq 100); do sinfo -h -o %t 2> /dev/null | grep -q idle && break; sleep 0.1; done
sinfo -h -o %t | grep -q idle || die "the node did not come up: $(tail -n 5 "$S/slurmctld.log" "$S/slurmd.log")"
echo "slurm up (port $port); srun --mpi=list: $(srun --mpi=list 2>&1 | tr -s '\n\t' ' ')"

# job_state ID: PENDING, RUNNING, COMPLETED, FAILED, ...
job_state() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# job_wait ID REGEX: until the job's state matches (60 s at most; an end state that does not
# match fails at once)
job_wait() {
    local s
    for _ in $(seq 600); do
        s=$(job_state "$1")
        [[ $s =~ ^($2)$ ]] && return 0
        [[ $s =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$ ]] && break
        sleep 0.1
    done
    die "job $1 is $s, expected $2: $(scontrol show job "$1" | grep -E 'JobState|ExitCode')"
}
# submit NAME SBATCH-ARGS... -- TRAINER-ARGS...: submits train.sbatch (log $W/NAME.out), prints the job id
submit() {
    local name=$1; shift
    local opts=()
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    (cd "$ROOT" && TRAIN_GPT="$BIN" sbatch --parsable "${opts[@]}" -o "$W/$name.out" scripts/slurm/train.sbatch "$W/c.json" \
        "out_dir=$W/$name" "$@")
}
# same_run A B STEPS: losses and final weights of out_dirs A and B are bit-identical
same_run() {
    [ "$(losses "$1/log.jsonl" | wc -l)" -eq "$3" ] || die "$1: expected $3 loss records"
    diff <(losses "$1/log.jsonl") <(losses "$2/log.jsonl") > /dev/null || die "losses of $2 differ from $1"
    cmp "$1/$(printf 'model_%08d.bin' "$3")" "$2/$(printf 'model_%08d.bin' "$3")" || die "final weights of $2 differ from $1"
}
# release_requeued ID: a requeued job waits ~2 min (BeginTime); once its first run has left
# the node (idle again, not completing) and 2 s have passed (slurmd refuses a job whose
# credential is from the second its last one was revoked in), start it now
release_requeued() {
    job_wait "$1" PENDING
    for _ in $(seq 150); do [ "$(sinfo -h -o %t)" = idle ] && break; sleep 0.1; done
    sleep 2
    scontrol update JobId="$1" StartTime=now
}

make_data
tiny_config "$W/c.json"

echo "2 and 4 tasks (srun --mpi=pmix), and LAUNCHER=mpirun, against mpirun"
for n in 2 4; do
    dp_run $n "$W/c.json" "out_dir=$W/mpirun$n" > /dev/null || die "mpirun -np $n failed"
    id=$(submit srun$n -n $n --)
    job_wait "$id" COMPLETED
    grep -q "srun --mpi=pmix" "$W/srun$n.out" || die "job $id did not launch with srun --mpi=pmix: $(head -n 3 "$W/srun$n.out")"
    grep -q "parallel: $n processes" "$W/srun$n.out" || die "job $id: not $n ranks: $(head -n 5 "$W/srun$n.out")"
    same_run "$W/mpirun$n" "$W/srun$n" 10
    echo "  $n tasks: losses and weights of srun == mpirun"
done
id=$(LAUNCHER=mpirun submit mpirun_in_job -n 2 --)
job_wait "$id" COMPLETED
grep -q "^== .*: mpirun " "$W/mpirun_in_job.out" || die "job $id did not use mpirun"
same_run "$W/mpirun2" "$W/mpirun_in_job" 10
echo "  LAUNCHER=mpirun: losses and weights == mpirun outside Slurm"

# a launcher that returns 0 although the trainer never ran (srun did, once, right after a requeue:
# "task launch failed"): the script launches twice more, then the job fails instead of COMPLETED
id=$(cd "$ROOT" && TRAIN_GPT=/bin/true LAUNCH_RETRY_S=0 sbatch --parsable -n 2 -o "$W/no_run.out" \
    scripts/slurm/train.sbatch "$W/c.json")
job_wait "$id" FAILED
[ "$(grep -c 'returned 0 but train_gpt did not finish' "$W/no_run.out")" -eq 3 ] ||
    die "a launch that ran no trainer: $(cat "$W/no_run.out")"
echo "  a launcher that returns 0 without running train_gpt: launched 3 times, the job FAILED"

# preemption: a run long enough to be caught mid-way
long=(train.steps=300 train.warmup_steps=2)
dp_run 2 "$W/c.json" "${long[@]}" "out_dir=$W/long" > /dev/null || die "mpirun 300-step baseline failed"
# The stop must land mid-run however fast the machine is: every rank sleeps 5 s in step 30
# (LLMC_FAULT=slow:, no effect on the numbers), and the stop is sent once 29 steps are logged.
mid_run_fault=slow:train_step_30
wait_mid_run() {  # wait_mid_run NAME: until the job has logged the 29 steps before the pause
    for _ in $(seq 600); do [ "$(losses "$W/$1/log.jsonl" 2> /dev/null | wc -l)" -ge 29 ] && return 0; sleep 0.05; done
    die "$1: the job did not reach step 29"
}
# stop_mid_run NAME COMMAND...: submits a 300-step job, runs COMMAND (with the job id appended)
# during its pause at step 30, and checks the job ran twice: stopped with a checkpoint, resumed
# from it, and ended bit-identical to the uninterrupted run
stop_mid_run() {
    local name=$1; shift
    local id step
    id=$(LLMC_FAULT=$mid_run_fault submit "$name" -n 2 -- "${long[@]}")
    wait_mid_run "$name"
    "$@" "$id"
    release_requeued "$id"
    job_wait "$id" COMPLETED
    # the step the first run stopped after: the checkpoint the second resumed from
    step=$(sed -n 's/^resumed from .*step_[0-9]* at step \([0-9]*\) .*/\1/p' "$W/$name.out")
    [ -n "$step" ] && [ "$step" -lt 300 ] || die "$name: no resume before step 300: $(grep -v '^step' "$W/$name.out")"
    [ "$(losses "$W/$name/log.jsonl" | wc -l)" -eq 300 ] || die "$name: steps logged twice or missing"
    [ "$(grep -c '^== .* (restart 1)' "$W/$name.out")" -eq 1 ] || die "$name: expected one restart in one log"
    same_run "$W/long" "$W/$name" 300
    echo "  $name: stopped after step $step, requeued, resumed; bit-identical at step 300"
}
echo "scontrol requeue mid-run"
stop_mid_run requeue scontrol requeue
grep -q 'SIGTERM: stopped after step [0-9]*, checkpoint saved; exit code 3' "$W/requeue.out" ||
    die "requeue: the ranks did not stop on SIGTERM"
echo "scontrol requeue mid-run, LAUNCHER=mpirun"
LAUNCHER=mpirun stop_mid_run requeue_mpirun scontrol requeue
echo "SIGUSR1 to the batch shell (the time-limit warning of --signal=B:USR1@120)"
stop_mid_run usr1 scancel --batch --signal=USR1
grep -q 'SIGUSR1: stopped after step [0-9]*, checkpoint saved; exit code 3' "$W/usr1.out" &&
    grep -q 'time limit near): requeueing job' "$W/usr1.out" || die "usr1: the script did not requeue the job"

echo "scancel mid-run: the ranks save and exit 3, the job stays cancelled"
id=$(LLMC_FAULT=$mid_run_fault submit cancel -n 2 -- "${long[@]}")
wait_mid_run cancel
scancel "$id"
job_wait "$id" CANCELLED
for _ in $(seq 100); do grep -q '^== .*Slurm decides' "$W/cancel.out" && break; sleep 0.1; done
grep -q 'SIGTERM: stopped after step [0-9]*, checkpoint saved; exit code 3' "$W/cancel.out" &&
    grep -q 'on SIGTERM: Slurm decides' "$W/cancel.out" || die "scancel: $(grep -v '^step' "$W/cancel.out")"
sleep 1
[ "$(job_state "$id")" = CANCELLED ] || die "scancel: the job is $(job_state "$id")"
ls -d "$W/cancel/checkpoints"/step_* > /dev/null || die "scancel: no checkpoint"
echo "  stopped with a checkpoint, not requeued"
