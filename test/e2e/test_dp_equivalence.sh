# Data parallelism proves itself against one process: for dp in {2, 4} and ZeRO stages 0, 1, 2, 3,
# 10 steps on dp ranks (grad_accum 2 each) give the losses, validation losses and final weights
# of one process with grad_accum 2*dp (the same global batch), to 1e-5 relative. A repeated run
# is bitwise identical. The memory table follows ZeRO's formulas, computed here from the model's
# shape (not read back from the trainer's own arithmetic).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/dp_lib.sh"
make_data
tiny_config "$W/c.json"
# small buckets (2621 elements) so that every step moves many of them, crossing shard edges
common=(parallel.bucket_mb=0.01 eval.every=5)
for dp in 2 4; do
    "$BIN" "$W/c.json" "${common[@]}" train.grad_accum=$((2 * dp)) eval.batches=$((2 * dp)) "out_dir=$W/base$dp" > /dev/null
    for zero in 0 1 2 3; do
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

        # the memory table: Psi = padded parameters (a multiple of dp*128), fp32 (k = 4), m and v (8 bytes);
        # the units of the tiny model (C = 32, padded vocab 512, 32 positions, 2 layers): embedding
        # E = 512C + 32C, layer L = 12C^2 + 13C, head H = 2C + the padding (it ends the buffer)
        read -r n psi <<< "$(sed -n 's/^memory per rank (ZeRO-[0-9] over dp [0-9]*; \([0-9]*\) parameters padded to \([0-9]*\)).*/\1 \2/p' "$out.txt")"
        [ -n "$psi" ] || die "no memory table in $out.txt"
        [ $((psi % (dp * 128))) -eq 0 ] && [ "$psi" -ge "$n" ] && [ $((psi - n)) -lt $((dp * 128)) ] || die "bad padding $n -> $psi"
        bytes() { sed -n "s/^  $1 .* \([0-9][0-9]*\) B.*/\1/p" "$out.txt"; }
        shard=$((psi / dp)); bucket=2621; C=32
        E=$((512 * C + 32 * C)); L=$((12 * C * C + 13 * C)); H=$((2 * C + psi - n))
        [ $((E + 2 * L + 2 * C)) -eq "$n" ] || die "unexpected parameter count $n"
        want_p=$((4 * psi)); [ $zero -ge 3 ] && want_p=$((4 * shard))
        want_g=$((4 * psi)); [ $zero -ge 2 ] && want_g=$((4 * shard))
        want_o=$((8 * psi)); [ $zero -ge 1 ] && want_o=$((8 * shard))
        want_c=$((4 * bucket)); [ $zero -ge 1 ] && want_c=$((8 * bucket))
        [ "$(bytes parameters)" -eq $want_p ] || die "parameters: $(bytes parameters) != $want_p"
        [ "$(bytes gradients)" -eq $want_g ] || die "gradients: $(bytes gradients) != $want_g"
        [ "$(bytes optimizer)" -eq $want_o ] || die "optimizer: $(bytes optimizer) != $want_o"
        [ "$(bytes 'comm buffers')" -eq $want_c ] || die "comm buffers: $(bytes 'comm buffers') != $want_c"
        want_up=none; [ $zero -ge 3 ] && want_up=$((4 * (E + H + 2 * L)))
        want_ug=none; [ $zero -ge 2 ] && want_ug=$((4 * (E + H + L)))
        [ "$(bytes 'unit params')" = "${want_up/none/}" ] || die "unit params: '$(bytes 'unit params')' != '$want_up'"
        [ "$(bytes 'unit grads')" = "${want_ug/none/}" ] || die "unit grads: '$(bytes 'unit grads')' != '$want_ug'"
        echo "  memory table: params $want_p B, grads $want_g B, optimizer $want_o B, comm $want_c B," \
             "unit params $want_up, unit grads $want_ug per rank"
    done
done
# ZeRO-2 and ZeRO-3 reduce the same unit gradients in the same order (ZeRO-3 gathers per use
# what ZeRO-2 all-gathers after the update): bitwise the same run
for dp in 2 4; do
    diff <(losses "$W/dp${dp}_z2/log.jsonl") <(losses "$W/dp${dp}_z3/log.jsonl") || die "dp=$dp: zero=2 and zero=3 losses differ"
    cmp "$W/dp${dp}_z2/model_00000010.bin" "$W/dp${dp}_z3/model_00000010.bin" || die "dp=$dp: zero=2 and zero=3 differ"
done
# determinism: the same layout gives bitwise the same run
for zero in 1 3; do
    dp_run 4 "$W/c.json" "${common[@]}" eval.batches=2 parallel.zero=$zero "out_dir=$W/again$zero" > /dev/null
    diff <(losses "$W/dp4_z$zero/log.jsonl") <(losses "$W/again$zero/log.jsonl") || die "two identical dp=4 zero=$zero runs differ"
    cmp "$W/dp4_z$zero/model_00000010.bin" "$W/again$zero/model_00000010.bin" || die "two dp=4 zero=$zero runs end differently"
done
# a bucket larger than the model (one bucket; under ZeRO-3 one piece per unit) gives the same run as many buckets
for zero in 1 3; do
    dp_run 2 "$W/c.json" eval.every=5 eval.batches=2 parallel.zero=$zero parallel.bucket_mb=64 "out_dir=$W/onebucket$zero" > /dev/null
    close_losses "$W/base2/log.jsonl" "$W/onebucket$zero/log.jsonl"
done
# text samples under ZeRO-3 (every DP rank takes part in the gathers; rank 0 prints): the
# same tokens as ZeRO-2, whose weights are bitwise the same
for zero in 2 3; do
    dp_run 2 "$W/c.json" "${common[@]}" eval.batches=2 parallel.zero=$zero eval.sample_every=5 eval.sample_tokens=12 \
        "out_dir=$W/sample$zero" > "$W/sample$zero.txt" || die "sampling at zero=$zero failed"
done
[ "$(grep -c 'sample (token ids' "$W/sample3.txt")" -eq 2 ] || die "expected 2 samples: $(cat "$W/sample3.txt")"
diff <(grep 'sample (token ids' "$W/sample2.txt") <(grep 'sample (token ids' "$W/sample3.txt") || die "zero=3 samples differ"
# mpirun -np 1 is a plain single process
dp_run 1 "$W/c.json" "${common[@]}" train.grad_accum=4 eval.batches=4 "out_dir=$W/np1" > /dev/null
diff <(losses "$W/base2/log.jsonl") <(losses "$W/np1/log.jsonl") || die "mpirun -np 1 differs from a plain run"
