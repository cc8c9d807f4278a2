"""``moehome-tray --install-desktop-entry``: moehome in the application menu of a Linux
desktop (the XDG Desktop Entry spec), with one command from the unpacked bundle: the
entry starts this tray wherever the bundle lies, its icon is the bundle's own. The folders
are created when a fresh account lacks them; running it again replaces the entry."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final

from app.autostart import desktop_exec
from core.files import replace_file

log = logging.getLogger(__name__)

ENTRY_NAME: Final = "moehome.desktop"


def applications_dir(environ: dict[str, str] | None = None) -> Path:
    """$XDG_DATA_HOME/applications (a relative XDG_DATA_HOME is ignored, as the spec says)."""
    env = os.environ if environ is None else environ
    home = env.get("XDG_DATA_HOME", "")
    base = Path(home) if home and os.path.isabs(home) else Path.home() / ".local" / "share"
    return base / "applications"


def desktop_entry(command: list[str], icon: Path) -> str:
    return "\n".join(
        [
            "[Desktop Entry]",
            "Type=Application",
            "Version=1.0",
            "Name=moehome",
            "GenericName=Volunteer computing",
            "Comment=Lend your GPU to train open neural networks while you are away",
            f"Exec={desktop_exec(command)} %u",
            f"Icon={icon}",
            "Terminal=false",
            "Categories=Science;Utility;",
            "Keywords=gpu;volunteer;machine learning;",
            # moehome:// invites open in the tray (a web page's link)
            "MimeType=x-scheme-handler/moehome;",
            "StartupNotify=false",
            "",
        ]
    )


def install_desktop_entry(command: list[str], icon: Path, folder: Path | None = None) -> Path:
    """Write the entry; its path."""
    path = (folder or applications_dir()) / ENTRY_NAME
    replace_file(path, desktop_entry(command, icon).encode())
    log.info("wrote %s", path)
    return path
