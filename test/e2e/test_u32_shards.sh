# uint32 token shards (version 7): a tiny GPT-2 with a 70000-token vocabulary trains on them,
# a token past the model's vocabulary is refused naming the shard, and uint16 and uint32 shards
# holding the same tokens give bit-identical losses.
source "$(dirname "$0")/lib.sh"

# header ints and the largest token of a uint32 shard, read with od (not the code under test)
header() { od -An -t d4 -N 12 "$1" | tr -s ' '; }
max_u32() { od -An -v -t u4 -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d' | sort -n | tail -n1; }

mkdir -p "$W/big"
"$SYNTH" --out "$W/big/train" --shards 2 --tokens 20000 --vocab 70000 --seed 1 >/dev/null
"$SYNTH" --out "$W/big/val" --shards 1 --tokens 5000 --vocab 70000 --seed 2 >/dev/null
f="$W/big/train_000000.bin"
[ "$(header "$f")" = " 20240801 7 20000" ] || die "uint32 shard header: $(header "$f")"
[ "$(stat -c %s "$f")" -eq $((1024 + 4 * 20000)) ] || die "uint32 shard size: $(stat -c %s "$f")"
top=$(max_u32 "$f")
[ "$top" -gt 65535 ] && [ "$top" -lt 70000 ] || die "largest token $top: expected one in [65536, 70000)"

cat > "$W/big.json" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": { "n_layer": 1, "n_head": 2, "d_model": 16, "vocab_size": 70000, "max_seq_len": 16 },
  "data": { "train": "$W/big/train_*.bin", "val": "$W/big/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 1, "steps": 12, "lr": 1e-2, "warmup_steps": 0 },
  "eval": { "every": 0 },
  "out_dir": "$W/out_big" }
JSON
"$BIN" "$W/big.json" > "$W/big.txt"
log="$W/out_big/log.jsonl"
[ "$(losses "$log" | wc -l)" -eq 12 ] || die "expected 12 loss records"
! losses "$log" | grep -Evq '^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$' || die "non-finite loss: $(losses "$log" | tr '\n' ' ')"
first=$(losses "$log" | head -n1); last=$(losses "$log" | tail -n1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || die "loss did not fall: $first -> $last"

# a model vocabulary too small for the shard's tokens is a user error naming the shard
expect_fail 2 "shard $W/big/train_00000[01].bin: token id [0-9]+ at token offset [0-9]+ is >= vocab_size 65536" \
    "$BIN" "$W/big.json" model.vocab_size=65536 "out_dir=$W/out_small_vocab"

# the same tokens as uint16 and as uint32 shards: bit-identical losses (train and val)
"$SYNTH" --out "$W/d16/train" --shards 2 --tokens 20000 --vocab 512 --seed 1 >/dev/null
"$SYNTH" --out "$W/d16/val" --shards 1 --tokens 5000 --vocab 512 --seed 2 >/dev/null
"$SYNTH" --out "$W/d32/train" --shards 2 --tokens 20000 --vocab 512 --seed 1 --u32 >/dev/null
"$SYNTH" --out "$W/d32/val" --shards 1 --tokens 5000 --vocab 512 --seed 2 --u32 >/dev/null
[ "$(header "$W/d16/train_000001.bin")" = " 20240520 1 20000" ] || die "uint16 header: $(header "$W/d16/train_000001.bin")"
[ "$(header "$W/d32/train_000001.bin")" = " 20240801 7 20000" ] || die "uint32 header: $(header "$W/d32/train_000001.bin")"
cmp -s <(od -An -v -t u2 -j 1024 "$W/d16/train_000001.bin" | tr -s ' ' '\n' | sed '/^$/d') \
       <(od -An -v -t u4 -j 1024 "$W/d32/train_000001.bin" | tr -s ' ' '\n' | sed '/^$/d') \
    || die "synth_shards --u32 wrote other tokens than the uint16 shards"
tiny_config "$W/c.json"
for v in 16 32; do
    "$BIN" "$W/c.json" model.n_layer=1 train.steps=8 eval.every=4 eval.batches=2 data.shuffle=true \
        "data.train=$W/d$v/train_*.bin" "data.val=$W/d$v/val_*.bin" "out_dir=$W/out$v" > /dev/null
done
[ "$(losses "$W/out16/log.jsonl" | wc -l)" -eq 8 ] || die "expected 8 loss records"
diff <(grep -o '"\(val_\)\{0,1\}loss":[^,}]*' "$W/out16/log.jsonl") \
     <(grep -o '"\(val_\)\{0,1\}loss":[^,}]*' "$W/out32/log.jsonl") || die "uint16 and uint32 shards give different losses"
echo "test_u32_shards: ok"
