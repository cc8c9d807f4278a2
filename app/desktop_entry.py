"""``moehome-tray --install-desktop-entry``: moehome in the application menu of a Linux
desktop (the XDG Desktop Entry spec), with one command from the unpacked bundle: the
entry starts this tray wherever the bundle lies, its icon is the bundle's own. The folders
are created when a fresh account lacks them; running it again replaces the entry."""

from __future__ import annotations

import configparser
import io
import logging
import os
from pathlib import Path
from typing import Final

from app.autostart import desktop_exec
from core.files import replace_file

log = logging.getLogger(__name__)

ENTRY_NAME: Final = "moehome.desktop"
SCHEME_MIME: Final = "x-scheme-handler/moehome"


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


def install_desktop_entry(
    command: list[str],
    icon: Path,
    folder: Path | None = None,
    *,
    config_home: Path | None = None,
) -> Path:
    """Write the entry and make it the handler of moehome:// links; the entry's path."""
    path = (folder or applications_dir()) / ENTRY_NAME
    replace_file(path, desktop_entry(command, icon).encode())
    log.info("wrote %s", path)
    register_scheme_handler(config_home or config_dir())
    return path


def config_dir(environ: dict[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME (a relative one is ignored, as the spec says), else ~/.config."""
    env = os.environ if environ is None else environ
    home = env.get("XDG_CONFIG_HOME", "")
    return Path(home) if home and os.path.isabs(home) else Path.home() / ".config"


def register_scheme_handler(config_home: Path) -> Path:
    """Name our entry the default handler of ``moehome://`` in the user's
    ``mimeapps.list`` (the XDG MIME Applications spec; what ``gio mime`` and browsers
    read), keeping every other association. ``MimeType=`` in the entry alone registered
    nothing: ``gio mime x-scheme-handler/moehome`` found no handler."""
    path = config_home / "mimeapps.list"
    parser = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keys keep their case
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as exc:  # a broken file is the user's: leave it alone
        log.warning("could not read %s (%s): moehome:// links are not registered", path, exc)
        return path
    for section in ("Default Applications", "Added Associations"):
        if not parser.has_section(section):
            parser.add_section(section)
    parser["Default Applications"][SCHEME_MIME] = ENTRY_NAME
    added = [e for e in parser["Added Associations"].get(SCHEME_MIME, "").split(";") if e]
    parser["Added Associations"][SCHEME_MIME] = (
        ";".join([ENTRY_NAME, *(e for e in added if e != ENTRY_NAME)]) + ";"
    )
    text = io.StringIO()
    parser.write(text, space_around_delimiters=False)
    replace_file(path, text.getvalue().encode())
    log.info("moehome:// links open moehome (%s)", path)
    return path
