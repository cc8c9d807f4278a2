"""What the node knows of its device and its network: the benchmark (cached; measured
again on request, with progress as events) and the median round trip to a few peers."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import trio

from core.control.models import BenchmarkEvent
from core.node.bench import cached_benchmark, network_rtt_ms
from core.node.events import EventLog
from net import Peer

log = logging.getLogger(__name__)


class DeviceFigures:
    def __init__(self, cache: Path, events: EventLog, *, quick: bool = False) -> None:
        self.cache = cache
        self.events = events
        #: Also when asked to measure again (tests; the full run takes ~10 s on a CPU).
        self.quick = quick
        self.benchmark: dict[str, Any] = {}
        self.rtt_ms: float | None = None
        self._measuring = False

    def measure(self, nursery: trio.Nursery, *, force: bool = False) -> None:
        """Measure in the background (cached unless ``force``); progress as events. A
        measurement already under way is not doubled."""
        if self._measuring:
            return
        self._measuring = True
        nursery.start_soon(partial(self._benchmark, force=force))

    async def _benchmark(self, force: bool) -> None:
        token = trio.lowlevel.current_trio_token()

        def progress(what: str, done: int, total: int) -> None:  # from the worker thread
            event = BenchmarkEvent(what=what, done=done, total=total)
            token.run_sync_soon(self.events.publish, event)

        try:
            self.benchmark = await trio.to_thread.run_sync(
                partial(
                    cached_benchmark,
                    self.cache,
                    force=force,
                    quick=self.quick or not force,
                    progress=progress,
                )
            )
        finally:
            self._measuring = False
        self.events.publish(BenchmarkEvent(what="done", done=1, total=1, figures=self.benchmark))

    async def watch_network(self, peer: Peer, every: float = 60.0) -> None:
        """Median round trip to up to five known peers (for the status), every minute
        (every 5 s until some peer answers)."""
        while True:
            figures = await network_rtt_ms(peer, rounds=1)
            self.rtt_ms = figures["network_rtt_ms_median"]
            await trio.sleep(every if self.rtt_ms is not None else 5.0)
