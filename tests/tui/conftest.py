"""UI tests never read the developer's own config file nor write to their data dir."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
