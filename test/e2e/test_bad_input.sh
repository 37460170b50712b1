# The bad-input sweep (issue 13): hostile values, files and folders end with a clear message and
# exit code 2 (or the documented code), and never damage what was written before.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"

# a huge parallel.timeout_s means "practically never", not a deadline that overflowed and has passed
timeout 120 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$BIN" "$W/c.json" train.steps=2 parallel.timeout_s=1e10 \
    "out_dir=$W/patient" > "$W/patient.txt" 2>&1 || die "parallel.timeout_s=1e10 under mpirun: $(tail -n 5 "$W/patient.txt")"
[ -f "$W/patient/model_00000002.bin" ] || die "parallel.timeout_s=1e10: no final model"

# an lr beyond fp32 is refused by name; a model beyond host memory too (no std::bad_alloc abort)
expect_fail 2 'train\.lr' "$BIN" "$W/c.json" train.lr=1e300 "out_dir=$W/lr"
expect_fail 2 'host memory.*model\.n_layer|model\.n_layer.*host memory' "$BIN" "$W/c.json" model.n_layer=60000000 \
    "out_dir=$W/huge"

# a run with checkpoints at steps 2 and 4
"$BIN" "$W/c.json" train.steps=4 checkpoint.every=2 checkpoint.keep=5 "out_dir=$W/base" > /dev/null
ck="$W/base/checkpoints/step_00000004"
[ -f "$ck/DONE" ] || die "no step-4 checkpoint"

# resuming step 4 in a 3-step run is refused, naming train.steps and the step
expect_fail 2 'step 4.*train\.steps = 3' "$BIN" "$W/c.json" train.steps=3 "checkpoint.resume=$ck" "out_dir=$W/short"
[ ! -e "$W/short/model_00000003.bin" ] || die "a 3-step model was written from step-4 weights"

# state.bin with a valid checksum but hostile metadata: every field is checked, naming the file
# and the field (forge.py rewrites the metadata and the checksums, as FNV-1a: the kind of the
# checkpoints before 2026-11-28, which the loader still reads, and that Python computes unaided)
cat > "$W/forge.py" <<'PY'
import json, os, struct, sys
path, edit = sys.argv[1], sys.argv[2]
def fnv1a(data):  # with llmc/core/common.h's offset basis
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h
data = open(path, "rb").read()
head = list(struct.unpack("<8i", data[:32]))
m = json.loads(data[32:32 + head[2]])
m["model_checksum"] = fnv1a(open(os.path.join(os.path.dirname(path), "model.bin"), "rb").read())
ns = {"m": m}
exec(edit, ns)
meta = ns["m"] if isinstance(ns["m"], bytes) else json.dumps(ns["m"]).encode()
rest = data[32 + head[2]:]
head[2], head[3] = len(meta), 0
head[4], head[5] = struct.unpack("<2i", struct.pack("<Q", fnv1a(meta + rest)))
open(path, "wb").write(struct.pack("<8i", *head) + meta + rest)
PY
n=0
forged() {  # forged PATTERN EDIT: a copy of the step-4 checkpoint with EDIT applied to its metadata m
    n=$((n + 1))
    cp -r "$ck" "$W/forged$n"
    python3 "$W/forge.py" "$W/forged$n/state.bin" "$2"
    expect_fail 2 "forged$n/state\.bin.*$1" "$BIN" "$W/c.json" train.steps=8 "checkpoint.resume=$W/forged$n" \
        "out_dir=$W/forged_out$n"
}
forged '"step" is "4"'          'm["step"] = "4"'
forged 'lacks "step"'           'del m["step"]'
forged '"step" is -50'          'm["step"] = -50'
forged '"step" is 1099511627776' 'm["step"] = 2**40'
forged '"loader_dp" is 0'       'm["loader_dp"] = 0'
forged '"loader" is missing'    'del m["loader"]'
forged '"loader\.window" is -1' 'm["loader"]["window"] = -1'
forged 'lacks "loader\.seed"'   'del m["loader"]["seed"]'
forged '"has_master"'           'm["has_master"] = 1'
forged '"num_params"'           'm["num_params"] = "many"'
forged 'not a JSON object'      'm = [1, 2]'
forged 'corrupt metadata'       'm = b"{not json"'
# a changed metadata byte without a new checksum: refused before the metadata is believed
cp -r "$ck" "$W/tampered"
sed -i 's/"step":4/"step":5/' "$W/tampered/state.bin"
expect_fail 2 'tampered/state\.bin.*checksum' "$BIN" "$W/c.json" train.steps=8 "checkpoint.resume=$W/tampered" \
    "out_dir=$W/tampered_out"

# resuming with what an exact continuation depends on changed is refused, naming the key and both
# values; checkpoint.allow_changes=true continues with a warning
expect_fail 2 "$ck cannot continue exactly.*train\.micro_batch: 2 -> 4.*checkpoint\.allow_changes=true" \
    "$BIN" "$W/c.json" train.steps=4 train.micro_batch=4 "checkpoint.resume=$ck" "out_dir=$W/mb"
