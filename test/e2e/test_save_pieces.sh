# A save across processes holds no other rank's part of the state. World rank 0 writes each array a
# chunk at a time and asks the ranks that hold that chunk's elements for them alone (PieceServer,
# llmc/train/layout.h): the members of its model-parallel group and, for ZeRO's shards, the other
# ranks of their DP groups, each sending from where its part lies, with no copy. (Before, each
# piece was gathered over DP to its DP rank 0, and every piece to world rank 0: at tp=2 rank 0 held
# a copy of its own piece and of the other's, P x 12 bytes of weights, m and v for a model of P
# parameters; at dp=2 a copy of the whole state.)
# (a) Host memory, log.jsonl's host_peak_bytes: GPT-2 of 21.7M parameters, two checkpoints and the
#     final weights, against the same run saving nothing, at tp=2, dp=2 (world rank 0 reads its own
#     state where it lies, as one process does) and dp=2 with ZeRO-3 (each rank sends its shards):
#     on either rank the peak grows by less than a quarter of P x 12 bytes (P x 3 = 65 MB). The
#     gathers grew rank 0's by 212 MB (tp=2) and 263 MB (dp=2); serving tp=2's pieces from copies,
#     by 86 MB.
# (b) The bytes: the tp=2 run with checkpoint.async (each rank copies what it holds, and world rank
#     0 writes from those copies on a thread while training goes on; its step-2 write slowed by 5 s
#     so that steps 3 and 4 change the state under it) writes the same weights and the same
#     optimizer arrays as the synchronous run; and at
#     tp=2 x dp=2 with ZeRO-1 (m and v sent by the shards' DP ranks) a resume from step 2 ends
#     bit-identical to the uninterrupted run.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
export OMP_NUM_THREADS=1
make_data
tiny_config "$W/c.json"
sed -i 's/"n_layer": 2, "n_head": 2, "d_model": 32/"n_layer": 3, "n_head": 12, "d_model": 768/' "$W/c.json"
P=21682944  # 3 x (12 x 768^2 + 13 x 768) + (512 + 32) x 768 + 2 x 768
common=(train.steps=4 train.grad_accum=1 eval.every=0 eval.sample_every=0)

# (a)
peaks() { jq -r 'select(.host_peak_bytes) | .host_peak_bytes | map(tostring) | join(" ")' "$1"; }
limit=$((P * 12 / 4))
for layout in parallel.tp=2 parallel.dp=2 "parallel.dp=2 parallel.zero=3"; do
    name=$(echo "$layout" | tr ' =.' '___')
    dp_run 2 "$W/c.json" "${common[@]}" $layout checkpoint.every=2 checkpoint.keep=5 out.format=llmc \
        "out_dir=$W/save_$name" > "$W/save.txt" 2>&1 || die "$layout with saves: $(tail -n 5 "$W/save.txt")"
    dp_run 2 "$W/c.json" "${common[@]}" $layout out.format=none "out_dir=$W/none_$name" > "$W/none.txt" 2>&1 ||
        die "$layout without saves: $(tail -n 5 "$W/none.txt")"
    grep -q "peak host memory: .* on world rank 0" "$W/save.txt" || die "$layout: no 'peak host memory' line"
    read -r -a with <<< "$(peaks "$W/save_$name/log.jsonl")"
    read -r -a without <<< "$(peaks "$W/none_$name/log.jsonl")"
    [ "${#with[@]}" = 2 ] && [ "${#without[@]}" = 2 ] || die "$layout: no host_peak_bytes record of two ranks"
    for r in 0 1; do
        grow=$(awk -v s="${with[$r]}" -v n="${without[$r]}" 'BEGIN { printf "%.0f", s - n }')
        echo "  $layout rank $r: peak $(awk -v x="${with[$r]}" 'BEGIN { printf "%.0f", x / 1e6 }') MB with saves," \
            "$(awk -v x="${without[$r]}" 'BEGIN { printf "%.0f", x / 1e6 }') MB without (limit +$((limit / 1000000)) MB)"
        [ "$grow" -lt "$limit" ] || die "$layout rank $r: the saves grew its peak host memory by $grow bytes (limit $limit)"
    done
