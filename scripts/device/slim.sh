#!/usr/bin/env bash
# A device call carries the working tree (tracked and untracked-not-ignored files) plus its carry,
# 64 MiB in all. The tracked assets (the shipped heads, 32 MB) and the TUI snapshots leave no room
# for the GGUF's parts, so while the lease runs they leave the index (the files stay on disk) and
# .git/info/exclude ignores them; a call that needs the EAGLE-3 head carries its folder.
#   bash scripts/device/slim.sh on    # before the first device call (commit your work first)
#   bash scripts/device/slim.sh off   # after the last one: the index as it was
set -e
paths=(assets tests/tui/snapshots)
exclude=.git/info/exclude
case ${1:?usage: slim.sh on|off} in
  on)
    git diff --cached --quiet || { echo "slim.sh: the index has staged changes; commit them first" >&2; exit 1; }
    git rm -r -q --cached "${paths[@]}"
    for p in "${paths[@]}"; do echo "/$p/" >> "$exclude"; done
    git ls-files -z | xargs -0 du -cb | tail -1 | sed 's/total/bytes of tracked files travel with each call/' ;;
  off)
    for p in "${paths[@]}"; do sed -i "\#^/$p/\$#d" "$exclude"; done
    git reset -q -- "${paths[@]}"
    git status --short | head ;;
  *) echo "slim.sh: on or off" >&2; exit 2 ;;
esac
