"""Volunteers pull new versions: an aggregator says which version of an expert is current
(a record in the DHT it signs, from a key the manifest lists, and the same record asked
of it directly: core/project/versions.py's VersionFinder), the weights' chunks are
fetched from it, checked against the record, and swapped in between batches."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from core.experts.backend import ExpertBackend
from core.experts.registry import build_expert
from core.experts.weights import WeightsError, load_weights_bytes
from core.project.chunks import ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.versions import VersionFinder, VersionRecord, fetch_version
from net import Peer

log = logging.getLogger(__name__)

#: how often an expected version (its round closed) is looked for until it comes
EXPECT_EVERY_S = 1.0


class WeightsPuller:
    def __init__(
        self,
        peer: Peer,
        project: str,
        backends: Mapping[str, ExpertBackend],
        aggregator_keys: Sequence[bytes],
        store: ChunkStore,
        device: trio.CapacityLimiter,
        *,
        before_swap: Callable[[str], Awaitable[None]] | None = None,
        after_swap: Callable[[str], Awaitable[None]] | None = None,
        interval: float = 10.0,
        assignment: Mapping[str, int] | None = None,
    ) -> None:
        """``aggregator_keys``: the manifest's, in its order; ``assignment``: its experts
        to aggregators (core/project/assignment.py), whom their versions are asked of."""
        from net.identity import peer_id_from_public_key

        self.peer = peer
        self.project = project
        self.backends = backends
        self.finder = VersionFinder(
            peer, project, [peer_id_from_public_key(k) for k in aggregator_keys], assignment
        )
        self.fetcher = WeightsFetcher(peer, store)
        self.device = device
        self.before_swap = before_swap  # e.g. send what was accumulated on the old version
        self.after_swap = after_swap  # e.g. declare the new version at once
        self.interval = interval
        self.swaps = 0
        #: set to look before the next interval (``nudge``, ``expect``)
        self._wake = trio.Event()
        #: experts to look for at once (``nudge``)
        self._nudged: set[str] = set()
        #: per expert whose new version is due (``expect``): (trio time) when to look
        #: next, and until when
        self._expected: dict[str, tuple[float, float]] = {}

    async def run(
        self, *, task_status: trio.TaskStatus[WeightsPuller] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Every ``interval`` look for new versions of every expert; between, of those
        nudged or expected."""
        task_status.started(self)
        next_all = trio.current_time()
        while True:
            now = trio.current_time()
            if now >= next_all:
                due = set(self.backends)
                next_all = now + self.interval
            else:
                due = self._nudged | {u for u, (at, _) in self._expected.items() if at <= now}
            self._nudged = set()
            await self._look([u for u in self.backends if u in due])
            with trio.move_on_at(min([next_all, *(at for at, _ in self._expected.values())])):
                await self._wake.wait()
            self._wake = trio.Event()

    def nudge(self, uid: str = "") -> None:
        """Look for a new version of ``uid`` (empty: of every expert) now rather than at
        the next interval (an aggregator refused a contribution as stale, or named a
        newer version: versions move faster than we pull them)."""
        self._nudged.update([uid] if uid else self.backends)
        self._wake.set()

    def expect(self, uid: str, at: float) -> None:
        """A new version of ``uid`` is due about ``at`` (trio time: its round closes
        then): look for it from then, every ``EXPECT_EVERY_S``, until it comes, for at
        most an interval (the regular look takes over)."""
        if uid in self.backends:
            self._expected[uid] = (at, at + self.interval)
            self._wake.set()  # to wake by then

    def _looked(self, uid: str, pulled: bool) -> None:
        """After a look at ``uid``: an expected version that came, or was looked for
        long enough, is expected no more; else it is looked for again in a second."""
        expected = self._expected.get(uid)
        now = trio.current_time()
        if expected is None or expected[0] > now:
            return  # not yet due: what this look found is an earlier round's
        if pulled or now + EXPECT_EVERY_S > expected[1]:
            del self._expected[uid]
        else:
            self._expected[uid] = (now + EXPECT_EVERY_S, expected[1])

    async def _look(self, uids: list[str]) -> None:
        """Pull the newer versions of ``uids`` there are (their records asked together)."""
        if not uids:
            return
        records = await self.finder.newest(uids)
        for uid in uids:
            pulled = False
            try:
                pulled = await self._pull(uid, records[uid])
            except FetchError as exc:
                log.info("could not pull a new version of %s: %s", uid, exc)
            self._looked(uid, pulled)

    async def newest(self, uid: str) -> VersionRecord | None:
        return (await self.finder.newest([uid]))[uid]

    async def check(self, uid: str) -> bool:
        """Pull and swap in a newer version of ``uid`` if there is one. True if it did."""
        return await self._pull(uid, await self.newest(uid))

    async def _pull(self, uid: str, record: VersionRecord | None) -> bool:
        backend = self.backends[uid]
        if record is None or record.version <= backend.version:
            return False
        blob = await fetch_version(self.fetcher, record)
        try:  # the hash is checked as the weights load, once
            module = await trio.to_thread.run_sync(_load, backend, blob, record.sha256)
        except WeightsError as exc:
            raise FetchError(f"version {record.version} of {uid}: {exc}") from exc
        async with self.device:  # between batches
            # flushed while holding the device: no backward pass can add gradients (and
            # receipts) of the old version between the flush and the swap
            if self.before_swap is not None:
                await self.before_swap(uid)
            backend.replace_weights(module, record.version, sha256=record.sha256)
        self.swaps += 1
        log.info("%s: now at version %d", uid, record.version)
        if self.after_swap is not None:
            await self.after_swap(uid)
        return True


def _load(backend: ExpertBackend, blob: bytes, sha256: str) -> Any:
    module = build_expert(backend.spec)
    load_weights_bytes(module, blob, expected_sha256=sha256)
    return module
