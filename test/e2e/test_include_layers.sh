#!/usr/bin/env bash
# llmc/'s include graph points down its layer table (llmc/README.md): scripts/check_layout.sh passes
# on the repository and fails on a copy with one include planted upward and one folder not in the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/check_layout.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r llmc "$tmp/llmc"
echo '#include "llmc/model/model.h"' >> "$tmp/llmc/core/rng.h"
if out=$(bash scripts/check_layout.sh "$tmp" 2>&1); then echo "FAIL: an upward include passed"; exit 1; fi
echo "$out" | grep -q 'llmc/core/rng.h:.* includes llmc/model/model.h' || { echo "FAIL: not named: $out"; exit 1; }
cp llmc/core/rng.h "$tmp/llmc/core/rng.h"
mkdir "$tmp/llmc/extra" && echo '#pragma once' > "$tmp/llmc/extra/x.h"
if out=$(bash scripts/check_layout.sh "$tmp" 2>&1); then echo "FAIL: a folder outside the table passed"; exit 1; fi
echo "$out" | grep -q 'llmc/extra/ is not in' || { echo "FAIL: not named: $out"; exit 1; }
echo "PASS include layers"
