#!/usr/bin/env bash
# Tokenizer throughput of dev/data/prepare_text on the CPU: the King James Bible (scripts/get_corpus.sh)
# as JSONL, one record per chapter (1189 records, 4.1 MB of text), tokenized into shards with
# --jobs 1 and --jobs N (default: nproc), each 3 times; the median MB/s of text (prepare_text's
# own "done" line: both passes, JSON parsing and shard writing included) is appended to
# dev/bench/RESULTS.md with the date, the commit and the machine.
#   usage: dev/bench/tokenizer_bench.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-$(nproc)}
[ -x dev/data/prepare_text ] || make -j"$(nproc)" CUDA=0 dev/data/prepare_text
[ -d data/kjv/train ] || bash scripts/get_corpus.sh
W=$(mktemp -d /tmp/tokenizer_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
/usr/bin/python3 - "$W/kjv.jsonl" data/kjv/train/*.txt data/kjv/val/*.txt <<'PY'
import json, sys
with open(sys.argv[1], "w") as out:
    for path in sorted(sys.argv[2:]):
        for chapter in open(path, encoding="utf-8").read().split("\n\n"):
            if chapter.strip():
                out.write(json.dumps({"text": chapter}) + "\n")
PY
mbps() {  # median MB/s of 3 runs with --jobs $1
    for r in 1 2 3; do
        dev/data/prepare_text --quiet --jobs "$1" --val-frac 0 --out "$W/out" "$W/kjv.jsonl" 2>&1 |
            sed -n 's/.*; \([0-9.]*\) MB\/s on .*/\1/p'
    done | sort -n | sed -n 2p
}
load=$(cut -d' ' -f1-3 /proc/loadavg)
one=$(mbps 1)
many=$(mbps "$N")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
{
    echo
    echo "## Tokenizer throughput (CPU) - $(date -u +%Y-%m-%d) - commit $(git rev-parse --short HEAD) - $cpu, $(nproc) cores"
    echo
    echo "\`dev/bench/tokenizer_bench.sh $N\`: dev/data/prepare_text on the King James Bible as JSONL (1189 records,"
    echo "$(wc -c < "$W/kjv.jsonl") bytes), median of 3 runs, MB of text per second. Load average before the runs:"
    echo "$load (other jobs share these cores: the numbers are a lower bound)."
    echo
    echo "| --jobs | MB/s | speed-up |"
    echo "|---|---|---|"
    echo "| 1 | $one | 1.00 |"
    echo "| $N | $many | $(awk -v a="$one" -v b="$many" 'BEGIN { printf "%.2f", b / a }') |"
} | tee -a dev/bench/RESULTS.md
