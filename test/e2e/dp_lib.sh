# Helpers for the data-parallel end-to-end tests (sourced after lib.sh).
export OMP_NUM_THREADS=1  # every rank and every baseline: one thread, so timings and sums do not depend on load

# dp_run N ARGS...: the trainer on N processes under mpirun (oversubscribed: more ranks than cores is fine)
dp_run() {
    local n=$1; shift
    local env=(-x OMP_NUM_THREADS)
    [ -n "${LLMC_DUMP_GRADS:-}" ] && env+=(-x LLMC_DUMP_GRADS)
    [ -n "${LLMC_COMM_DELAY_MS:-}" ] && env+=(-x LLMC_COMM_DELAY_MS)
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
