#!/usr/bin/env bash
# Issue 51's device check, inference first: one call (at most 570 s of section timeouts, ~6 minutes expected on an H200; timeout_s 600) after two
# stash calls that bring the embedded GGUF (98 MB, over one call's 64 MiB) in six parts:
#   bash scripts/device/check.sh stash   carry .device/gguf-1 .device/gguf-2 .device/gguf-3  (~5 s)
#   bash scripts/device/check.sh stash   carry .device/gguf-4 .device/gguf-5 .device/gguf-6  (~5 s)
#   bash scripts/device/check.sh         carry assets/eagle3-smollm2-135m assets/medusa-smollm2-135m
#                                        assets/dflash-smollm2-135m .whl/site  (~58 MB with the tree)
# (scripts/device/vendor.sh makes the carries; slim.sh on keeps the tree at ~2.3 MB). Sections, each
# under its own timeout, each recorded (exit code, seconds) even when it fails or is skipped:
#   pytest    tests/gpu compiled on the device (real CUDA, not the interpreter)
#   random    the Llama-3.1-8B-shaped random model in bf16: decode tok/s, fraction of the HBM limit and
#             the verify cost curve to 64, with SPECCHAT_CUDA_LINEAR=invariant and =cublas
#   embedded  the embedded model from its GGUF in bf16: none, ngram, eagle3, medusa, dflash on MT-bench (first
#             24) and the rewrite set; standalone (the model drafting for itself: the path, not a speed-up)
#   pilot     the chat app headless (textual's Pilot) on the device: load, one answer
# A machine found fresh (the GGUF parts gone with the last one) skips embedded and pilot with the
# reason in the JSON instead of failing. Everything lands in $OUT: check.json, check.log and
# check-files.tgz (every section's own JSON and log).
# Dry run here (CI, tests/test_device_plan.py, ~20 s: a tiny random shape, the model's sections skipped):
#   DEVICE=cpu DRY=1 EMBEDDED=0 SHAPE=path/to/config.json bash scripts/device/check.sh
# DRY=1 alone also runs the embedded model on one prompt, 4 tokens (minutes on a CPU).
source scripts/device/env.sh > /dev/null || exit 1
[ "${1:-}" = stash ] && { ls -la "$SPECCHAT_STASH"; exit 0; }
[ -d .whl/site ] && export PYTHONPATH="$PYTHONPATH:$REPO/.whl/site"
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then
  SHAPE=${SHAPE:-smollm2-135m} LIMIT=${LIMIT:-1} TOKENS=${TOKENS:-4}
  PYTEST_ARGS=${PYTEST_ARGS:-"tests/gpu/test_gpu_static.py -k bucket"}
else
  SHAPE=${SHAPE:-llama-3.1-8b} LIMIT=${LIMIT:-24} TOKENS=${TOKENS:-128}
  PYTEST_ARGS=${PYTEST_ARGS:-tests/gpu}
fi
SETS=${SETS:-mt_bench rewrite}
METHODS=${METHODS:-none,ngram,eagle3,medusa,dflash}
files=$OUT/check-files
mkdir -p "$files"
: > "$files/sections.tsv"
log=$OUT/check.log

# section NAME SECONDS COMMAND...: run it under a timeout, its output to the log, (name, rc, s) noted
section() {
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name: $*"
  start=$(date +%s%N)
  timeout "$limit" "$@"
  rc=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s\t%s\t%d.%03d\n' "$name" "$rc" $(( ms / 1000 )) $(( ms % 1000 )) >> "$files/sections.tsv"
  echo "== $name exit $rc"
}
skip() { printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$files/sections.tsv"; echo "== $1 skipped: $2"; }

{
  section pytest "${PYTEST_S:-140}" "$PY" -m pytest $PYTEST_ARGS -q -p no:cacheprovider -W ignore::pytest.PytestConfigWarning
  for linear in invariant cublas; do
    SPECCHAT_CUDA_LINEAR=$linear section "random-$linear" "${RANDOM_S:-65}" "$PY" -m specchat bench --random-weights "$SHAPE" \
      --device "$DEVICE" --dtype bfloat16 --context 512 --max-new-tokens "$TOKENS" --json "$files/random-$linear.json"
  done
  if [ "${EMBEDDED:-1}" = 0 ]; then
    for set in $SETS standalone; do skip "embedded-$set" "EMBEDDED=0"; done
    skip pilot "EMBEDDED=0"
  elif [ -z "${SPECCHAT_EMBEDDED_GGUF:-}" ] && [ "$DRY" != 1 ]; then
    for set in $SETS; do skip "embedded-$set" "no embedded GGUF: run the two stash calls first"; done
    skip pilot "no embedded GGUF"
  else
    for set in $SETS; do
      section "embedded-$set" "${EMBEDDED_S:-100}" "$PY" -m specchat bench --prompts "scripts/device/prompts/$set.jsonl" \
        --limit "$LIMIT" --methods "$METHODS" --device "$DEVICE" --dtype bfloat16 --max-new-tokens "$TOKENS" \
        --json "$files/embedded-$set.json"
    done
    section embedded-standalone 40 "$PY" -m specchat bench --prompts scripts/device/prompts/mt_bench.jsonl \
      --limit "$(( LIMIT < 4 ? LIMIT : 4 ))" --methods standalone --draft "${SPECCHAT_EMBEDDED_GGUF:-smollm2-135m}" \
      --device "$DEVICE" --dtype bfloat16 --max-new-tokens "$TOKENS" --json "$files/embedded-standalone.json"
    if [ "$DRY" = 1 ] && [ "${PILOT:-0}" != 1 ]; then
      skip pilot "dry run (PILOT=1 runs it)"
    else
      section pilot 60 "$PY" scripts/device/pilot_chat.py --device "$DEVICE" --json "$files/pilot.json"
    fi
  fi
  cp "$OUT/machine.txt" "$files/" 2>/dev/null
  "$PY" scripts/device/check_summary.py "$files" "$OUT/check.json"
} 2>&1 | tee "$log"
tar -czf "$OUT/check-files.tgz" -C "$OUT" check-files && rm -rf "$files" "$OUT/machine.txt"
ls -la "$OUT"
