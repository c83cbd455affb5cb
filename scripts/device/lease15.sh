#!/usr/bin/env bash
# The device plan cut to a 15-minute lease: two calls back to back (the machine goes back 30 s
# after a call, and the GGUF parts wait in $SPECCHAT_STASH only while it stays up).
#
#   a: carry .device/gguf-1 .device/gguf-2 .device/gguf-3 (the GGUF split in five parts)
#      pytest tests/gpu compiled on CUDA tensors; the 8B-shaped random bench in bf16; whether
#      cuBLAS's bf16 linears are batch-invariant and what an invariant Triton one costs (bi_probe.py).
#   b: carry .device/gguf-4 .device/gguf-5 assets/eagle3-smollm2-135m .whl/site
#      the embedded model's MT-bench rows (none/ngram/eagle3, bf16); where an EAGLE-3 step's time
#      goes (profile_session.py).
#   c: carry assets/train-data assets/eagle3-smollm2-135m .whl/site (the GGUF waits in the stash)
#      the EAGLE-3 head trained from the shipped one on all the self-distilled data there is: the
#      CPU's 5.0M answer tokens and the first GPU's 0.56M, imported as ids, their features computed
#      on the GPU as training reads them (train.sh with IMPORT; HOURS of training, then export);
#      REFIT=1 (the default here) re-picks the draft vocabulary from that data (--refit-vocab).
#      Before session 26, b generated data and trained on it (DATA_S, HOURS, EPOCHS still do: b2).
#   stash: only the GGUF's parts (carry three, then two): session 31 spent 60 s on two such calls
#      and the rest of the lease on c.
#   m: carry assets/train-data .whl/site: Medusa heads trained from scratch on all the shipped ids.
#   d: carry assets/train-data .whl/site: a DFlash drafter trained from scratch on all the shipped ids, the
#      target's features computed batched on the GPU (train_dflash.sh says what and why), exported as
#      drafter.safetensors.part-*, drafter.sha256 and drafter-config.json (install_dflash.py installs them).
#
# At most 8 files come back from $OUT, so the small ones are bundled into results-<part>.tgz.
# The working tree travels too (64 MiB a call with what is carried): scripts/device/slim.sh keeps
# the big tracked files behind while these calls run (README.md).
# Dry run here: PY=.venv/bin/python DEVICE=cpu SHAPE=smollm2-135m TOKENS=16 LIMIT=1 \
#   DATA_S=60 STEPS=2 GEN_BATCH=8 BATCH=2048 bash scripts/device/lease15.sh a   (then b)
part=${1:?usage: lease15.sh a|b|b2|c|stash|m|d}
case $part in
  a)
    DTYPES=bfloat16 PYTEST_S=${PYTEST_S:-150} bash scripts/device/plan1.sh
    (source scripts/device/env.sh > /dev/null && timeout 120 "$PY" scripts/device/bi_probe.py 2>&1 \
      | tee "$OUT/bi-probe.txt") ;;
  b)
    DTYPES=bfloat16 SETS=mt_bench LIMIT=${LIMIT:-12} CURVE=0 bash scripts/device/plan3.sh
    (source scripts/device/env.sh > /dev/null && timeout 120 "$PY" scripts/device/profile_session.py \
      --device "$DEVICE" --tokens "${TOKENS:-64}" 2>&1 | tee "$OUT/profile-eagle3.txt") ;;
  b2)
    DATA_S=${DATA_S:-240} HOURS=${HOURS:-0.05} EPOCHS=${EPOCHS:-10} bash scripts/device/train.sh ;;
  c)
    IMPORT=${IMPORT:-"assets/train-data/smollm2-135m assets/train-data/smollm2-135m-gpu assets/train-data/smollm2-135m-tasks"} \
      HOURS=${HOURS:-0.11} EPOCHS=${EPOCHS:-6} LR=${LR:-6e-4} EVAL_EVERY=${EVAL_EVERY:-0} REFIT=${REFIT:-1} \
      bash scripts/device/train.sh ;;
  stash)
    # only the GGUF's parts (session 31: two such calls, then c or m, trained for most of the lease)
    source scripts/device/env.sh > /dev/null && ls -la "$SPECCHAT_STASH" ;;
  m)
    # Medusa heads from scratch (train-draft takes no --init-from for them) on every shipped id;
    # the target's last hidden states computed on the GPU once, several conversations a forward
    source scripts/device/env.sh > /dev/null || exit 1
    imports=()
    folders=${IMPORT:-assets/train-data/smollm2-135m assets/train-data/smollm2-135m-gpu assets/train-data/smollm2-135m-tasks}
    for d in $folders; do imports+=(--import-data "$d"); done
    HEAD=$SPECCHAT_STASH/medusa
    rm -rf "$HEAD"
    # --tokens: every answer token the carried folders hold, held-out ones included, so nothing is
    # generated (session 31 carried two of the three folders with a fixed 7M and spent its whole
    # call generating the missing 1.4M) and Medusa's --tokens bound takes every training answer
    tokens=${TOKENS:-$("$PY" -c 'import sys
from pathlib import Path
from engine.train.data import DataCache, answer_tokens
print(sum(answer_tokens(DataCache(Path(d), 49152).samples()) for d in sys.argv[1:]))' \
      $folders)}
    echo "== Medusa heads on $tokens answer tokens"
    "$PY" -m specchat train-draft --method medusa --medusa-heads 4 --device "$DEVICE" --tokens "$tokens" \
      --out "$HEAD" --batch-tokens "${BATCH:-16384}" --lr "${LR:-2e-3}" --epochs "${EPOCHS:-6}" --hours "${HOURS:-0.045}" \
      --eval-every 0 --checkpoint-every 200 "${imports[@]}" 2>&1 | tee "$OUT/train-medusa.log"
    cp "$HEAD/config.json" "$OUT/medusa-config.json"
    split -b 12m "$HEAD/model.safetensors" "$OUT/head.safetensors.part-"
    sha256sum "$HEAD/model.safetensors" > "$OUT/head.sha256" ;;
  d)
    bash scripts/device/train_dflash.sh ;;
  *) echo "lease15.sh: part must be a, b, b2, c, stash, m or d" >&2; exit 2 ;;
esac
OUT=${OUT:-.device/out}
cd "$OUT" && small=$(find . -maxdepth 1 -type f -size -4M ! -name 'head.safetensors.part-*' ! -name 'drafter*' ! -name '*.tgz' -printf '%P\n') \
  && [ -n "$small" ] && tar -czf "results-$part.tgz" $small && rm -f $small
ls -la
