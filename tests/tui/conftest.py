"""UI tests never read the developer's own config file."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "no-config.toml"))
