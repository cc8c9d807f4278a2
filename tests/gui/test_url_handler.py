"""moehome:// links where there is no desktop entry: the Windows registry values, and the
file-open event macOS sends the running app (delivered here as Qt delivers it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QFileOpenEvent
from PySide6.QtWidgets import QApplication

from app.url_handler import CLASSES_KEY, InviteLinkFilter, windows_protocol_values

LINK = "moehome://join/0123456789abcdef0123456789abcdef?peer=/ip4/198.18.0.7/tcp/4001"


def test_windows_learns_the_scheme_from_the_users_classes():
    values = windows_protocol_values(
        ["C:\\Program Files\\moehome\\moehome-tray.exe"], Path("C:/moehome/moehome.ico")
    )
    assert (CLASSES_KEY, "URL Protocol", "") in values
    assert (CLASSES_KEY, "", "URL:moehome invite") in values
    command = {(k, n): t for k, n, t in values}[(f"{CLASSES_KEY}\\shell\\open\\command", "")]
    # the path with a space is quoted, and the link comes last, quoted too
    assert command == '"C:\\Program Files\\moehome\\moehome-tray.exe" "%1"'
    with pytest.raises(ValueError, match="empty"):
        windows_protocol_values([], Path("x.ico"))


def test_a_link_macos_opens_the_app_with_reaches_the_tray(qapp: QApplication):
    opened: list[str] = []
    link_filter = InviteLinkFilter(opened.append)
    qapp.installEventFilter(link_filter)
    try:
        QApplication.sendEvent(qapp, QFileOpenEvent(QUrl(LINK)))
        QApplication.sendEvent(qapp, QFileOpenEvent(QUrl.fromLocalFile("/tmp/notes.txt")))
    finally:
        qapp.removeEventFilter(link_filter)
    assert opened == [LINK]  # a file is none of ours
