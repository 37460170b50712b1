# A resume reads in pieces: world rank 0 first checks both files' checksums (read through a buffer,
# nothing kept: checkpoint_load without a WholeState); every rank, rank 0 too, then reads only what
# it holds (its part of the weights from model.bin, its ZeRO shard of the moments and master
# weights from state.bin: checkpoint_open, llmc/io/checkpoint.h).
# (a) bf16 on the emulated device (model.bin version 5, fp32 master weights in state.bin) at dp=2
#     with ZeRO-1 and ZeRO-3, and fp32 on the CPU at tp=2 x dp=2 (column-split tensors): resumed
#     from step 3 in the same layout, each run ends bit-identical to its uninterrupted run (losses
#     and final weights): every rank's pieces were the saved state.
# (b) a flipped byte in state.bin's moments, its metadata intact (what the other ranks check holds):
#     the resume at dp=2 ends with exit 2 and rank 0's "checksum mismatch", said once, before any step.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
emu_tiny_config "$W/bf16.json" bf16
tiny_config "$W/fp32.json"
common=(train.steps=6 checkpoint.every=3 checkpoint.keep=5 parallel.bucket_mb=0.01 eval.every=0)
CPU_BIN=$BIN
for layout in "$EMU bf16 5 2 parallel.zero=1" "$EMU bf16 5 2 parallel.zero=3" "$CPU_BIN fp32 3 4 parallel.tp=2 parallel.zero=1"; do
    read -r BIN prec version n args <<< "$layout"
    dev=$([ "$prec" = bf16 ] && echo cuda || echo cpu)
    name="${prec}_$(echo "$args" | tr ' =.' '___')"
    dp_run "$n" "$W/$prec.json" device=$dev "${common[@]}" $args "out_dir=$W/full_$name" > "$W/full_$name.txt" 2>&1 ||
        die "$args: $(tail -n 5 "$W/full_$name.txt")"
    ck="$W/full_$name/checkpoints/step_00000003"
    [ "$(od -An -t d4 -j 4 -N 4 "$ck/model.bin" | tr -d ' ')" = "$version" ] || die "$name: model.bin is not version $version"
    dp_run "$n" "$W/$prec.json" device=$dev "${common[@]}" $args "checkpoint.resume=$ck" "out_dir=$W/res_$name" \
        > "$W/res_$name.txt" 2>&1 || die "$name resume: $(tail -n 5 "$W/res_$name.txt")"
    grep -q 'resumed from .*step_00000003 at step 3' "$W/res_$name.txt" || die "$name did not resume"
    [ "$(losses "$W/res_$name/log.jsonl")" = "$(losses "$W/full_$name/log.jsonl" | tail -n 3)" ] ||
        die "$name: the resumed losses differ"
    cmp "$W/full_$name/model_00000006.bin" "$W/res_$name/model_00000006.bin" || die "$name: final weights differ"
    echo "  $n ranks, $prec, $args: resumed bit-identical"
done
BIN=$CPU_BIN

