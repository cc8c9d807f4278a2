from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Never touch the real user's data or config folders."""
    monkeypatch.setenv("MOEHOME_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))
