"""Kernel tests run the Triton kernels on CPU tensors through triton's interpreter.

Triton decides when a function is decorated whether it is compiled or interpreted, and that
includes its own standard library (``tl.max``, ``tl.sum``...), decorated when ``triton.language``
is first imported. So on a machine without a GPU this conftest imports triton with
``TRITON_INTERPRET=1`` before any test module can import it, then restores the variable; the
``interpret`` fixture sets it again only while a kernel test runs (engine.gpu caches kernels per
mode). No other test uses triton.

Kernel tests take ``kernel_device``: CPU tensors under the interpreter where there is no GPU, CUDA
tensors and compiled kernels where there is one, so the whole kernel matrix runs compiled on a GPU
machine (the compiled kernels are what the engine launches). ``interpret`` stays for tests that
need the interpreter on CPU tensors (a CPU model's forward); they skip on a GPU machine.

Under the interpreter every ``tl.dot`` is tests/gpu/tensor_core.py's (a fixed, documented reduction
order in numpy elementwise fp32) instead of the interpreter's ``numpy.matmul``: with the host's BLAS,
whether a row's bits depend on its place in a tile was a property of the machine (issue 55).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch

from engine.gpu import triton_available
from tests.gpu.tensor_core import TensorCore, installed

_INTERPRETER_READY = False
if triton_available() and not torch.cuda.is_available() and "triton" not in sys.modules:
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language  # noqa: F401  (the standard library, built for the interpreter)

    _INTERPRETER_READY = True
    if _saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture(scope="session", autouse=True)
def tensor_core() -> Iterator[TensorCore | None]:
    """The interpreter's ``tl.dot`` for the whole session (None where nothing is interpreted)."""
    if not _INTERPRETER_READY:
        yield None
        return
    with pytest.MonkeyPatch.context() as patch, installed(patch) as core:
        yield core


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    if not triton_available():
        pytest.skip("triton is not installed (pip install -e .[test] installs it)")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the kernels are tested compiled (the cuda tests)")
    if not _INTERPRETER_READY:
        pytest.skip("triton was imported before tests/gpu/conftest.py could switch on its interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def kernel_device(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The device the kernel tests put their tensors on: CUDA (compiled) when a GPU is present,
    else the CPU (interpreted), so the same assertions cover both."""
    if not triton_available():
        pytest.skip("triton is not installed (pip install -e .[test] installs it)")
    if torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # compiled: what the engine runs
        return torch.device("cuda")
    if not _INTERPRETER_READY:
        pytest.skip("triton was imported before tests/gpu/conftest.py could switch on its interpreter")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device("cpu")


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if not triton_available():
        pytest.skip("triton is not installed")
    return torch.device("cuda")
