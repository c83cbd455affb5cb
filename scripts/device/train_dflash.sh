#!/usr/bin/env bash
# lease15.sh d: a DFlash drafter for the embedded model trained on the lent GPU on every self-distilled
# answer id carried in (IMPORT, default the three assets/train-data folders: 7.1M answer tokens), the
# target's features computed there, one padded transformers forward over each step's conversations
# (LiveTarget.sequences), and exported into $OUT: drafter.safetensors.part-* (15 MiB each at most),
# drafter.sha256, drafter-config.json (the card: command, data, machine, held-out tau), drafter-tau.json.
# scripts/device/install_dflash.py puts them back into assets/dflash-smollm2-135m (README.md).
#
# The GGUF comes first, in two stash calls (check.sh's six parts); then this, one call of ~9 minutes:
#   carry assets/train-data .whl/site   (timeout_s 600)
# It trains until HOURS (counted from the command's start, the model's load and the data's import
# included; the last evaluation and the export come after), then measures and exports. The drafter
# is also exported every EVAL_EVERY steps when its held-out tau is the best so far, and train-draft
# runs under a hard stop CALL_S seconds after this script started (less the export's 20 s): a call
# that overruns still leaves the last export here to split into $OUT.
#
# From scratch: train-draft takes no --init-from for a DFlash drafter, and the shipped one (1 layer,
# 0.2M distinct answer tokens on a CPU, held-out tau 1.35) would only fit LAYERS=1 and would give
# 7M tokens little head start.
# The settings, against the public recipe (SpecForge's DFlash trainer and z-lab's drafters: 5 layers
# over a 36-layer 8B target, blocks of 16, 512 anchors per sequence of up to 8k tokens, lr 6e-4 with
# 4% warm-up, loss decay gamma 7, 6 epochs of a large corpus):
#   LAYERS=2     a 30-layer 135M target and ~8 minutes of training: two layers are 7M parameters
#                (the LM head's 4.7M rows are the target's, frozen); the step is launch-bound, so the
#                second layer costs far less than twice; inference reads 14 MB more per draft on a CPU.
#   BLOCK=8      the anchor and 7 guesses: on this project's CPU a 16-token verify costs 2.46x a plain
#                step, 8 tokens little more than one (docs/training.md); gamma defaults to BLOCK / 2 = 4,
#                z-lab's value for blocks of 8 (SpecForge's 7 is for 16).
#   ANCHORS=256  the answers are at most 256 tokens (the data's max_answer_tokens), so every answer
#                position anchors a block: the densest signal each target forward can give (SpecForge's
#                512 are sparse over sequences of thousands of tokens).
#   BATCH=16384  padded conversation tokens a step (~55 conversations, ~80k block rows): one target
#                forward of that size keeps an H200 busy, and 2 epochs are ~1,300 optimizer steps.
#   PACK=8192    block rows per drafter forward (~5 conversations packed): a forward per conversation
#                is ~2,200 aten ops of dispatch (fwd + bwd, counted on a CPU), ~70k of them for 2 epochs;
#                the packed mask is dense, so its attention grows with the pack (8192 rows x ~10k
#                columns x 9 heads: ~0.7G scores a layer, on SDPA's math path with GQA and a mask).
#                PACK=0: a forward per conversation (the CPU's way), should packing fail there.
#   LR=1e-3      above SpecForge's 6e-4: a small drafter (width 576) from scratch over only ~1,300 steps
#                (20 warm-up steps, cosine to a tenth).
#   EPOCHS=2     what fits: a time-boxed run stops at HOURS with its learning rate partly decayed, and
#                two passes over 7M tokens is 35x the shipped drafter's data.
# Dry run on a CPU (tiny sizes; the same path: --live-target runs the target on each batch there too):
#   PY=.venv/bin/python DEVICE=cpu TOKENS=3000 STEPS=2 BATCH=1024 PACK=512 EVAL_BLOCKS=64 EVAL_EVERY=1 \
#     bash scripts/device/lease15.sh d
source scripts/device/env.sh > /dev/null || exit 1
start=$SECONDS
if [ "$DEVICE" != cpu ] && [ -z "${MODEL:-}" ] && [ -z "${SPECCHAT_EMBEDDED_GGUF:-}" ]; then
  echo "the embedded GGUF is not assembled: run the two stash calls first (scripts/device/README.md)"
  exit 1
fi
folders=${IMPORT:-assets/train-data/smollm2-135m assets/train-data/smollm2-135m-gpu assets/train-data/smollm2-135m-tasks}
imports=()
for d in $folders; do imports+=(--import-data "$d"); done
# --tokens: every answer token of the folders' distinct shards, held-out ones too: the data cache then
# holds them all, so nothing is generated, and the training budget takes every training answer
tokens=${TOKENS:-$("$PY" -c 'import hashlib, sys
from pathlib import Path
from engine.train.data import DataCache, answer_tokens
seen, total = set(), 0
for folder in sys.argv[1:]:
    cache = DataCache(Path(folder), 49152)
    for i in cache.shard_indices():
        digest = hashlib.sha256((cache.folder / f"batch-{i:06d}.npz").read_bytes()).hexdigest()
        if digest not in seen:  # --import-data skips a shard whose bytes the cache holds
            seen.add(digest)
            total += answer_tokens(cache.read(i))
print(total)' $folders)}
DRAFTER=$SPECCHAT_STASH/dflash
rm -rf "$DRAFTER"
extra=()
[ -n "${STEPS:-}" ] && extra+=(--max-steps "$STEPS")
[ -n "${EVAL_BLOCKS:-}" ] && extra+=(--eval-blocks "$EVAL_BLOCKS")
[ -n "${THREADS:-}" ] && extra+=(--threads "$THREADS")
[ "${PACK:-8192}" != 0 ] && extra+=(--pack-rows "${PACK:-8192}")
stop=$(( ${CALL_S:-580} - (SECONDS - start) - 20 ))
(( stop < 30 )) && stop=30
echo "== DFlash drafter on $tokens answer tokens from $folders (hard stop in $stop s)"
timeout "$stop" "$PY" -m specchat train-draft ${MODEL:+"$MODEL"} --method dflash --live-target --device "$DEVICE" \
  --tokens "$tokens" --out "$DRAFTER" --block-size "${BLOCK:-8}" --draft-layers "${LAYERS:-2}" \
  --anchors "${ANCHORS:-256}" --batch-tokens "${BATCH:-16384}" --lr "${LR:-1e-3}" \
  --epochs "${EPOCHS:-2}" --hours "${HOURS:-0.14}" --eval-every "${EVAL_EVERY:-200}" --checkpoint-every 100 \
  --bf16 on "${imports[@]}" "${extra[@]}" 2>&1 | tee "$OUT/train-dflash.log"
echo "train exit: ${PIPESTATUS[0]} (124: the hard stop; the last export is what comes back)" | tee -a "$OUT/train-dflash.log"
if [ -f "$DRAFTER/model.safetensors" ]; then
  cp "$DRAFTER/config.json" "$OUT/drafter-config.json"
  cp "$DRAFTER/tau.json" "$OUT/drafter-tau.json" 2>/dev/null
  split -b 15m "$DRAFTER/model.safetensors" "$OUT/drafter.safetensors.part-"
  (cd "$DRAFTER" && sha256sum model.safetensors) > "$OUT/drafter.sha256"
  echo "== exported: $(ls "$OUT"/drafter* | tr '\n' ' ')"
else
  echo "== no drafter was exported (stopped before its first evaluation)"
fi
