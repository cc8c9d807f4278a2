"""Fakes the GUI tests share, behind the interfaces of the real parts."""

from __future__ import annotations


class NoAutostart:
    """Start at login, kept in memory instead of the desktop's autostart entries."""

    def __init__(self) -> None:
        self.on = False

    def enabled(self) -> bool:
        return self.on

    def enable(self, command: list[str]) -> None:
        self.on = True

    def disable(self) -> None:
        self.on = False
