"""The single-GPU path: Triton kernels and static-shape (CUDA-graph) decode/verify.

No UI imports. Everything here is importable without triton or CUDA; the kernels are only built
when first used, and the CUDA graphs only on a CUDA device. The kernels are tested against their
torch references on CPU tensors under ``TRITON_INTERPRET=1`` (tests/gpu), so the GPU code is
exercised on machines that have no GPU.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

MAX_TREE = 64  # the largest bucket, and the most nodes the GPU acceptance walk takes


def triton_available() -> bool:
    """True when the triton package is installed (it is on GPU machines and in the test extra)."""
    return importlib.util.find_spec("triton") is not None


def on_gpu(tensor, nodes: int = 1) -> bool:
    """Whether the engine's GPU hooks (compaction, acceptance walk) take this tensor (and a tree of
    ``nodes``): a CUDA tensor with triton installed. CPU tensors always keep the CPU path."""
    return tensor.is_cuda and nodes <= MAX_TREE and triton_available()


_built: dict[tuple[str, str], Any] = {}


def kernel(name: str, build: Callable[[], Any]) -> Any:
    """The jitted kernel ``name``, built on first use. Cached per interpreter mode: triton decides
    at decoration time whether a kernel is compiled or interpreted (``TRITON_INTERPRET=1``), and
    the tests run both kinds in one process on a GPU machine."""
    key = (name, os.environ.get("TRITON_INTERPRET", "0"))
    if key not in _built:
        _built[key] = build()
    return _built[key]
