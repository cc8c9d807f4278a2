"""``moehome://`` invite links, on the platforms without a desktop entry: Windows learns
the scheme from the user's registry (``HKCU\\Software\\Classes\\moehome``, no admin
rights), written at each start of the tray so that it follows the bundle when it moves;
macOS from the ``.app``'s Info.plist (``CFBundleURLTypes``, installer/moehome.spec),
and hands a clicked link to the running app as a file-open event, which
``InviteLinkFilter`` passes to the tray. Linux: app/desktop_entry.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QFileOpenEvent

log = logging.getLogger(__name__)

SCHEME: Final = "moehome"
CLASSES_KEY: Final = f"Software\\Classes\\{SCHEME}"


def windows_protocol_values(command: list[str], icon: Path) -> list[tuple[str, str, str]]:
    """(subkey of HKEY_CURRENT_USER, value name, text) that make Windows open
    ``moehome://`` links with ``command`` (the link appended as its last argument)."""
    if not command:
        raise ValueError("the command that opens invite links is empty")
    return [
        (CLASSES_KEY, "", "URL:moehome invite"),
        (CLASSES_KEY, "URL Protocol", ""),  # marks the key as a URL scheme
        (f"{CLASSES_KEY}\\DefaultIcon", "", str(icon)),
        (f"{CLASSES_KEY}\\shell\\open\\command", "", f'{subprocess.list2cmdline(command)} "%1"'),
    ]


def register_windows_protocol(command: list[str], icon: Path) -> None:
    """Write ``windows_protocol_values`` to the user's registry (Windows only)."""
    if sys.platform != "win32":
        raise RuntimeError("the registry exists only on Windows")
    import winreg

    for subkey, name, text in windows_protocol_values(command, icon):
        with winreg.CreateKey(winreg.HKEY_CURRENT_USER, subkey) as key:
            winreg.SetValueEx(key, name, 0, winreg.REG_SZ, text)
    log.info("moehome:// links open moehome (HKCU\\%s)", CLASSES_KEY)


class InviteLinkFilter(QObject):
    """Passes the ``moehome://`` links macOS opens the app with (a ``FileOpen`` event on
    the application) to ``handle``; other events go on as they were."""

    def __init__(self, handle: Callable[[str], None]) -> None:
        super().__init__()
        self._handle = handle

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.FileOpen and isinstance(event, QFileOpenEvent):
            url = event.url().toString()
            if url.startswith(f"{SCHEME}://"):
                self._handle(url)
                return True
        return super().eventFilter(watched, event)
