#!/usr/bin/env bash
# Checks the relative links of README.md, docs/*.md and llmc/README.md: each [text](target) that is
# not a web address must name a file or folder that exists (relative to the page), and a
# #fragment must match a heading of the target page (GitHub's anchors: lower case, punctuation
# dropped, spaces as hyphens). Exit 1 listing each broken link. Usage: scripts/check_links.sh [ROOT]
set -u
cd "${1:-$(dirname "$0")/..}"
slugs() {  # the anchors of a markdown file's headings
    grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//; s/[[:space:]]+$//' | tr '[:upper:]' '[:lower:]' |
        sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}
bad=0; n=0
for page in README.md docs/*.md llmc/README.md; do
    [ -f "$page" ] || continue
    dir=$(dirname "$page")
    # inline links, outside code spans: [text](target) with no spaces in the target
    while IFS= read -r target; do
        n=$((n + 1))
        case "$target" in http://*|https://*|mailto:*) continue ;; esac
        file=${target%%#*}; frag=""
        [[ "$target" == *"#"* ]] && frag=${target#*#}
        if [ -z "$file" ]; then path=$page; else path="$dir/$file"; fi
        if [ ! -e "$path" ]; then
            echo "check-links: $page: ($target): no such file $path"; bad=1; continue
        fi
        if [ -n "$frag" ] && ! slugs "$path" | grep -qxF -- "$frag"; then
            echo "check-links: $page: ($target): no heading #$frag in $path"; bad=1
        fi
    done < <(sed -E 's/`[^`]*`//g' "$page" | grep -oE '\]\([^) ]+\)' | sed -E 's/^\]\(//; s/\)$//')
done
[ $bad -eq 0 ] && echo "check-links: $n links, all resolve"
exit $bad
