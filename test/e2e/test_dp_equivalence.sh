# Data parallelism proves itself against one process: for dp in {2, 4} and ZeRO stages 0, 1, 2,
# 10 steps on dp ranks (grad_accum 2 each) give the losses, validation losses and final weights
# of one process with grad_accum 2*dp (the same global batch), to 1e-5 relative. A repeated run
# is bitwise identical. The memory table follows ZeRO's formulas.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
# small buckets (2621 elements) so that every step moves many of them, crossing shard edges
common=(parallel.bucket_mb=0.01 eval.every=5)
for dp in 2 4; do
    "$BIN" "$W/c.json" "${common[@]}" train.grad_accum=$((2 * dp)) eval.batches=$((2 * dp)) "out_dir=$W/base$dp" > /dev/null
    for zero in 0 1 2; do
        out="$W/dp${dp}_z$zero"
        dp_run $dp "$W/c.json" "${common[@]}" eval.batches=2 parallel.zero=$zero "out_dir=$out" > "$out.txt" ||
            die "dp=$dp zero=$zero failed: $(tail -n 20 "$out.txt")"
        echo "dp=$dp zero=$zero"
        close_losses "$W/base$dp/log.jsonl" "$out/log.jsonl"
        diff <(grep -c val_loss "$W/base$dp/log.jsonl") <(grep -c val_loss "$out/log.jsonl") > /dev/null || die "val loss records"
        paste <(grep -o '"val_loss":[^,}]*' "$W/base$dp/log.jsonl" | cut -d: -f2) \
              <(grep -o '"val_loss":[^,}]*' "$out/log.jsonl" | cut -d: -f2) |
            awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++ } END { exit bad > 0 }' ||
            die "dp=$dp zero=$zero: validation losses differ"
        close_weights "$W/base$dp/model_00000010.bin" "$out/model_00000010.bin"

        # the memory table: Psi = padded parameters (a multiple of dp*128), fp32 (k = 4), m and v (8 bytes)
        read -r n psi <<< "$(sed -n 's/^memory per rank (ZeRO-[0-9] over dp [0-9]*; \([0-9]*\) parameters padded to \([0-9]*\)).*/\1 \2/p' "$out.txt")"
        [ -n "$psi" ] || die "no memory table in $out.txt"
        [ $((psi % (dp * 128))) -eq 0 ] && [ "$psi" -ge "$n" ] && [ $((psi - n)) -lt $((dp * 128)) ] || die "bad padding $n -> $psi"
        bytes() { sed -n "s/^  $1 .* \([0-9][0-9]*\) B.*/\1/p" "$out.txt"; }
        shard=$((psi / dp)); bucket=2621
        want_g=$((4 * psi)); [ $zero -ge 2 ] && want_g=$((4 * shard))
        want_o=$((8 * psi)); [ $zero -ge 1 ] && want_o=$((8 * shard))
        want_c=$((4 * bucket)); [ $zero -ge 1 ] && want_c=$((8 * bucket))
        [ "$(bytes parameters)" -eq $((4 * psi)) ] || die "parameters: $(bytes parameters) != $((4 * psi))"
        [ "$(bytes gradients)" -eq $want_g ] || die "gradients: $(bytes gradients) != $want_g"
        [ "$(bytes optimizer)" -eq $want_o ] || die "optimizer: $(bytes optimizer) != $want_o"
        [ "$(bytes 'comm buffers')" -eq $want_c ] || die "comm buffers: $(bytes 'comm buffers') != $want_c"
        echo "  memory table: params $((4 * psi)) B, grads $want_g B, optimizer $want_o B, comm $want_c B per rank"
    done
done
# ZeRO-1 and ZeRO-2 run the same collectives: bitwise the same weights
cmp "$W/dp4_z1/model_00000010.bin" "$W/dp4_z2/model_00000010.bin" || die "zero=1 and zero=2 differ"
# determinism: the same layout gives bitwise the same run
dp_run 4 "$W/c.json" "${common[@]}" eval.batches=2 parallel.zero=1 "out_dir=$W/again" > /dev/null
diff <(losses "$W/dp4_z1/log.jsonl") <(losses "$W/again/log.jsonl") || die "two identical dp=4 runs differ"
cmp "$W/dp4_z1/model_00000010.bin" "$W/again/model_00000010.bin" || die "two identical dp=4 runs end differently"
# a bucket larger than the model (one bucket) gives the same run as many buckets
dp_run 2 "$W/c.json" eval.every=5 eval.batches=2 parallel.zero=1 parallel.bucket_mb=64 "out_dir=$W/onebucket" > /dev/null
close_losses "$W/base2/log.jsonl" "$W/onebucket/log.jsonl"
# mpirun -np 1 is a plain single process
dp_run 1 "$W/c.json" "${common[@]}" train.grad_accum=4 eval.batches=4 "out_dir=$W/np1" > /dev/null
diff <(losses "$W/base2/log.jsonl") <(losses "$W/np1/log.jsonl") || die "mpirun -np 1 differs from a plain run"
