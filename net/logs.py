"""Logging that a stranger cannot turn into a flood: a hostile peer decides how often a
refusal happens, so lines about refusals are limited per kind and interval (and the
rest counted). The volunteer's disk and terminal are not the attacker's to fill."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class ThrottledLog:
    """At most ``burst`` records per key in any ``interval`` seconds; when a key's
    interval ends, one line says how many were left out."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        interval: float = 60.0,
        max_keys: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst, self._interval, self._max_keys = burst, interval, max_keys
        self._clock = clock
        # key -> [window start, records logged in it, records left out]
        self._windows: OrderedDict[str, list[float]] = OrderedDict()
        self.suppressed = 0

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = self._clock()
        window = self._windows.pop(key, None)
        if window is None or now - window[0] >= self._interval:
            if window is not None and window[2]:
                self._logger.log(
                    level,
                    "%d more like this in the last %.0f s: %s",
                    window[2],
                    self._interval,
                    key,
                )
            window = [now, 0, 0]
        self._windows[key] = window
        while len(self._windows) > self._max_keys:
            self._windows.popitem(last=False)
        if window[1] < self._burst:
            window[1] += 1
            self._logger.log(level, msg, *args, exc_info=exc_info)
        else:
            window[2] += 1
            self.suppressed += 1
