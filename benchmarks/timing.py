"""Timing shared by benchmarks/expert_rpc.py and benchmarks/hivemind_compare.py, so both
sides of the comparison are measured the same way. Imports nothing heavy: the hivemind
side must not load libp2p (both define the protobuf package crypto.pb)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def samples_per_s(fn: Callable[[], Any], batch: int, seconds: float, min_reps: int) -> float:
    """Warm up once, then repeat for at least ``seconds`` and ``min_reps`` calls."""
    fn()
    reps, t0 = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < seconds:
        fn()
        reps += 1
    return batch * reps / (time.perf_counter() - t0)


def latency_ms_median(fn: Callable[[], Any], calls: int) -> float:
    """Median milliseconds of ``calls`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)
