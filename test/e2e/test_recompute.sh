# Activation recomputation changes memory, not training: with deterministic kernels the layers run
# again in backward give bitwise the values they gave in forward. For a GPT-2 and a Llama (grouped-
# query, SwiGLU) tiny model and each layout below, train.recompute=selective and =full train 3 steps
# with exactly the losses (the log's text) and the final weights (cmp) of recompute=none, and the
# memory table's activation row shrinks: selective < none, full < selective.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
config() {  # config FILE MODEL_JSON
    cat > "$1" <<JSON
{ "device": "cpu", "precision": "fp32",
  "model": $2,
  "data": { "train": "$W/data/train_*.bin", "val": "$W/data/val_*.bin" },
  "train": { "micro_batch": 2, "seq_len": 16, "grad_accum": 4, "steps": 3, "lr": 3e-3, "warmup_steps": 1,
             "weight_decay": 0.1, "grad_clip": 1.0 },
  "eval": { "every": 3, "batches": 1 },
  "out_dir": "$W/out" }
JSON
}
config "$W/gpt2.json" '{ "n_layer": 4, "n_head": 4, "d_model": 32, "vocab_size": 512, "max_seq_len": 32 }'
config "$W/llama.json" '{ "arch": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 32, "ffn_dim": 48,
                          "vocab_size": 512, "max_seq_len": 32 }'

act_bytes() { sed -n 's/^  activations .* \([0-9][0-9]*\) B.*/\1/p' "$1"; }  # the memory table's activation row

run() {  # run NAME NPROC ARGS...
    local name=$1 n=$2; shift 2
    local out="$W/$name"
    if [ "$n" -eq 1 ]; then "$BIN" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$name failed: $(tail -n 20 "$out.txt")"
    else dp_run "$n" "$@" "out_dir=$out" > "$out.txt" 2>&1 || die "$name failed: $(tail -n 20 "$out.txt")"; fi
}
check() {  # check FAMILY NAME NPROC ARGS...
    local fam=$1 name=$2 n=$3; shift 3
    local base="$W/$fam.$name.none" prev=""
    for rc in none selective full; do
        run "$fam.$name.$rc" "$n" "$W/$fam.json" "train.recompute=$rc" "$@"
        local out="$W/$fam.$name.$rc" bytes
        bytes=$(act_bytes "$out.txt")
        [ -n "$bytes" ] || die "$fam $name $rc: no activation row in the memory table"
        if [ "$rc" != none ]; then
            diff <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$base/log.jsonl") \
                <(grep -o '"\(loss\|val_loss\)":[^,}]*' "$out/log.jsonl") > /dev/null ||
                die "$fam $name: recompute=$rc losses differ from none"
            cmp -s "$base/model_00000003.bin" "$out/model_00000003.bin" ||
                die "$fam $name: recompute=$rc final weights differ from none"
            [ "$bytes" -lt "$prev" ] || die "$fam $name: recompute=$rc activations $bytes B not below the previous $prev B"
        fi
        [ "$(losses "$out/log.jsonl" | wc -l)" -eq 3 ] || die "$fam $name $rc: expected 3 loss records"
        prev=$bytes
        printf '%s %-10s %-9s activations %8s B\n' "$fam" "$name" "$rc" "$bytes"
    done
}
for fam in gpt2 llama; do
    check "$fam" one 1
    check "$fam" dp2_zero3 2 parallel.dp=2 parallel.zero=3 train.grad_accum=2
    check "$fam" tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
    check "$fam" pp2_1f1b 2 parallel.pp=2 parallel.pp_schedule=1f1b
    check "$fam" pp2_inter 2 parallel.pp=2 parallel.pp_schedule=interleaved parallel.pp_virtual=2
done
echo "recompute selective and full are bitwise recompute none, with less activation memory"
