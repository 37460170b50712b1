#!/usr/bin/env bash
# The README is a front door (at most 250 lines) and every relative link of README.md, docs/ and
# llmc/README.md resolves (scripts/check_links.sh: files and #headings); the checker fails on a
# copy with a broken file link and a broken anchor planted.
set -euo pipefail
cd "$(dirname "$0")/../.."
lines=$(wc -l < README.md)
[ "$lines" -le 250 ] || { echo "FAIL: README.md has $lines lines (at most 250: reference text belongs in docs/)"; exit 1; }
bash scripts/check_links.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/llmc"
cp README.md "$tmp/"; cp docs/*.md "$tmp/docs/"; cp llmc/README.md "$tmp/llmc/"
echo 'See [nowhere](docs/missing.md) and [no such heading](docs/precision.md#no-such-heading).' >> "$tmp/README.md"
if out=$(bash scripts/check_links.sh "$tmp" 2>&1); then echo "FAIL: broken links passed"; exit 1; fi
echo "$out" | grep -q 'no such file .*docs/missing.md' || { echo "FAIL: missing file not named: $out"; exit 1; }
echo "$out" | grep -q 'no heading #no-such-heading' || { echo "FAIL: missing heading not named: $out"; exit 1; }
echo "PASS docs: README $lines lines, links resolve"
