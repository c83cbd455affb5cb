#!/usr/bin/env bash
# Device plan, command 1 (carry .device/gguf-1): the GPU kernel tests compiled, then the
# Llama-3.1-8B-shaped random bench in bf16 and fp32 (decode tok/s, fraction of the HBM limit,
# verify cost curve to 64 tree tokens, oracle acceptance). ~5 minutes on an H100.
# Dry run here: DEVICE=cpu SHAPE=smollm2-135m bash scripts/device/plan1.sh
source scripts/device/env.sh || exit 1
SHAPE=${SHAPE:-llama-3.1-8b}
TOKENS=${TOKENS:-128}
DTYPES=${DTYPES:-bfloat16 float32}
log=$OUT/plan1.log
{
  echo "== pytest tests/gpu (compiled on CUDA tensors when a GPU is present)"
  timeout "${PYTEST_S:-240}" "$PY" -m pytest tests/gpu -q -p no:cacheprovider -x -W ignore::pytest.PytestConfigWarning
  echo "pytest exit: $?"
  for dtype in $DTYPES; do
    echo "== random bench: $SHAPE $dtype"
    timeout 150 "$PY" -m specchat bench --random-weights "$SHAPE" --device "$DEVICE" --dtype "$dtype" \
      --context 512 --max-new-tokens "$TOKENS" --json "$OUT/random-$SHAPE-$dtype.json"
    echo "bench exit: $?"
  done
} 2>&1 | tee "$log"
