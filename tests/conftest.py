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


# Property tests run the same examples every time (no example database, no random seed,
# no "explain" phase, whose tracing misbehaved on a loaded machine): a failure in CI is
# then reproducible by running the test again.
from hypothesis import Phase, settings  # noqa: E402

settings.register_profile(
    "moehome",
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
settings.load_profile("moehome")
