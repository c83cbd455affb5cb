#!/usr/bin/env bash
# After the plan: self-distilled data and an EAGLE-3 head for the embedded model on the GPU
# (the GGUF assembled by commands 1-3). Generates TOKENS answer tokens with transformers batches,
# trains from the shipped head with the target's features computed on the GPU, and leaves the
# exported head (split under 16 MiB a file) and the data's id shards under $OUT.
# IMPORT="dir1 dir2": train on carried id folders instead of generating (lease15.sh c).
# REFIT=1: re-pick the head's draft vocabulary from the data (train-draft --refit-vocab).
# Dry run here: DEVICE=cpu TOKENS=2000 STEPS=4 bash scripts/device/train.sh
source scripts/device/env.sh || exit 1
[ -n "${SPECCHAT_EMBEDDED_GGUF:-}" ] || { echo "the embedded GGUF is not assembled: run the plan's commands first"; exit 1; }
TOKENS=${TOKENS:-2000000}
HOURS=${HOURS:-0.11}
EPOCHS=${EPOCHS:-6}
BATCH=${BATCH:-16384}
LR=${LR:-1e-3}
HEAD=$SPECCHAT_STASH/head
extra=()
[ -n "${STEPS:-}" ] && extra+=(--max-steps "$STEPS")
[ "${REFIT:-0}" = 1 ] && extra+=(--refit-vocab)
{
  imports=()
  if [ -n "${IMPORT:-}" ]; then
    # id folders carried in (the CPU's and an earlier GPU's data): no generation here; the target's
    # features for them are computed on this machine as training reads them
    for d in $IMPORT; do imports+=(--import-data "$d"); done
    echo "== data: imported from $IMPORT"
  else
    echo "== data: $TOKENS answer tokens"
    # at most DATA_S seconds of generation (shards are written whole, so a stop loses nothing); the
    # training step below then takes what is there (--tokens 1: it generates nothing more)
    timeout "${DATA_S:-240}" "$PY" -m specchat train-draft --data-only --device "$DEVICE" --tokens "$TOKENS" \
      --gen-batch "${GEN_BATCH:-384}"
    echo "data exit: $? (124: stopped at ${DATA_S:-240} s)"
    data=$(ls -d "$SPECCHAT_CACHE_DIR"/train-data/*/ | head -1)
    tar -C "$data" -czf "$OUT/train-data-ids.tgz" --exclude='*.npy' .
  fi
  echo "== training"
  rm -rf "$HEAD"
  "$PY" -m specchat train-draft --device "$DEVICE" --tokens 1 --gen-batch "${GEN_BATCH:-384}" \
    --out "$HEAD" --init-from "${INIT:-assets/eagle3-smollm2-135m}" --bf16 on --batch-tokens "$BATCH" --lr "$LR" \
    --epochs "$EPOCHS" --hours "$HOURS" --eval-every "${EVAL_EVERY:-100}" --checkpoint-every 100 "${imports[@]}" \
    "${extra[@]}"
  echo "train exit: $?"
  cp "$HEAD/config.json" "$HEAD/tau.json" "$OUT/" 2>/dev/null
  split -b 12m "$HEAD/model.safetensors" "$OUT/head.safetensors.part-"
  sha256sum "$HEAD/model.safetensors" > "$OUT/head.sha256"
} 2>&1 | tee "$OUT/train.log"