done

# (b) the same bytes from the gathered pieces (checkpoint.async)
LLMC_FAULT=slow:checkpoint_after_model_2 dp_run 2 "$W/c.json" "${common[@]}" parallel.tp=2 checkpoint.every=2 \
    checkpoint.keep=5 checkpoint.async=true out.format=llmc "out_dir=$W/async" > "$W/async.txt" 2>&1 ||
    die "the run with checkpoint.async failed: $(tail -n 5 "$W/async.txt")"
# each rank's copy is its half of the state: rank 0's peak grows by P x 6 bytes at most (the gather
# to rank 0 it replaced held P x 12 there)
read -r -a with <<< "$(peaks "$W/async/log.jsonl")"
read -r -a without <<< "$(peaks "$W/none_parallel_tp_2/log.jsonl")"
for r in 0 1; do
    grow=$(awk -v s="${with[$r]}" -v n="${without[$r]}" 'BEGIN { printf "%.0f", s - n }')
    echo "  checkpoint.async tp=2 rank $r: peak +$((grow / 1000000)) MB (limit +$((P * 6 / 1000000)) MB)"
    [ "$grow" -lt $((P * 6)) ] || die "checkpoint.async rank $r: the saves grew its peak host memory by $grow bytes"
done
# the step-2 write slept 5 s between model.bin and state.bin: steps 3 and 4 went on meanwhile
[ "$(grep -n 'step     4/4\|step_00000002 (written in the background' "$W/async.txt" | head -n 1 | grep -c 'step     4/4')" = 1 ] ||
    die "checkpoint.async: step 4 was not trained while the step-2 checkpoint was written"
for step in 00000002 00000004; do
    a="$W/save_parallel_tp_2/checkpoints/step_$step" b="$W/async/checkpoints/step_$step"
    cmp "$a/model.bin" "$b/model.bin" || die "step $step: model.bin differs from checkpoint.async's"
    cmp <(tensors "$a/state.bin") <(tensors "$b/state.bin") || die "step $step: state.bin's arrays differ from checkpoint.async's"
done
cmp "$W/save_parallel_tp_2/model_00000004.bin" "$W/async/model_00000004.bin" || die "the final weights differ from checkpoint.async's"
echo "  tp=2: checkpoints and final weights equal checkpoint.async's bytes"

# (b) ZeRO-1 at tp=2 x dp=2: saved from the members' DP gathers, resumed bit-identical
tiny_config "$W/t.json"
z=(parallel.tp=2 parallel.dp=2 parallel.zero=1 train.grad_accum=1 train.steps=4 eval.every=0 checkpoint.every=2 checkpoint.keep=5)
dp_run 4 "$W/t.json" "${z[@]}" "out_dir=$W/zfull" > "$W/zfull.txt" 2>&1 || die "tp2 x dp2: $(tail -n 5 "$W/zfull.txt")"
dp_run 4 "$W/t.json" "${z[@]}" "checkpoint.resume=$W/zfull/checkpoints/step_00000002" "out_dir=$W/zres" \
    > "$W/zres.txt" 2>&1 || die "tp2 x dp2 resume: $(tail -n 5 "$W/zres.txt")"
grep -q 'resumed from .*step_00000002 at step 2' "$W/zres.txt" || die "tp2 x dp2 did not resume"
[ "$(losses "$W/zres/log.jsonl")" = "$(losses "$W/zfull/log.jsonl" | tail -n 2)" ] || die "tp2 x dp2: the resumed losses differ"
cmp "$W/zfull/model_00000004.bin" "$W/zres/model_00000004.bin" || die "tp2 x dp2: the final weights differ"
echo "  tp=2 x dp=2 ZeRO-1: resumed bit-identical"
echo "PASSED"
