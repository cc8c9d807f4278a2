"""Probes whose readings a test sets: a user who becomes active, a GPU that heats up."""

from __future__ import annotations

from dataclasses import replace

from core.node.probes.base import Reading


class FakeProbes:
    def __init__(self, reading: Reading | None = None) -> None:
        self.reading = reading or Reading(idle_seconds=3600.0, gpu_temp_c=50.0, on_battery=False)
        self.reads = 0

    def set(self, **changes: object) -> None:
        self.reading = replace(self.reading, **changes)  # type: ignore[arg-type]

    def read(self) -> Reading:
        self.reads += 1
        return self.reading
