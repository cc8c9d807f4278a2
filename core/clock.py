"""One clock per engine: the aggregator's rounds and the trainer's loop read time through
a ``Clock`` they are given, so that tests drive them by moving a clock forward instead
of sleeping (tests/clocks.py ``ManualClock``)."""

from __future__ import annotations

import time
from typing import Final, Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back: for intervals."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch: for what other computers read (timestamps)."""
        ...


class SystemClock:
    """The computer's own clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


SYSTEM_CLOCK: Final = SystemClock()
