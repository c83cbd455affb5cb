"""A tensor core for triton's CPU interpreter: a ``tl.dot`` whose reduction order is fixed and written down.

Why: the interpreter's own ``tl.dot`` is ``numpy.matmul``, i.e. the host's BLAS (OpenBLAS here). Whether
a row's bits depend on where it sits in a tile, or on the other rows, is then a property of that BLAS
build and of the core type it picked at start-up (``OPENBLAS_CORETYPE``), not of our kernel: the
invariance tests passed on one machine and failed on another (issue 55). A test of batch invariance
must fail because of what *our kernel* does, on every machine alike.

The model, for one ``D = A @ B + C`` of an [M, K] by [K, N] tile (fp32 accumulation):

- each output element is C's element plus the K products of its own row of A and its own column of B,
  added **one at a time** into it, each multiply and each add rounded to fp32 (numpy elementwise
  ufuncs: IEEE operations, no fused multiply-add, no BLAS, no threads; the same bits on every CPU);
- the order of the K products is a permutation of ``0..K-1`` drawn from the tile's shape (M, N, K)
  and nothing else.

So a row's result never depends on its place in the tile, on the other rows, or on M of the call:
the one property a tensor core's fixed instruction sequence is trusted to have. And any two tile
shapes reduce in different orders: what a GPU does *not* promise to avoid (another tile shape is
another instruction mix, with its own order). A kernel that chooses its tile shape, its K step or a
split of K by the row count therefore gives different bits here, on every machine, as it may on a GPU.

What it cannot show: the real tensor cores' order, or that the compiled kernel issues the same
instructions for every M (tests/gpu/test_compile_sm90.py reads the compiled code; only a GPU run of
tests/gpu shows the bits of the hardware). ``TensorCore.recording`` lists each dot's shapes so a test can also
check the kernel's structure directly: the same tile shapes, and as many dots a tile, whatever M is.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


def reduction_order(m: int, n: int, k: int) -> np.ndarray:
    """The order in which a [m, k] x [k, n] tile adds its products: a permutation of 0..k-1 that is a
    function of the shape alone (a stable hash, never Python's salted ``hash``)."""
    seed = int.from_bytes(hashlib.sha256(f"{m}x{n}x{k}".encode()).digest()[:8], "little")
    return np.random.Generator(np.random.PCG64(seed)).permutation(k)


def fixed_order_dot(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a @ b + c`` in c's float dtype, by the model in the module docstring."""
    m, k = a.shape
    n = b.shape[1]
    dtype = c.dtype
    a = a.astype(dtype, copy=False)
    b = b.astype(dtype, copy=False)
    acc = c.astype(dtype, copy=True)
    for j in reduction_order(m, n, k):
        acc += a[:, j, None] * b[None, j, :]  # one rounded product, then one rounded add, per element
    return acc


class TensorCore:
    """Installs :func:`fixed_order_dot` as the interpreter's ``tl.dot``; :meth:`recording` lists the dots."""

    def __init__(self) -> None:
        self._sinks: list[list[tuple[tuple[int, ...], tuple[int, ...]]]] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[tuple[tuple[int, ...], tuple[int, ...]]]]:
        """The dots issued while the block runs, as ``(a.shape, b.shape)`` pairs."""
        seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self._sinks.append(seen)
        try:
            yield seen
        finally:
            self._sinks.remove(seen)

    def wrap(self, interpreter_dot: Callable[..., Any]) -> Callable[..., Any]:
        """The builder's ``create_dot`` for float operands; any other dot (integer or fp8 data, which
        no kernel of ours issues) is left to the interpreter's own."""
        from triton.runtime.interpreter import TensorHandle

        sinks = self._sinks

        def create_dot(builder: Any, a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> Any:
            if not all(np.issubdtype(h.data.dtype, np.floating) and h.data.ndim == 2 for h in (a, b, d)):
                return interpreter_dot(builder, a, b, d, *args, **kwargs)
            for seen in sinks:
                seen.append((a.data.shape, b.data.shape))
            return TensorHandle(fixed_order_dot(a.data, b.data, d.data), d.dtype.scalar)

        return create_dot


@contextlib.contextmanager
def installed(patch: Any) -> Iterator[TensorCore]:
    """Triton's interpreter uses :class:`TensorCore`'s dot while the block runs (``patch``: a pytest
    MonkeyPatch)."""
    from triton.runtime.interpreter import InterpreterBuilder

    core = TensorCore()
    patch.setattr(InterpreterBuilder, "create_dot", core.wrap(InterpreterBuilder.create_dot))
    yield core
