"""Where moehome keeps its files: the user's data and config folders (platformdirs).

``MOEHOME_DATA_DIR`` and ``MOEHOME_CONFIG_DIR`` override them (tests, several nodes on one
machine, portable installs).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "moehome"


def data_dir() -> Path:
    override = os.environ.get("MOEHOME_DATA_DIR")
    return Path(override) if override else platformdirs.user_data_path(APP_NAME, appauthor=False)


def config_dir() -> Path:
    override = os.environ.get("MOEHOME_CONFIG_DIR")
    return Path(override) if override else platformdirs.user_config_path(APP_NAME, appauthor=False)


def identity_path(base: Path | None = None) -> Path:
    return (base or data_dir()) / "identity.key"
