"""An expert server's declarations in the DHT: one record per expert (serving or
withdrawn, its version, hash and load) and one per grid prefix (which coordinates follow
it), put again every round and withdrawn when the server pauses or stops."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from core.experts.backend import ExpertBackend
from core.experts.records import (
    SERVING,
    WITHDRAWN,
    ExpertAnnouncement,
    PrefixAnnouncement,
    expert_key,
    prefix_children,
)
from net import DhtError, DhtNode

log = logging.getLogger(__name__)

#: Declarations (DHT puts) in flight at once.
DECLARE_AT_ONCE = 4


class Announcer:
    """Declares ``backends`` under ``project`` in ``dht``; ``withdrawn()`` says whether
    the server is paused (its records then say so), ``load(uid)`` what it has queued."""

    def __init__(
        self,
        dht: DhtNode,
        project: str,
        backends: Mapping[str, ExpertBackend],
        *,
        ttl: float,
        interval: float,
        max_batch_size: int,
        withdrawn: Callable[[], bool],
        load: Callable[[str], float],
    ) -> None:
        self.dht, self.project, self.backends = dht, project, backends
        self.ttl, self.interval, self.max_batch_size = ttl, interval, max_batch_size
        self._withdrawn, self._load = withdrawn, load
        # One announcement at a time: a withdrawal must not be overtaken by the records
        # of an announcement that started before it (newest record wins in the DHT).
        self._lock = trio.Lock()

    async def run(self) -> None:
        """Declare again every ``interval`` seconds (the first declaration is the
        server's own, before it says it started)."""
        while True:
            await trio.sleep(self.interval)
            await self.announce()

    async def announce(self, only: list[str] | None = None) -> None:
        """Declare the current state: every expert, or only those of ``only``."""
        async with self._lock:
            await self._put(withdraw=self._withdrawn(), only=only)

    async def withdraw(self) -> None:
        """Withdraw every declaration (the server stops)."""
        await self._put(withdraw=True)

    async def _put(self, *, withdraw: bool, only: list[str] | None = None) -> None:
        """Put (or withdraw) every declaration: one record per expert, one per prefix
        (``only``: just these experts' records). Withdrawing puts newer records saying
        so, which replace ours everywhere."""
        puts: list[tuple[str, bytes]] = []
        for uid, backend in self.backends.items():
            if only is not None and uid not in only:
                continue
            ann = ExpertAnnouncement(
                uid,
                WITHDRAWN if withdraw else SERVING,
                backend.version,
                backend.sha256,
                0.0 if withdraw else self._load(uid),
                self.max_batch_size,
            )
            puts.append((expert_key(self.project, uid), ann.encode()))
        for prefix, coords in prefix_children(list(self.backends) if only is None else []).items():
            puts.append(
                (
                    expert_key(self.project, prefix),
                    PrefixAnnouncement(() if withdraw else tuple(coords)).encode(),
                )
            )

        failed: list[str] = []
        # a few at a time: 32 experts and their prefixes at once were ~200 DHT queries
        # in flight, which on a busy computer timed out (an owner's first project: a
        # third of the declarations failed, and the trainer lost sight of experts)
        limiter = trio.CapacityLimiter(DECLARE_AT_ONCE)

        async def put(key: str, value: bytes) -> None:
            async with limiter:
                try:
                    await self.dht.put(key, value, ttl=self.ttl)
                except DhtError as exc:
                    failed.append(f"{key.rsplit('/', 1)[-1]}: {exc}")

        async with trio.open_nursery() as nursery:
            for key, value in puts:
                nursery.start_soon(put, key, value)
        if failed:  # one line a round, not one per record
            log.warning(
                "could not declare %d of %d records (%s)", len(failed), len(puts), failed[0]
            )