# (b) state.bin: 32-byte header, metadata (int32 #2 of the header bytes), then m: flip a byte of m
ck="$W/full_fp32_parallel_tp_2_parallel_zero_1/checkpoints/step_00000003"
bad="$W/bad/step_00000003"
mkdir -p "$W/bad" && cp -r "$ck" "$bad"
meta=$(od -An -t d4 -j 8 -N 4 "$bad/state.bin" | tr -d ' ')
at=$((32 + meta + 1000))
byte=$(od -An -t u1 -j $at -N 1 "$bad/state.bin" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$bad/state.bin" bs=1 seek=$at conv=notrunc status=none
cmp -s "$ck/state.bin" "$bad/state.bin" && die "the byte was not flipped"
rc=0
dp_run 2 "$W/fp32.json" "${common[@]}" parallel.zero=1 "checkpoint.resume=$bad" "out_dir=$W/res_bad" \
    > "$W/res_bad.txt" 2>&1 || rc=$?
[ $rc -eq 2 ] || die "a corrupt checkpoint resumed at dp=2: rc=$rc $(tail -n 5 "$W/res_bad.txt")"
[ "$(grep -c 'checksum mismatch' "$W/res_bad.txt")" -eq 1 ] || die "not one checksum message: $(cat "$W/res_bad.txt")"
grep -q "$bad/state.bin: checksum mismatch" "$W/res_bad.txt" || die "the message names no file: $(cat "$W/res_bad.txt")"
! grep -q '^step ' "$W/res_bad.txt" || die "a step ran from a corrupt checkpoint"
echo "  a flipped byte in the moments: exit 2, rank 0's checksum mismatch, no step"

# (c) model.init is read in pieces too (rank 0 checks the whole file first, every rank reads its
#     part): from an llm.c file at tp=2 x dp=2, from the safetensors that run wrote at pp=2 x tp=2,
#     and from those split into two shards with a transformers index at pp=2, one step at lr
#     1e-30 (fp32: no weight moves) ends on the file's very weights; a NaN in the file stops every
#     rank with exit 2, said once by rank 0 naming the file and the tensor, before any step.
init="$W/full_fp32_parallel_tp_2_parallel_zero_1/model_00000006.bin"
one=(train.steps=1 train.lr=1e-30 train.warmup_steps=0 eval.every=0 "model.init=$init")
dp_run 4 "$W/fp32.json" "${one[@]}" parallel.tp=2 parallel.zero=1 out.format=both "out_dir=$W/init_tp2" \
    > "$W/init_tp2.txt" 2>&1 || die "model.init at tp=2 x dp=2: $(tail -n 5 "$W/init_tp2.txt")"
cmp "$init" "$W/init_tp2/model_00000001.bin" || die "model.init at tp=2 x dp=2 did not start from the file's weights"
# the same weights as safetensors (GPT-2's Conv1D weights transposed in the file) at pp=2 x tp=2
dp_run 4 "$W/fp32.json" "${one[@]}" parallel.pp=2 parallel.tp=2 "model.init=$W/init_tp2/model_00000001.safetensors" \
    "out_dir=$W/init_hf" > "$W/init_hf.txt" 2>&1 || die "model.init from safetensors at pp=2 x tp=2: $(tail -n 5 "$W/init_hf.txt")"
cmp "$init" "$W/init_hf/model_00000001.bin" || die "model.init from safetensors at pp=2 x tp=2: not the file's weights"
# and sharded over two files by a transformers index (the layers' tensors in the second), at pp=2
python3 - "$W/init_tp2/model_00000001.safetensors" "$W/sharded" <<'PY'
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
head = json.loads(b[8:8 + n]); data = b[8 + n:]
shards, index = ({}, {}), {}
for name, e in head.items():
    if name == "__metadata__": continue
    k = 1 if ".h." in name else 0
    shards[k][name] = e
    index[name] = "model-%05d-of-00002.safetensors" % (k + 1)
for k, t in enumerate(shards):
    h, blob = {}, b""
    for name, e in t.items():
        lo, hi = e["data_offsets"]
        h[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [len(blob), len(blob) + hi - lo]}
        blob += data[lo:hi]
    hs = json.dumps(h).encode(); hs += b" " * (-len(hs) % 8)
    open("%s/model-%05d-of-00002.safetensors" % (out, k + 1), "wb").write(struct.pack("<Q", len(hs)) + hs + blob)
json.dump({"metadata": {"total_size": len(data)}, "weight_map": index}, open(out + "/model.safetensors.index.json", "w"))
PY
dp_run 2 "$W/fp32.json" "${one[@]}" parallel.pp=2 "model.init=$W/sharded/model.safetensors.index.json" \
    "out_dir=$W/init_sharded" > "$W/init_sharded.txt" 2>&1 || die "model.init from a sharded index: $(tail -n 5 "$W/init_sharded.txt")"
cmp "$init" "$W/init_sharded/model_00000001.bin" || die "model.init from a sharded index at pp=2: not the file's weights"
cp "$init" "$W/nan.bin"
python3 -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(1024 + 4 * 7); f.write(struct.pack("<f", float("nan")))' "$W/nan.bin"
rc=0
dp_run 2 "$W/fp32.json" "${one[@]}" parallel.tp=2 "model.init=$W/nan.bin" "out_dir=$W/init_nan" > "$W/init_nan.txt" 2>&1 || rc=$?
[ $rc -eq 2 ] || die "a NaN in model.init at tp=2: rc=$rc $(tail -n 5 "$W/init_nan.txt")"
[ "$(grep -c 'not finite' "$W/init_nan.txt")" -eq 1 ] &&
    grep -q "model file $W/nan\.bin: 1 of [0-9]* parameters are not finite (the first in tensor wte element 7, nan)" "$W/init_nan.txt" ||
    die "a NaN in model.init at tp=2: not one message naming the file and tensor: $(cat "$W/init_nan.txt")"
! grep -q '^step ' "$W/init_nan.txt" || die "a step ran from a model.init with a NaN"
echo "  model.init in pieces (llm.c at tp=2 x dp=2, safetensors at pp=2 x tp=2, sharded at pp=2): the file's weights; a NaN: exit 2, one message"
