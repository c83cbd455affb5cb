"""Build, cache and load the native skinny-GEMM kernel (``skinny.c``) with the system C compiler.

Why a plain C library through ctypes rather than a torch C++ extension: the kernel needs no
torch headers, so it compiles in about a second with ``cc`` (a torch extension takes a minute
and needs ninja), and it can be built lazily on first use on any machine with a compiler.
Where there is no compiler, no AVX2/FMA, or the build fails, ``load()`` returns None and the
caller keeps torch's own products: slower, never wrong.

The built library lives in ``<cache>/kernels/`` under a name that hashes the source, the
compiler and the flags, so an edited kernel or another compiler gets its own build.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("skinny.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp")
ENV_SWITCH = "SPECCHAT_LINEAR"  # "torch" turns the native kernel off


class NativeKernel:
    """The loaded library: ``linear(x, panels, n, bias)`` with torch tensors."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        fn = lib.skinny_linear
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_long,
            ctypes.c_long,
            ctypes.c_void_p,
            ctypes.c_long,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
        ]
        fn.restype = None
        self._fn = fn

    def linear(self, x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [M, K] contiguous fp32; panels: [ceil(n/16), K, 16]; returns [M, n]."""
        m, k = x.shape
        y = torch.empty(m, n, dtype=torch.float32)
        self._fn(
            x.data_ptr(),
            m,
            k,
            panels.data_ptr(),
            n,
            bias.data_ptr() if bias is not None else None,
            y.data_ptr(),
            torch.get_num_threads(),
        )
        return y


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *FLAGS, "-o", tmp, str(SOURCE)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(tmp, target)  # atomic: a concurrent start sees either nothing or a whole library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _library_path(compiler: str) -> Path:
    from engine.models.resolve import cache_dir

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(SOURCE.read_bytes() + version.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"skinny-{sys.platform}-{digest}.so"


@cache
def load() -> NativeKernel | None:
    """The kernel, built on first use; None where it cannot run here (the reason is in ``why_not``)."""
    global why_not
    if os.environ.get(ENV_SWITCH, "").lower() == "torch":
        why_not = f"{ENV_SWITCH}=torch"
        return None
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        why_not = "the native kernel is built for x86-64 Linux only"
        return None
    compiler = _compiler()
    if compiler is None:
        why_not = "no C compiler found (set CC)"
        return None
    try:
        path = _library_path(compiler)
        if not path.exists():
            _build(compiler, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        why_not = f"build failed: {exc} {detail.decode(errors='replace')[:200]}".strip()
        return None
    if not lib.skinny_supported():
        why_not = "this CPU lacks AVX2/FMA"
        return None
    why_not = ""
    return NativeKernel(lib, path)


why_not = "not loaded yet"
