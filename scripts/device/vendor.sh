#!/usr/bin/env bash
# What check.sh's three calls carry, made here once (all of it under the git-ignored .device/ and
# .whl/): the embedded GGUF in six parts of ~16.4 MB (two stash calls carry three each; env.sh
# assembles and checks the file on the machine) and the pure-Python packages the box lacks, copied
# from this venv's site-packages into .whl/site (textual and its needs, platformdirs, gguf's reader).
#   bash scripts/device/vendor.sh [PY]     # prints the carry lists and their sizes
set -e
PY=${1:-${PY:-.venv/bin/python}}
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
gguf=$("$PY" -c 'from engine.models.resolve import embedded_gguf; print(embedded_gguf()[0])')
rm -rf .device/gguf-* .whl/site && mkdir -p .device .whl/site
"$PY" scripts/device/gguf_parts.py split "$gguf" --parts 6 --into .device > /dev/null
for pkg in textual textual_plotext plotext platformdirs mdit_py_plugins linkify_it uc_micro gguf; do
  for p in "$site/$pkg" "$site"/"$pkg"-*.dist-info "$site"/"${pkg//_/-}"-*.dist-info "$site/$pkg.py"; do
    [ -e "$p" ] && cp -r "$p" .whl/site/
  done
done
find .whl/site -name __pycache__ -prune -exec rm -rf {} +
size() { du -cb "$@" | tail -1 | cut -f1; }
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "tree (tracked files): $tree bytes"
echo "call 1 (stash): .device/gguf-1 .device/gguf-2 .device/gguf-3  $(( tree + $(size .device/gguf-{1,2,3}) )) bytes"
echo "call 2 (stash): .device/gguf-4 .device/gguf-5 .device/gguf-6  $(( tree + $(size .device/gguf-{4,5,6}) )) bytes"
echo "call 3 (check): assets/eagle3-smollm2-135m assets/medusa-smollm2-135m assets/dflash-smollm2-135m .whl/site  $(( tree + \
$(size assets/eagle3-smollm2-135m assets/medusa-smollm2-135m assets/dflash-smollm2-135m .whl/site) )) bytes (limit 67108864)"
