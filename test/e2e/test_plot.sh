# scripts/plot.py on the logs of two short runs: it prints the PNG's path and writes a valid PNG
# of 1200 x 800 pixels (signature and IHDR read with od); a missing log and a log without step
# records are refused with exit code 2 naming the file.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
"$PY" -c 'import matplotlib' 2>/dev/null || die "$PY has no matplotlib (scripts/setup.sh installs python3-matplotlib)"
make_data
tiny_config "$W/c.json"
"$BIN" "$W/c.json" eval.every=5 eval.batches=1 "out_dir=$W/a" > /dev/null
"$BIN" "$W/c.json" eval.every=5 eval.batches=1 train.lr=1e-3 "out_dir=$W/b" > /dev/null
out=$("$PY" "$ROOT/scripts/plot.py" "$W/a/log.jsonl" "$W/b/log.jsonl" -o "$W/curves.png")
[ "$out" = "$W/curves.png" ] || die "plot.py printed '$out', not the PNG's path"
png="$W/curves.png"
[ -s "$png" ] || die "no PNG written"
# signature 89 50 4e 47 0d 0a 1a 0a, then the IHDR chunk: length 13, "IHDR", width, height (big-endian)
[ "$(od -An -tx1 -N 16 "$png" | tr -d ' \n')" = "89504e470d0a1a0a0000000d49484452" ] || die "not a PNG: $(od -An -tx1 -N 16 "$png")"
be32() { od -An -tu1 -j "$1" -N 4 "$png" | awk '{ print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4 }'; }
[ "$(be32 16)" -eq 1200 ] && [ "$(be32 20)" -eq 800 ] || die "PNG is $(be32 16) x $(be32 20), expected 1200 x 800"
expect_fail 2 'missing\.jsonl' "$PY" "$ROOT/scripts/plot.py" "$W/missing.jsonl" -o "$W/x.png"
echo '{"step": 0, "val_loss": 6.2}' > "$W/val_only.jsonl"
expect_fail 2 'val_only\.jsonl.*no training step records' "$PY" "$ROOT/scripts/plot.py" "$W/val_only.jsonl" -o "$W/x.png"
[ ! -e "$W/x.png" ] || die "a refused plot wrote a file"
