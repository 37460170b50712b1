#!/usr/bin/env bash
# Obtains the default corpus: the King James Bible from Debian's bible-kjv package, cleaned of
# chapter headings and verse numbers, one text file per book (chapters separated by a blank line,
# one verse per line), split by book into train and val, then tokenized into llm.c shards:
#     data/kjv/train/NN_Book.txt, data/kjv/val/NN_Book.txt      the text
#     data/kjv/kjv_train_000000.bin, data/kjv/kjv_val_000000.bin  GPT-2 tokens (one document per book)
# val = every 10th book (2 Samuel, Proverbs, Amos, Matthew, Philippians, 1 Peter): about 10%.
# Idempotent: steps whose output exists are skipped; --force redoes them.
#
# usage: scripts/get_corpus.sh [--force] [FOLDER]     (FOLDER defaults to data/kjv)
set -euo pipefail

FORCE=0
if [[ "${1:-}" == "--force" ]]; then FORCE=1; shift; fi
DIR="${1:-data/kjv}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREPARE="$ROOT/dev/data/prepare_text"
TOKDIR="$ROOT/data/tokenizer"

say() { echo "get_corpus: $*" >&2; }

# 1. the raw text from the bible program
if ! command -v bible >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        say "installing Debian package bible-kjv..."
        apt-get install -y -q bible-kjv >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bible-kjv >/dev/null; }
    else
        say "error: the 'bible' program is missing: install Debian's bible-kjv package (apt-get install bible-kjv)"
        exit 1
    fi
fi
mkdir -p "$DIR"
RAW="$DIR/raw_bible_kjv.txt"
if [[ $FORCE == 1 || ! -s "$RAW" ]]; then
    say "reading the King James Bible (bible -l100000 gen1:1-rev22:21)..."
    bible -l100000 gen1:1-rev22:21 >"$RAW.tmp"
    mv "$RAW.tmp" "$RAW"
fi

# 2. cleaned text, one file per book. `bible` prints "Book N" headings, blank lines and verses
# as "  N text" (one line each with -l100000).
if [[ $FORCE == 1 || ! -f "$DIR/.text_done" ]]; then
    say "cleaning verse numbers and headings, writing one file per book to $DIR/train and $DIR/val..."
    rm -rf "$DIR/train" "$DIR/val" "$DIR/.text_done"
    mkdir -p "$DIR/train" "$DIR/val"
    awk -v dir="$DIR" '
        function flush_chapter() { if (chapter != "") { text = text (text == "" ? "" : "\n") chapter; chapter = "" } }
        function flush_book() {
            flush_chapter()
            if (book == "") return
            split_ = (nbooks % 10 == 0) ? "val" : "train"
            name = book; gsub(/ /, "_", name)
            file = sprintf("%s/%s/%02d_%s.txt", dir, split_, nbooks, name)
            printf "%s", text > file
            close(file)
            verses_by[split_] += bv; books_by[split_]++
            text = ""; bv = 0
        }
        /^[^ ].* [0-9]+$/ {                        # chapter heading "Book N"
            b = $0; sub(/ [0-9]+$/, "", b)
            if (b != book) { flush_book(); book = b; nbooks++ }
            else flush_chapter()
            next
        }
        /^ +[0-9]+ / { line = $0; sub(/^ +[0-9]+ /, "", line); chapter = chapter line "\n"; nverses++; bv++; next }
        /^$/ { next }
        { printf "get_corpus: error: unexpected line %d in the bible output: %s\n", NR, $0 > "/dev/stderr"; bad = 1; exit 1 }
        END {
            if (bad) exit 1
            flush_book()
            if (nbooks != 66 || nverses != 31102) {
                printf "get_corpus: error: expected 66 books and 31102 verses, got %d and %d\n", nbooks, nverses > "/dev/stderr"
                exit 1
            }
            printf "get_corpus: %d books, %d verses: train %d books (%d verses), val %d books (%d verses)\n",
                nbooks, nverses, books_by["train"], verses_by["train"], books_by["val"], verses_by["val"] > "/dev/stderr"
        }' "$RAW"
    touch "$DIR/.text_done"
fi

# 3. shards
if [[ $FORCE == 1 || ! -f "$DIR/kjv_train_000000.bin" || ! -f "$DIR/kjv_val_000000.bin" \
      || "$DIR/.text_done" -nt "$DIR/kjv_train_000000.bin" ]]; then
    "$ROOT/scripts/get_tokenizer.sh" "$TOKDIR"
    if [[ ! -x "$PREPARE" ]]; then
        say "building dev/data/prepare_text..."
        make -C "$ROOT" dev/data/prepare_text >/dev/null
    fi
    args=()
    for f in "$DIR"/val/*.txt; do args+=(--val "$f"); done
    say "tokenizing into $DIR/kjv_{train,val}_*.bin..."
    "$PREPARE" --tokenizer "$TOKDIR" --out "$DIR/kjv" "${args[@]}" "$DIR"/train/*.txt
else
    say "$DIR/kjv_train_000000.bin and $DIR/kjv_val_000000.bin present, nothing to do"
fi
