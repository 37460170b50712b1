# Bad configuration of every class: exit code 2, a message naming the key, nothing written.
source "$(dirname "$0")/lib.sh"
make_data
tiny_config "$W/c.json"
OUT="$W/out"
run_bad() { expect_fail 2 "$1" "$BIN" "$W/c.json" "${@:2}"; [ ! -e "$OUT" ] || die "out_dir was created on a config error ($*)"; }

run_bad 'train\.lrr.*did you mean train\.lr'      train.lrr=0.1
run_bad 'train\.steps.*integer'                   'train.steps="ten"'
run_bad 'train\.steps'                            train.steps=2.5
run_bad 'train\.lr'                               train.lr=-1
run_bad 'train\.lr_schedule.*cosine'              train.lr_schedule=triangle
run_bad 'parallel\.overlap'                     parallel.overlap=maybe
LLMC_COMM_DELAY_MS=soon run_bad 'LLMC_COMM_DELAY_MS.*soon'
run_bad 'model\.d_model.*model\.n_head|model\.n_head.*model\.d_model' model.d_model=33
run_bad 'train\.seq_len.*model\.max_seq_len|model\.max_seq_len.*train\.seq_len' train.seq_len=64
run_bad 'data\.train.*nothing|data\.train.*no file|data\.train.*match' "data.train=$W/none_*.bin"
run_bad 'device'                                  device=tpu
run_bad 'model\.init'                             model.init=/nonexistent/model.bin
run_bad 'bogus'                                   bogus
# a config file that is not JSON, and one that does not exist
echo '{ "train": { "steps": 3, } ' > "$W/broken.json"
expect_fail 2 'broken\.json' "$BIN" "$W/broken.json"
expect_fail 2 'missing\.json' "$BIN" "$W/missing.json"
# precision the CPU cannot run
run_bad 'precision' precision=bf16
# a shard that is not a shard
head -c 5000 /dev/urandom > "$W/data/junk_000.bin"
run_bad 'junk_000\.bin.*magic' "data.train=$W/data/junk_*.bin"
# an llm.c model whose shape disagrees with the config names the field
"$BIN" "$W/c.json" train.steps=1 train.warmup_steps=0 "out_dir=$W/first" >/dev/null
expect_fail 2 'model\.n_layer.*file' "$BIN" "$W/c.json" model.n_layer=3 "model.init=$W/first/model_00000001.bin"
# --print-config prints the resolved config with defaults filled and exits 0
"$BIN" "$W/c.json" train.lr=0.01 --print-config > "$W/resolved.json"
grep -q '"lr": 0.01' "$W/resolved.json" || die "--print-config does not show the override"
grep -q '"beta2": 0.95' "$W/resolved.json" || die "--print-config does not show defaults"
[ ! -e "$OUT" ] || die "--print-config wrote out_dir"
