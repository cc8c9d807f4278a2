"""The node owns the volunteer's preferences: one store, read by the governor and the
control API, saved on every change, with listeners told of each change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.control.preferences import Preferences, load_preferences, save_preferences


class PreferenceStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._current = load_preferences(path)  # PreferencesError names what is wrong
        self._listeners: list[Callable[[Preferences], None]] = []

    @property
    def current(self) -> Preferences:
        return self._current

    def subscribe(self, listener: Callable[[Preferences], None]) -> None:
        """Call ``listener`` with the new preferences after each change."""
        self._listeners.append(listener)

    def update(self, changes: dict[str, Any]) -> Preferences:
        """Apply ``changes`` (validated as a whole: PreferencesError names the field),
        save, then tell the listeners."""
        prefs = self._current.updated(changes)
        save_preferences(prefs, self.path)
        self._current = prefs
        for listener in self._listeners:
            listener(prefs)
        return prefs
