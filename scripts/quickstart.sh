#!/usr/bin/env bash
# The default job, end to end on a fresh machine: set up, build, prepare the King James Bible
# as GPT-2 token shards, train a small GPT-2 (on CUDA when a GPU is present, else on the CPU;
# a few minutes), printing validation loss and text samples, writing checkpoints and the
# final model under out/kjv_small/, and last the training curves, out/kjv_small/curves.png.
# Re-running resumes from the latest checkpoint.
#   usage: scripts/quickstart.sh [key=value overrides for train_gpt...]
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== setup"
bash scripts/setup.sh
echo "== build"
make -j"$(nproc)" train_gpt dev/data/prepare_text
echo "== data"
bash scripts/get_corpus.sh
echo "== train"
./train_gpt configs/kjv_small.json "$@"
echo "== plot"
# the log and the out_dir as the run resolved them (overrides included)
{ read -r log; read -r out_dir; } < <(./train_gpt configs/kjv_small.json "$@" --print-config |
    /usr/bin/python3 -c 'import json, sys; c = json.load(sys.stdin); print(c["log"]["jsonl"] or c["out_dir"] + "/log.jsonl"); print(c["out_dir"])')
/usr/bin/python3 scripts/plot.py "$log" -o "$out_dir/curves.png"
