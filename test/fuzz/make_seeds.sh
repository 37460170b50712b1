#!/usr/bin/env bash
# Writes the fuzz targets' seed inputs into test/fuzz/corpus/<target>/ (committed; rerun after a
# file format changes). Needs train_gpt and dev/data/synth_shards (make CUDA=0 train_gpt
# dev/data/synth_shards) and the GPT-2 tokenizer files (scripts/get_tokenizer.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=test/fuzz/corpus
W=$(mktemp -d "${TMPDIR:-/tmp}/llmc_seeds.XXXXXX")
trap 'rm -rf "$W"' EXIT
mkdir -p $C/fuzz_config $C/fuzz_shard $C/fuzz_checkpoint $C/fuzz_model_file $C/fuzz_safetensors $C/fuzz_tokenizer
sep=$'\n@@\n'

# config: the shipped configs, and one with overrides of each kind
for f in configs/tiny_cpu.json configs/llama_kjv_small.json; do cp "$f" "$C/fuzz_config/$(basename "$f")"; done
printf '%s%s%s%s%s%s%s' "$(cat configs/tiny_cpu.json)" "$sep" 'train.lr=1e-3' "$sep" 'model={"n_layer": 3}' "$sep" \
    'data.shuffle=true' > $C/fuzz_config/overrides.txt

# shards: uint16 and uint32 tokens
dev/data/synth_shards --out "$W/u16" --shards 1 --tokens 200 --vocab 300 --seed 1 > /dev/null
dev/data/synth_shards --out "$W/u32" --shards 1 --tokens 200 --vocab 300 --seed 2 --u32 > /dev/null
cp "$W"/u16_000000.bin $C/fuzz_shard/u16.bin
cp "$W"/u32_000000.bin $C/fuzz_shard/u32.bin

# a checkpoint and final models of the fuzz targets' tiny shapes (GPT-2, and Llama for safetensors)
dev/data/synth_shards --out "$W/d" --shards 1 --tokens 400 --vocab 60 --seed 3 > /dev/null
common=(device=cpu precision=fp32 model.n_layer=1 model.n_head=2 model.d_model=8 model.vocab_size=60
        model.max_seq_len=8 "data.train=$W/d_*.bin" train.micro_batch=1 train.seq_len=8 train.steps=2
        train.warmup_steps=0 checkpoint.every=1 checkpoint.keep=1 eval.every=0)
./train_gpt - "${common[@]}" "out_dir=$W/gpt2" > /dev/null
./train_gpt - "${common[@]}" model.arch=llama model.n_kv_head=1 model.ffn_dim=16 "out_dir=$W/llama" > /dev/null
ck="$W/gpt2/checkpoints/step_00000002"
for fix in 0 1; do
    { printf "\\x0$fix"; cat "$ck/model.bin"; printf '%s' "$sep"; cat "$ck/state.bin"; } > $C/fuzz_checkpoint/step2_fix$fix.bin
done
# a local SGD checkpoint (state version 2: the outer state after the main one)
./train_gpt - "${common[@]}" train.steps=3 parallel.local_sgd.every=2 "out_dir=$W/local" > /dev/null
ck="$W/local/checkpoints/step_00000003"
{ printf '\x01'; cat "$ck/model.bin"; printf '%s' "$sep"; cat "$ck/state.bin"; } > $C/fuzz_checkpoint/local_sgd_fix1.bin
cp "$W/gpt2/model_00000002.bin" $C/fuzz_model_file/gpt2.bin
cp "$W/llama/model_00000002.bin" $C/fuzz_model_file/llama.bin
cp "$W/llama/model_00000002.safetensors" $C/fuzz_safetensors/llama.safetensors

# tokenizer: GPT-2's 256 byte tokens, its first 40 merges and <|endoftext|>, then a text
python3 - "$C/fuzz_tokenizer/gpt2_small.txt" <<'PY'
import json, sys
enc = json.load(open("data/tokenizer/encoder.json"))
merges = open("data/tokenizer/vocab.bpe", encoding="utf-8").read().split("\n")[1:41]
by_id = {i: t for t, i in enc.items()}
small = {by_id[i]: i for i in range(256 + len(merges))}
small["<|endoftext|>"] = len(small)
text = "Hello world, the theory of everything: 3.14159 \u00e9t\u00e9 \U0001F600\n\n  end"
open(sys.argv[1], "w", encoding="utf-8").write(
    json.dumps(small) + "\n@@\n" + "#version: 0.2\n" + "\n".join(merges) + "\n" + "\n@@\n" + text)
PY
# safetensors headers the reader refuses (issue 34): two tensors over overlapping bytes, a tensor
# named twice; an 8-byte little-endian header length, the header, 32 data bytes
st_seed() {  # st_seed FILE HEADER
    python3 -c 'import struct, sys; h = sys.argv[2].encode(); open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(32))' "$1" "$2"
}
st_seed $C/fuzz_safetensors/overlap.safetensors \
    '{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"y":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}'
st_seed $C/fuzz_safetensors/duplicate.safetensors \
    '{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"x":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}'
ls -l $C/*/
