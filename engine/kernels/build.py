"""Compile our C kernels into one shared library with the system compiler, cached by content.

Why a plain C library (loaded through ctypes by ``native.py``) rather than a torch C++
extension: the kernels need no torch headers, so they compile in about a second with ``cc`` (a
torch extension takes a minute and needs ninja), lazily on first use, on any machine with a
compiler. This module only builds and caches; ``native.py`` owns the bindings and decides what
a failed build means (torch's own products: slower, never wrong).

The built library lives in ``<cache>/kernels/`` under a name that hashes the sources, the
headers, the compiler and the flags, so an edited kernel or another compiler gets its own build,
and a library is written under a temporary name and renamed, so a concurrent start sees either
nothing or a whole library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.models.resolve import cache_dir

_HERE = Path(__file__).parent
# attention_shared.c and fast_bf16.c last: linked right after attention.c, attention_shared.c moved every
# later object's code, and a one-token step measured 5% slower (old and new builds alternated, the same
# C; code alignment), where at the end a new file leaves the other objects laid out as they were.
SOURCES = tuple(_HERE / n for n in ("skinny.c", "ops.c", "attention.c", "stored.c", "fast.c", "fast_avx2.c",
                                    "fast_amx.c", "decoder.c", "eagle_native.c", "corpus.c", "attention_shared.c",
                                    "fast_bf16.c"))
HEADERS = tuple(_HERE / n for n in ("layers.h", "tile.h", "fast.h", "vec.h", "attention.h", "scales.h", "q6.h"))
# -ffp-contract=off: a*b + c stays two roundings wherever the source says so (the rotary product
# must equal torch's complex multiply); the kernels' FMAs are explicit intrinsics.
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off")


class BuildError(Exception):
    """The kernels cannot be built here; the message says why (it becomes ``native.why_not``)."""


def library() -> Path:
    """The path of the built library, compiling it first when this source/compiler has none yet."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        raise BuildError("the native kernel is built for x86-64 Linux only")
    compiler = _compiler()
    if compiler is None:
        raise BuildError("no C compiler found (set CC)")
    try:
        path = _library_path(compiler)
        if not path.exists():
            _compile(compiler, path)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise BuildError(f"build failed: {exc} {detail.decode(errors='replace')[:200]}".strip()) from exc
    return path


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(
        b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS)) + version.encode() + " ".join(FLAGS).encode()
    ).hexdigest()[:16]
    return cache_dir() / "kernels" / f"specchat-cpu-{sys.platform}-{digest}.so"


def _compile(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, "-o", tmp, *map(str, SOURCES), "-lm"], check=True, capture_output=True,
                       timeout=120)
        os.replace(tmp, target)  # atomic: a concurrent start sees either nothing or a whole library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
