"""Kernel tests run the Triton kernels on CPU tensors through triton's interpreter.

``TRITON_INTERPRET=1`` is set per test (monkeypatch, so it is undone after each one and no test
outside this folder sees it); triton reads it when a kernel is built, and engine.gpu caches
kernels per mode, so interpreted and compiled kernels never mix.
"""

from __future__ import annotations

import pytest

from engine.gpu import triton_available


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if not triton_available():
        pytest.skip("triton is not installed (pip install -e .[test] installs it)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if not triton_available():
        pytest.skip("triton is not installed")
    return torch.device("cuda")
