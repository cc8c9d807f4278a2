"""A clock that tests move by hand (core/clock.py): an engine given one never waits for
real seconds, and a test says exactly how much time passed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ManualClock:
    now: float = 1_000.0
    #: the wall clock's reading at monotonic 0 (by default the computer's, less ``now``:
    #: timestamps signed with the real time still pass the engines' clock checks)
    epoch: float = field(default_factory=lambda: time.time() - 1_000.0)

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.epoch + self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds
