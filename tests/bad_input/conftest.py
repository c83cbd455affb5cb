"""The bad-input suite's surroundings: the tests/ helpers importable, a tiny model, nothing of the user's read.

Every case runs with its own config, data and cache folders (never the developer's), offline, with
the verify-cost calibration off (a case that loads the tiny model should not spend seconds measuring).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # heads.py, tiny.py, test_tokenizer.py
    sys.path.insert(0, str(TESTS))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from builders import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("bad-input-model") / "tiny")


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty model cache, except for the native kernels: those are built once per machine (content-
    hashed, so sharing them is safe) and a fresh build per run takes a minute on two cores."""
    from engine.models.resolve import cache_dir

    cache = tmp_path_factory.mktemp("bad-input-cache")
    kernels = cache_dir() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (cache / "kernels").symlink_to(kernels, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:  # built here, on a fresh machine, not inside a case's timeout
        mp.setenv("SPECCHAT_CACHE_DIR", str(cache))
        from engine.kernels import native

        native.load()
    return cache


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "SPECCHAT_CONFIG": str(tmp_path / "no-config.toml"),
        "SPECCHAT_DATA_DIR": str(tmp_path / "data"),
        "SPECCHAT_CACHE_DIR": str(shared_cache),
        "SPECCHAT_CALIBRATE": "0",
        "SPECCHAT_ENGINE_PROCESS": "0",
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
    }.items():
        monkeypatch.setenv(name, value)
