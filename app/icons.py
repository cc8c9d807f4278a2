"""The tray icon's look says the node's state.

Every state has its own SVG under ``assets/icons/`` (``state-<name>.svg``): the base mark
of ``moehome.svg`` with a badge, so the state reads at 16 px on dark and light panels.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final

from PySide6.QtGui import QIcon

log = logging.getLogger(__name__)

# A bundle (PyInstaller, .app, MSI) lays the assets out elsewhere and says where here.
ASSETS_ENV: Final = "MOEHOME_ASSETS"

# Reasons the node gives for a pause that mean "too hot": these get their own icon, since
# the user may want to act on them (airflow, a lower limit) rather than just wait.
_HOT_REASONS: Final = frozenset({"gpu_hot", "cpu_hot"})

_NAMES: Final = {
    "working": "working",
    "starting": "working",
    "waiting": "paused",
    "paused": "paused",
    "no project": "no-project",
    "error": "error",
    "not running": "not-running",
}

ICON_NAMES: Final = ("working", "paused", "hot", "no-project", "error", "not-running")

_cache: dict[Path, QIcon] = {}


def assets_dir() -> Path:
    """Where the icons are: ``$MOEHOME_ASSETS`` when set, else the source tree's copy."""
    override = os.environ.get(ASSETS_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "assets" / "icons"


def icon_name(state: str, reason_code: str) -> str:
    """The icon for a node state (and the reason code of a pause)."""
    if state == "paused" and reason_code in _HOT_REASONS:
        return "hot"
    # An unknown state means the tray and node disagree on the protocol: show it loudly
    # rather than pretend all is well.
    return _NAMES.get(state, "error")


def icon_path(name: str) -> Path:
    return assets_dir() / f"state-{name}.svg"


def state_icon(state: str, reason_code: str) -> QIcon:
    """The tray icon for a state; loaded once per file.

    Raises RuntimeError naming the file when it is missing or unreadable: a QIcon made
    from a bad file is silently empty, which would leave an invisible tray icon.
    """
    path = icon_path(icon_name(state, reason_code))
    cached = _cache.get(path)
    if cached is not None:
        return cached
    if not path.is_file():
        raise RuntimeError(f"tray icon missing: {path}")
    icon = QIcon(str(path))
    # QIcon loads lazily; only rendering tells whether the SVG parses.
    if icon.isNull() or icon.pixmap(16, 16).isNull():
        raise RuntimeError(f"tray icon unreadable: {path}")
    log.debug("loaded tray icon %s", path)
    _cache[path] = icon
    return icon