"$BIN" "$W/c.json" train.steps=4 train.micro_batch=4 checkpoint.allow_changes=true "checkpoint.resume=$ck" \
    "out_dir=$W/mb_allowed" > "$W/mb_allowed.txt" || die "checkpoint.allow_changes=true did not resume"
grep -q 'train\.micro_batch: 2 -> 4 (no exact resume)' "$W/mb_allowed.txt" &&
    grep -q '^warning: checkpoint\.allow_changes=true' "$W/mb_allowed.txt" || die "allowed changes: $(cat "$W/mb_allowed.txt")"
# a resume that cannot continue at this dp is said once, by rank 0 (every rank finds it)
rc=0
timeout 120 mpirun --oversubscribe -np 3 -x OMP_NUM_THREADS=1 "$BIN" "$W/c.json" train.steps=4 \
    checkpoint.allow_changes=true "checkpoint.resume=$ck" "out_dir=$W/dp3" > /dev/null 2> "$W/dp3.err" || rc=$?
[ $rc -eq 2 ] || die "resume at dp=3: expected exit 2, got $rc: $(cat "$W/dp3.err")"
[ "$(grep -c 'error:' "$W/dp3.err")" -eq 1 ] && grep -q '^\[rank 0\] error: .*parallel\.dp=3' "$W/dp3.err" ||
    die "resume at dp=3: not one message from rank 0: $(cat "$W/dp3.err")"

# non-finite weights in model.init: named by the file and the tensor
cp "$W/base/model_00000004.bin" "$W/nan.bin"
python3 -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(1024 + 4 * 3); f.write(struct.pack("<f", float("nan")))' "$W/nan.bin"
expect_fail 2 "model file $W/nan\.bin: 1 of [0-9]+ parameters are not finite \(the first in tensor wte element 3, nan\)" \
    "$BIN" "$W/c.json" "model.init=$W/nan.bin" "out_dir=$W/nan_out"

# a full disk (here: a file size limit) at a save names the checkpoint, not only its temporary folder
rc=0
(ulimit -f 100; trap '' XFSZ; exec "$BIN" "$W/c.json" train.steps=4 checkpoint.every=2 "out_dir=$W/diskfull") \
    > /dev/null 2> "$W/diskfull.err" || rc=$?
[ $rc -eq 2 ] && grep -q "checkpoint\.dir: cannot save checkpoint $W/diskfull/checkpoints/step_00000002; earlier checkpoints are kept: .*File too large" "$W/diskfull.err" ||
    die "full disk: rc=$rc $(cat "$W/diskfull.err")"

# synth_shards names the bad argument
expect_fail 2 'synth_shards: --tokens 12x: not an integer' "$SYNTH" --out "$W/s/x" --tokens 12x
expect_fail 2 'synth_shards: --vocab 1: not an integer in \[2, 16777216\]' "$SYNTH" --out "$W/s/x" --vocab 1
expect_fail 2 'synth_shards: --noise 2: not a number in \[0, 1\]' "$SYNTH" --out "$W/s/x" --noise 2
expect_fail 2 'synth_shards: --out PREFIX is required' "$SYNTH" --tokens 100

# a fresh run (resume "never") in a folder that holds another run is refused, naming the folder
# and the ways out; the old run's checkpoints are untouched
expect_fail 2 "never.*$W/base.*checkpoint\.resume=auto" "$BIN" "$W/c.json" train.steps=4 checkpoint.every=2 \
    checkpoint.resume=never "out_dir=$W/base"
[ -f "$W/base/checkpoints/step_00000002/DONE" ] && [ -f "$ck/DONE" ] || die "the refused run touched the old checkpoints"

# rolling back to step 2, then crashing: "auto" continues the rolled-back branch, not step 4
cp -r "$W/base" "$W/rollback"
rc=0
LLMC_FAULT=train_step_3 "$BIN" "$W/c.json" train.steps=4 checkpoint.every=2 checkpoint.keep=5 \
    "checkpoint.resume=$W/rollback/checkpoints/step_00000002" "out_dir=$W/rollback" > /dev/null 2>&1 || rc=$?
[ $rc -eq 137 ] || die "rollback: expected the fault's SIGKILL (137), got $rc"
[ -f "$W/rollback/checkpoints/abandoned_step_00000004/DONE" ] || die "rollback: step 4 was not set aside"
"$BIN" "$W/c.json" train.steps=4 checkpoint.every=2 checkpoint.keep=5 "out_dir=$W/rollback" > "$W/rollback.txt"
grep -q 'resumed from .*step_00000002 ' "$W/rollback.txt" || die "rollback: auto resumed the abandoned branch: $(grep resumed "$W/rollback.txt")"

