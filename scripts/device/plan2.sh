#!/usr/bin/env bash
# Device plan, command 2 (carry .device/gguf-2): what the step costs and where it goes: CUDA graphs
# vs eager launches, fp32 vs bf16, for the 8B shape and the embedded model's shape, an EAGLE-3-shaped
# random head's drafting cost per level (chain and tree), and a profile of one decode step (kernel
# count and the top kernels). ~4 minutes on an H100.
# Dry run here: DEVICE=cpu SHAPE=smollm2-135m bash scripts/device/plan2.sh
source scripts/device/env.sh || exit 1
SHAPE=${SHAPE:-llama-3.1-8b}
TOKENS=${TOKENS:-64}
log=$OUT/plan2.log
{
  for shape in "$SHAPE" smollm2-135m; do
    for dtype in bfloat16 float32; do
      for graphs in 1 0; do
        # bf16 with graphs (the deployment setting) also times an EAGLE-3-shaped random head
        methods=none
        [ "$dtype$graphs" = bfloat161 ] && methods=none,eagle3
        echo "== $shape $dtype graphs=$graphs methods=$methods"
        SPECCHAT_CUDA_GRAPHS=$graphs timeout 120 "$PY" -m specchat bench --random-weights "$shape" \
          --methods "$methods" --device "$DEVICE" --dtype "$dtype" --context 512 --max-new-tokens "$TOKENS" \
          | tee -a "$OUT/plan2-tables.txt" | grep -E "decode tok/s|ms per token|fraction|verify|oracle|repeatable|level"
      done
    done
  done
  echo "== profile of one decode step"
  timeout 120 "$PY" scripts/device/profile_step.py --shape smollm2-135m --device "$DEVICE"
  timeout 120 "$PY" scripts/device/profile_step.py --shape "$SHAPE" --device "$DEVICE"
} 2>&1 | tee "$log"
