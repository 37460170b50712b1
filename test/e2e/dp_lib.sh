# Helpers for the data-parallel end-to-end tests (sourced after lib.sh).
export OMP_NUM_THREADS=1  # every rank and every baseline: one thread, so timings and sums do not depend on load

# dp_run N ARGS...: the trainer on N processes under mpirun (oversubscribed: more ranks than cores is fine)
dp_run() {
    local n=$1; shift
    local env=(-x OMP_NUM_THREADS)
    [ -n "${LLMC_DUMP_GRADS:-}" ] && env+=(-x LLMC_DUMP_GRADS)
    [ -n "${LLMC_COMM_DELAY_MS:-}" ] && env+=(-x LLMC_COMM_DELAY_MS)
    [ -n "${LLMC_SIM_DEVICE:-}" ] && env+=(-x LLMC_SIM_DEVICE)
    timeout 120 mpirun --oversubscribe -np "$n" "${env[@]}" "$BIN" "$@"
}

# close_losses A B [TOL]: the "loss" records of two log.jsonl files agree to TOL relative (default 1e-5)
close_losses() {
    local tol=${3:-1e-5}
    [ "$(losses "$1" | wc -l)" -eq "$(losses "$2" | wc -l)" ] || die "different numbers of loss records: $1 $2"
    paste <(losses "$1") <(losses "$2") | awk -v tol="$tol" '
        { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / a; if (r > m) m = r; if (r > tol) bad++ }
        END { printf "  losses: %d records, max relative difference %.3g\n", NR, m; exit bad > 0 }' ||
        die "losses of $2 differ from $1 by more than $tol"
}

# close_weights A B [TOL] [MAXTOL]: two llm.c model files (1024-byte header, fp32) hold the same
# weights: ||a - b|| <= TOL * ||a|| and max |a - b| <= MAXTOL * max |a| (MAXTOL defaults to TOL). (Element-wise relative error is not
# the measure: AdamW divides by sqrt(v), so weights whose gradients are near zero move by lr
# times a ratio of two tiny numbers, and float summation order shows up there first.)
close_weights() {
    local tol=${3:-1e-5} maxtol=${4:-${3:-1e-5}}
    cmp -s -n 1024 "$1" "$2" || die "model headers differ: $1 $2"
    paste <(od -An -v -f -w4 -j1024 "$1") <(od -An -v -f -w4 -j1024 "$2") | awk -v tol="$tol" -v maxtol="$maxtol" '
        { a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d; if (a < 0) a = -a;
          if (d > md) md = d; if (a > ma) ma = a; sd += d * d; sa += a * a; n++ }
        END { printf "  weights: %d values, max diff %.3g of max |w| %.3g (%.3g), norm ratio %.3g\n", n, md, ma, md / ma, sqrt(sd / sa);
              exit !(n > 0 && md <= maxtol * ma && sqrt(sd) <= tol * sqrt(sa)) }' ||
        die "weights of $2 differ from $1 by more than $tol"
}

# close_val A B: the "val_loss" records of two log.jsonl files agree to 1e-5 relative
close_val() {
    paste <(grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2) <(grep -o '"val_loss":[^,}]*' "$2" | cut -d: -f2) |
        awk 'NF != 2 { bad++ } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++ } END { exit bad > 0 || NR == 0 }' ||
        die "validation losses of $2 differ from $1"
}
# close_run BASE OUT MODEL: a layout's run (OUT.grads.bin from LLMC_DUMP_GRADS, OUT/log.jsonl,
# OUT/MODEL) equals the one-process run BASE: step-1 gradients and final weights to 1e-5 in norm and
# 1e-4 of the largest element, losses and validation losses to 1e-5 relative
close_run() {
    close_weights "$1.grads.bin" "$2.grads.bin" 1e-5 1e-4
    close_losses "$1/log.jsonl" "$2/log.jsonl"
    close_val "$1/log.jsonl" "$2/log.jsonl"
    close_weights "$1/$3" "$2/$3" 1e-5 1e-4
}
# samples FILE: the sampled token ids a run printed, one sample a line
samples() { grep 'sample (token ids' "$1" | sed 's/^.*decode): //'; }

# The MoE layers' records (test_moe_layouts.sh, test_ep_layouts.sh).
# moe_stats FILE: each step's moe_aux moe_load_min moe_load_max moe_dropped
moe_stats() { grep '"moe_aux"' "$1" | sed 's/.*"moe_aux":\([^,]*\).*"moe_dropped":\([^,]*\).*"moe_load_max":\([^,]*\).*"moe_load_min":\([^,}]*\).*/\1 \4 \3 \2/'; }
close_moe() {  # close_moe A B [STEPS]: the statistics of STEPS (default 6) steps agree to 1e-5
    [ "$(moe_stats "$1" | wc -l)" -eq "${3:-6}" ] || die "$1: no MoE statistics in ${3:-6} steps"
    paste <(moe_stats "$1") <(moe_stats "$2") | awk '
        NF != 8 { bad++ }
        { for (i = 1; i <= 4; i++) { d = $i - $(i + 4); if (d < 0) d = -d; if (d > 1e-5 * ($i < 0 ? -$i : $i) + 1e-12) bad++ } }
        END { exit bad > 0 || NR == 0 }' || die "MoE statistics of $2 differ from $1"
}

# converges_like_plain CONFIG PCT NAME ARGS...: 300 steps of dp2 as CONFIG gives it and with ARGS, at
# equal tokens; dies unless plain's final val loss is below 1.2 and ARGS' within PCT% above it
converges_like_plain() {
    local cfg=$1 pct=$2 name=$3 a b
    shift 3
    local conv=(train.steps=300 eval.every=300 eval.batches=32 train.warmup_steps=10 train.lr=1e-2
                train.micro_batch=4 train.seq_len=32 train.grad_accum=1)
    dp_run 2 "$cfg" "${conv[@]}" "out_dir=$W/conv_plain" > /dev/null || die "plain 300 steps failed"
    dp_run 2 "$cfg" "${conv[@]}" "$@" "out_dir=$W/conv_other" > /dev/null || die "$name 300 steps failed"
    a=$(val_last "$W/conv_plain/log.jsonl"); b=$(val_last "$W/conv_other/log.jsonl")
    echo "300 steps: validation loss plain dp2 $a, $name $b"
    awk -v a="$a" -v b="$b" -v p="$pct" 'BEGIN { exit !(a < 1.2 && b <= (1 + p / 100) * a) }' ||
        die "$name ($b) is not within $pct% of plain dp2 ($a)"
}