# two trainers on one out_dir: the second stops at once naming the first one's pid; the lock
# goes with the process that held it
LLMC_FAULT=hang:train_step_1 "$BIN" "$W/c.json" train.steps=4 "out_dir=$W/shared" > /dev/null 2>&1 &
holder=$!
for _ in $(seq 100); do [ -s "$W/shared/train_gpt.lock" ] && [ -s "$W/shared/checkpoints/train_gpt.lock" ] && break; sleep 0.1; done
expect_fail 2 "out_dir.*$W/shared.*pid $holder" "$BIN" "$W/c.json" train.steps=4 "out_dir=$W/shared"
# ... and on its checkpoint folder, from a run with another out_dir
expect_fail 2 "checkpoint\.dir: $W/shared/checkpoints is in use .*pid $holder" "$BIN" "$W/c.json" train.steps=4 \
    "checkpoint.dir=$W/shared/checkpoints" "out_dir=$W/other"
kill -9 $holder
wait $holder || true
"$BIN" "$W/c.json" train.steps=2 "out_dir=$W/shared" > /dev/null || die "the lock outlived its holder"

# unusable folders are found at start-up, before any training
touch "$W/afile"
expect_fail 2 "out_dir.*$W/afile" "$BIN" "$W/c.json" "out_dir=$W/afile"
expect_fail 2 "checkpoint\.dir.*$W/afile/ck" "$BIN" "$W/c.json" "checkpoint.dir=$W/afile/ck" "out_dir=$W/ckbad"
[ ! -e "$W/ckbad/log.jsonl" ] || ! grep -q '"loss"' "$W/ckbad/log.jsonl" || die "trained before finding checkpoint.dir unusable"

# the final checkpoint is written before the final model: a model path that cannot be written
# loses no training
mkdir -p "$W/final/model_00000004.bin"
rc=0
"$BIN" "$W/c.json" train.steps=4 checkpoint.every=3 "out_dir=$W/final" > /dev/null 2> "$W/final.err" || rc=$?
[ $rc -eq 2 ] || die "unwritable final model: expected exit 2, got $rc: $(cat "$W/final.err")"
[ -f "$W/final/checkpoints/step_00000004/DONE" ] || die "unwritable final model: the final checkpoint was not written first"

# a save longer than parallel.timeout_s does not end the job: the other rank waits for rank 0's
# write outside the collective timeout (rank 0 sleeps 5 s inside its step-2 save; timeout 2 s)
LLMC_FAULT=slow:checkpoint_after_model_2 timeout 120 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x LLMC_FAULT \
    "$BIN" "$W/c.json" train.steps=3 checkpoint.every=2 parallel.timeout_s=2 "out_dir=$W/slow" > "$W/slow.txt" 2>&1 ||
    die "a slow save ended the job: $(tail -n 5 "$W/slow.txt")"
grep -q 'sleeping 5 s' "$W/slow.txt" || die "the slow-save fault did not fire: $(tail -n 5 "$W/slow.txt")"
[ -f "$W/slow/model_00000003.bin" ] || die "slow save: no final model"

# a token >= vocab_size near the end of a shard fails at start-up (the shard's first open), not
# in the step that reads it (here: never, in 10 steps)
mkdir -p "$W/badtok"
cp "$W"/data/train_*.bin "$W/badtok/"
python3 - "$W/badtok/train_000000.bin" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
ntok = struct.unpack("<3i", f.read(12))[2]
f.seek(1024 + 2 * (ntok - 3))
f.write(struct.pack("<H", 600))
PY
rc=0
"$BIN" "$W/c.json" train.steps=10 "data.train=$W/badtok/train_*.bin" "out_dir=$W/badtok_out" > "$W/badtok.txt" 2>&1 || rc=$?
[ $rc -eq 2 ] || die "a bad token late in a shard: expected exit 2, got $rc"
grep -q 'train_000000\.bin: token id 600 at token offset 19997 is >= vocab_size 512' "$W/badtok.txt" || die "bad token: $(tail -n 3 "$W/badtok.txt")"
! grep -q 'step .*loss' "$W/badtok.txt" || die "bad token: trained before finding it"

# after a crash and a resume, log.jsonl reads as one run: the records written after the
# checkpoint (step 5) and its evaluation at step 4 are not repeated
common=(train.steps=6 checkpoint.every=4 eval.every=2)
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/onelog_full" > /dev/null
rc=0
LLMC_FAULT=train_step_6 "$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/onelog" > /dev/null 2>&1 || rc=$?
[ $rc -eq 137 ] || die "one log: expected the fault's SIGKILL (137), got $rc"
grep -q '"step":5,' "$W/onelog/log.jsonl" || die "one log: step 5 was not logged before the crash"
"$BIN" "$W/c.json" "${common[@]}" "out_dir=$W/onelog" > /dev/null
diff <(grep -o '"step":[0-9]*' "$W/onelog_full/log.jsonl") <(grep -o '"step":[0-9]*' "$W/onelog/log.jsonl") ||
    die "one log: the resumed run's log.jsonl has other records than one run's"
diff <(losses "$W/onelog_full/log.jsonl") <(losses "$W/onelog/log.jsonl") || die "one log: losses differ"
echo "bad-input sweep: all refused as expected"
