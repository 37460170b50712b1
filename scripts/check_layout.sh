#!/usr/bin/env bash
# Checks the include graph of llmc/ against the layer table in llmc/README.md: a file may include
# its own folder and folders on a lower layer only. Also: every llmc source file lies in a folder of
# the table, and every include of "llmc/..." names a file that exists. Exit 1 listing each breach.
# Usage: scripts/check_layout.sh [ROOT] (default: this repository).
set -u
cd "${1:-$(dirname "$0")/..}"
declare -A layer
while IFS='|' read -r _ num folder _; do
    num=$(echo "$num" | tr -d ' '); folder=$(echo "$folder" | tr -d ' `/')
    [[ "$num" =~ ^[0-9]+$ ]] && [ -n "$folder" ] && layer[$folder]=$num
done < llmc/README.md
[ ${#layer[@]} -gt 0 ] || { echo "check-layout: no layer table in llmc/README.md"; exit 1; }
bad=0
while IFS= read -r f; do
    own=$(echo "$f" | cut -d/ -f2)
    if [ -z "${layer[$own]:-}" ]; then
        echo "check-layout: $f: folder llmc/$own/ is not in llmc/README.md's layer table"; bad=1; continue
    fi
    while IFS=: read -r line inc; do
        [ -e "$inc" ] || { echo "check-layout: $f:$line includes $inc, which does not exist"; bad=1; continue; }
        dep=$(echo "$inc" | cut -d/ -f2)
        [ "$dep" = "$own" ] && continue
        if [ -z "${layer[$dep]:-}" ] || [ "${layer[$dep]}" -ge "${layer[$own]}" ]; then
            echo "check-layout: $f:$line includes $inc: llmc/$dep/ (layer ${layer[$dep]:-?}) is not below llmc/$own/ (layer ${layer[$own]})"
            bad=1
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"llmc/' "$f" | sed 's/^\([0-9]*\):.*"\(llmc\/[^"]*\)".*/\1:\2/')
done < <(find llmc -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) | sort)
# no source file directly in llmc/
for f in llmc/*.h llmc/*.cpp llmc/*.cu llmc/*.cuh; do
    [ -e "$f" ] && { echo "check-layout: $f lies directly in llmc/: put it in a layer folder"; bad=1; }
done
[ $bad -eq 0 ] && echo "check-layout: ${#layer[@]} folders, every include points down"
exit $bad
