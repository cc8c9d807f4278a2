from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Never touch the real user's data or config folders."""
    monkeypatch.setenv("MOEHOME_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture(autouse=True)
def _restore_logging():
    """CLI tests configure logging for the whole process; undo it after each test."""
    import logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {name: logging.getLogger(name).level for name in ("app", "core", "net", "libp2p")}
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
