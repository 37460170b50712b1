# A short CPU training run on a generated shard: the loss falls, every record has its keys,
# the final weights are written in llm.c format and reload, and a second run is bit-identical.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"
"$BIN" "$W/c.json" train.steps=30 eval.every=10 eval.batches=2 eval.sample_every=15 eval.sample_tokens=8 > "$W/run1.txt"
log="$W/out/log.jsonl"
[ "$(losses "$log" | wc -l)" -eq 30 ] || die "expected 30 loss records"
first=$(losses "$log" | head -n1); last=$(losses "$log" | tail -n1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || die "loss did not fall by 1.0: $first -> $last"
for k in step loss lr grad_norm ms tok_per_s; do grep -q "\"$k\":" "$log" || die "log.jsonl lacks $k"; done
[ "$(grep -c '"val_loss"' "$log")" -ge 3 ] || die "expected val_loss at steps 0, 10, 20, 30"
grep -q 'sample' "$W/run1.txt" || die "no text sample printed"
grep -q 'parameters' "$W/run1.txt" || die "no memory table printed"
f="$W/out/model_00000030.bin"
[ -f "$f" ] || die "final model not written"
# header: magic 20240326, version 3
[ "$(od -An -t d4 -N 8 "$f" | tr -s ' ')" = " 20240326 3" ] || die "bad model header: $(od -An -t d4 -N 8 "$f")"
# the written model loads as init and gives the final step's weights: loss at step 1 of a new run
# equals the val loss evaluated on it, so just check it runs and starts below the first run's start
"$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 "model.init=$f" "out_dir=$W/out2" > /dev/null
l2=$(losses "$W/out2/log.jsonl")
awk -v a="$first" -v b="$l2" 'BEGIN { exit !(b < a - 1.0) }' || die "reloaded model does not carry the training: $l2"
# determinism: the same config gives bitwise the same losses
"$BIN" "$W/c.json" train.steps=30 "out_dir=$W/out3" > /dev/null
diff <(losses "$log") <(losses "$W/out3/log.jsonl") || die "two identical runs differ"
