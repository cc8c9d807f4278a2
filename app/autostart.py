""" "Start at login": one small file (or registry value) per OS that starts the tray.

Each OS has its own mechanism; all three are per user and need no administrator rights:

- Linux and other XDG desktops: ``$XDG_CONFIG_HOME/autostart/moehome.desktop``
- Windows: the value ``moehome`` under ``HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run``
- macOS: the launch agent ``~/Library/LaunchAgents/org.moehome.tray.plist``

This module is Qt-free so that it can be used and tested without a display.
"""

from __future__ import annotations

import configparser
import contextlib
import logging
import os
import plistlib
import subprocess
import sys
from pathlib import Path
from typing import Final, Protocol

from core.files import replace_file

log = logging.getLogger(__name__)

DESKTOP_FILE_NAME: Final = "moehome.desktop"
RUN_KEY: Final = r"Software\Microsoft\Windows\CurrentVersion\Run"
RUN_VALUE: Final = "moehome"
LAUNCH_AGENT_LABEL: Final = "org.moehome.tray"

# Desktop Entry spec, "The Exec key": an argument holding any of these must be quoted.
_RESERVED: Final = frozenset(" \t\n\"'\\><~|&;$*?#()`")
# Inside double quotes these four must be escaped with a backslash.
_ESCAPE_IN_QUOTES: Final = frozenset('"`$\\')


class Autostart(Protocol):
    def enabled(self) -> bool: ...

    def enable(self, command: list[str]) -> None: ...

    def disable(self) -> None: ...


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        log.info("start at login disabled: removed %s", path)


def desktop_exec_argument(arg: str) -> str:
    """One argument of a Desktop Entry ``Exec`` value, as written in the file.

    Two layers apply, innermost first: the Exec quoting rule (double quotes, with ``"``,
    `` ` ``, ``$`` and ``\\`` escaped by a backslash), then the general escaping of string
    values (``\\`` doubled, newlines as ``\\n``). ``%`` is doubled in every argument,
    quoted or not, since a lone ``%`` starts a field code.
    """
    if arg and not any(c in _RESERVED for c in arg):
        quoted = arg
    else:
        inner = "".join("\\" + c if c in _ESCAPE_IN_QUOTES else c for c in arg)
        quoted = f'"{inner}"'
    return (
        quoted.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
        .replace("%", "%%")
    )


def desktop_exec(command: list[str]) -> str:
    return " ".join(desktop_exec_argument(a) for a in command)


class XdgAutostart:
    """The XDG Autostart spec, honoured by GNOME, KDE, Xfce, Cinnamon, LXQt, ..."""

    def __init__(self, config_home: Path | None = None, icon: str | None = None) -> None:
        if config_home is None:
            env = os.environ.get("XDG_CONFIG_HOME")
            # The spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
            config_home = Path(env) if env and os.path.isabs(env) else Path.home() / ".config"
        self.path = config_home / "autostart" / DESKTOP_FILE_NAME
        self._icon = icon

    def _icon_value(self) -> str:
        if self._icon is not None:
            return self._icon
        # Imported here so that this module stays Qt-free for its callers and tests.
        from app.icons import assets_dir

        return str(assets_dir() / "moehome.svg")

    def enabled(self) -> bool:
        if not self.path.is_file():
            return False
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment, method-assign]
        try:
            parser.read(self.path, encoding="utf-8")
            entry = parser["Desktop Entry"]
        except (configparser.Error, KeyError, OSError, UnicodeDecodeError) as exc:
            log.warning("unreadable autostart entry %s: %s", self.path, exc)
            return False
        # Desktop settings panels switch an entry off by editing it rather than deleting it.
        return (
            entry.get("Hidden", "false").strip().lower() != "true"
            and entry.get("X-GNOME-Autostart-enabled", "true").strip().lower() != "false"
        )

    def enable(self, command: list[str]) -> None:
        if not command:
            raise ValueError("the command to start at login is empty")
        lines = [
            "[Desktop Entry]",
            "Type=Application",
            "Version=1.0",
            "Name=moehome",
            "Comment=Lend this computer's GPU to train an open model while you are away",
            f"Exec={desktop_exec(command)}",
            f"Icon={self._icon_value()}",
            "Terminal=false",
            "X-GNOME-Autostart-enabled=true",
            "",
        ]
        replace_file(self.path, "\n".join(lines).encode("utf-8"))
        log.info("start at login enabled: wrote %s", self.path)

    def disable(self) -> None:
        _remove(self.path)


class WindowsRunKey:
    """The per-user Run key: Windows starts each value's command line at login."""

    def enabled(self) -> bool:
        if sys.platform != "win32":
            raise RuntimeError("the Run key exists only on Windows")
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, RUN_VALUE)
        except FileNotFoundError:
            return False
        return True

    def enable(self, command: list[str]) -> None:
        if sys.platform != "win32":
            raise RuntimeError("the Run key exists only on Windows")
        if not command:
            raise ValueError("the command to start at login is empty")
        import winreg

        with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            winreg.SetValueEx(key, RUN_VALUE, 0, winreg.REG_SZ, subprocess.list2cmdline(command))
        log.info("start at login enabled: HKCU\\%s\\%s", RUN_KEY, RUN_VALUE)

    def disable(self) -> None:
        if sys.platform != "win32":
            raise RuntimeError("the Run key exists only on Windows")
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
                winreg.DeleteValue(key, RUN_VALUE)
        except FileNotFoundError:
            return
        log.info("start at login disabled: removed HKCU\\%s\\%s", RUN_KEY, RUN_VALUE)


class MacLaunchAgent:
    """A per-user launchd agent, loaded by launchd at the next login."""

    def __init__(self, home: Path | None = None) -> None:
        home = Path.home() if home is None else home
        self.path = home / "Library" / "LaunchAgents" / f"{LAUNCH_AGENT_LABEL}.plist"

    def enabled(self) -> bool:
        if not self.path.is_file():
            return False
        try:
            with self.path.open("rb") as f:
                data = plistlib.load(f)
        except (OSError, plistlib.InvalidFileException, ValueError) as exc:
            log.warning("unreadable launch agent %s: %s", self.path, exc)
            return False
        return isinstance(data, dict) and data.get("RunAtLoad") is True

    def enable(self, command: list[str]) -> None:
        if not command:
            raise ValueError("the command to start at login is empty")
        agent = {
            "Label": LAUNCH_AGENT_LABEL,
            "ProgramArguments": list(command),
            "RunAtLoad": True,
            # Interactive: launchd must not throttle a process the user looks at.
            "ProcessType": "Interactive",
        }
        replace_file(self.path, plistlib.dumps(agent))
        log.info("start at login enabled: wrote %s", self.path)

    def disable(self) -> None:
        _remove(self.path)


def autostart_for_this_os() -> Autostart:
    if sys.platform == "win32":
        return WindowsRunKey()
    if sys.platform == "darwin":
        return MacLaunchAgent()
    return XdgAutostart()
