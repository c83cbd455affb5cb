#!/usr/bin/env bash
# Device plan, command 3 (carry .device/gguf-3; gguf-1 and -2 came with commands 1 and 2 and wait
# in $SPECCHAT_STASH): the embedded model from its GGUF. Rewrite and MT-bench rows for
# none/ngram/eagle3 in bf16 and fp32 (identical counts against the same-precision baseline), and
# the verify cost curve. ~6 minutes on an H100.
# Dry run here: DEVICE=cpu LIMIT=2 TOKENS=16 bash scripts/device/plan3.sh
source scripts/device/env.sh || exit 1
[ -n "${SPECCHAT_EMBEDDED_GGUF:-}" ] || { echo "the embedded GGUF is not assembled: run commands 1 and 2 first (each carries a part)"; exit 1; }
LIMIT=${LIMIT:-24}
TOKENS=${TOKENS:-128}
DTYPES=${DTYPES:-bfloat16 float32}
SETS=${SETS:-rewrite mt_bench}
CURVE=${CURVE:-1}
log=$OUT/plan3.log
{
  for dtype in $DTYPES; do
    for set in $SETS; do
      echo "== embedded $set $dtype"
      timeout 200 "$PY" -m specchat bench --prompts "scripts/device/prompts/$set.jsonl" --limit "$LIMIT" \
        --methods none,ngram,eagle3 --device "$DEVICE" --dtype "$dtype" --weights fp32 \
        --max-new-tokens "$TOKENS" --json "$OUT/embedded-$set-$dtype.json"
      echo "bench exit: $?"
    done
  done
  [ "$CURVE" = 1 ] && echo "== embedded cost curve bf16" && timeout 100 "$PY" -m specchat bench --cost-curve --device "$DEVICE" --dtype bfloat16 --weights fp32 \
    --json "$OUT/embedded-cost-curve-bf16.json"
} 2>&1 | tee "$log"
