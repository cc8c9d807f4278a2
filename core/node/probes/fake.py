"""Probes whose readings a test sets: a user who becomes active, a GPU that heats up."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

from core.node.probes.base import Reading


class FakeProbes:
    #: readings come from memory: the governor reads them inline, not on a worker
    #: thread (a hop per look cost 10-25 ms under the tests' mock clock)
    reads_in_memory = True

    def __init__(self, reading: Reading | None = None) -> None:
        self.reading = reading or Reading(idle_seconds=3600.0, gpu_temp_c=50.0, on_battery=False)
        self.reads = 0

    def set(self, **changes: object) -> None:
        self.reading = replace(self.reading, **changes)  # type: ignore[arg-type]

    def read(self) -> Reading:
        self.reads += 1
        return self.reading


class FileProbes:
    """Readings from a JSON file another process writes (the tray's and the CLI's tests
    drive a real node process this way): {"idle_seconds": 5, "gpu_temp_c": 85, ...}.
    Fields not in the file keep FakeProbes' defaults; an unreadable file changes nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fake = FakeProbes()

    def read(self) -> Reading:
        try:
            data = json.loads(self.path.read_text())
            fields = {f.name for f in dataclasses.fields(Reading)}
            changes = {k: v for k, v in data.items() if k in fields}
            if "processes" in changes:
                changes["processes"] = frozenset(changes["processes"])
            return replace(FakeProbes().reading, **changes)
        except (OSError, ValueError, TypeError, AttributeError):
            return self.fake.read()
