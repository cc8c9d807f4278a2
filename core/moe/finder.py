"""Finding live experts: DHT lookups with a cache, and beam search over the grid.

The beam search is Learning@home's: gating scores are split per grid dimension, and the
best ``k`` uids are built left to right, keeping at each level only prefixes that some
live server announced. It costs one DHT lookup per (level, prefix in the beam), and the
answers are cached for ``cache_ttl`` seconds.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import trio

from core.experts.records import SERVING, ExpertAnnouncement, PrefixAnnouncement, expert_key
from core.experts.uid import Grid
from core.moe import beams
from core.moe.beams import Routing
from core.moe.client import ExpertServerRef
from net import DhtError, DhtNode, PeerID, RecordRejected

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- pure beam search

Beam = tuple[str, float]  # (prefix or uid, score)


def advance_beams(
    beams: Sequence[Beam],
    scores: Sequence[float],
    alive: Mapping[str, frozenset[int]],
    k: int,
    *,
    last: bool,
) -> list[Beam]:
    """One level of beam search for one sample: extend every beam by each live next
    coordinate, keep the ``k`` best (ties broken by name, so results are reproducible)."""
    candidates: list[Beam] = []
    for prefix, score in beams:
        for coord in alive.get(prefix, frozenset()):
            if 0 <= coord < len(scores):
                name = f"{prefix}{coord}" if last else f"{prefix}{coord}."
                candidates.append((name, score + scores[coord]))
    candidates.sort(key=lambda b: (-b[1], b[0]))
    return candidates[:k]


@functools.lru_cache(maxsize=1 << 16)
def _name(grid: Grid, index: int, depth: int) -> str:
    """The name of the prefix of ``depth`` coordinates at flat ``index`` (row-major over
    the grid's first ``depth`` sizes): ``ffn.3.`` ; at the grid's depth, the uid."""
    coords = []
    for n in reversed(grid.shape[:depth]):
        index, c = divmod(index, n)
        coords.append(str(c))
    name = ".".join([grid.layer, *reversed(coords)])
    return name if depth == len(grid.shape) else name + "."


# ---------------------------------------------------------------- pure failure policy


@dataclass(frozen=True)
class Skip:
    """A server that failed a call is skipped until ``until``; ``backoff`` is how long
    that was (the next failure doubles it)."""

    until: float
    backoff: float


#: the longest a failing server is skipped
LONGEST_SKIP = 300.0


def skip_after_failure(skip: Skip | None, now: float, base: float) -> Skip:
    """How long to skip a server that just failed a call: ``base`` seconds the first
    time, twice as long after each failure that follows the end of a skip, at most
    LONGEST_SKIP. Failures during a skip are the same incident (the calls that were in
    flight when a connection was cut: a step sends one per expert) and change nothing:
    counting each as a new failure banned a volunteer behind a relay for 5 minutes the
    first time a relay ended its circuit (8 calls failed at once: 5 x 2^7 s)."""
    if skip is None:
        return Skip(now + base, base)
    if skip.until > now:
        return skip
    backoff = min(skip.backoff * 2, LONGEST_SKIP)
    return Skip(now + backoff, backoff)


# ---------------------------------------------------------------- DHT-backed finder


@dataclass
class _Cached:
    value: list[tuple[bytes, PeerID]]
    expires: float


@dataclass
class FinderStatistics:
    lookups: int = 0
    cache_hits: int = 0
    #: expired answers served while a fresh one was looked up behind them (keep_fresh)
    stale_hits: int = 0


@dataclass
class ExpertFinder:
    """Which experts of ``grid`` are alive, and who serves them."""

    dht: DhtNode
    project: str
    grid: Grid
    cache_ttl: float = 5.0
    #: with ``keep_fresh`` running, an answer up to this long past its ``cache_ttl`` is
    #: still served while a fresh one is looked up behind it
    stale_s: float = 60.0
    #: A server that failed a call is skipped for this long (doubling on repeat failures
    #: until it answers again: skip_after_failure).
    failure_backoff: float = 5.0
    stats: FinderStatistics = field(default_factory=FinderStatistics)
    _cache: dict[str, _Cached] = field(default_factory=dict)
    _skipped: dict[PeerID, Skip] = field(default_factory=dict)
    #: smoothed seconds per call of each server (slow links, busy GPUs)
    _latency: dict[PeerID, float] = field(default_factory=dict)
    #: servers not called (a failed audit), until when (trio's clock; inf: never
    #: again): their declarations are ignored
    excluded: dict[PeerID, float] = field(default_factory=dict)
    #: names to look up again behind the answers served (keep_fresh's queue)
    _refresh: trio.MemorySendChannel[str] | None = None
    _refreshing: set[str] = field(default_factory=set)

    def exclude(self, peer_id: PeerID, seconds: float = math.inf) -> None:
        """Do not call ``peer_id`` for ``seconds`` (never again by default), nor route to
        experts only it declares."""
        until = trio.current_time() + seconds
        self.excluded[peer_id] = max(until, self.excluded.get(peer_id, -math.inf))
        self._forget_author(peer_id)

    def is_excluded(self, peer_id: PeerID) -> bool:
        until = self.excluded.get(peer_id)
        return until is not None and until > trio.current_time()

    def report_failure(self, server: ExpertServerRef) -> None:
        """Called when a server failed a call: skip it for a while, and look again at
        once for whoever else serves what it declared (a volunteer that died is often
        replaced by one that joined since the lookups were cached)."""
        before = self._skipped.get(server.peer_id)
        after = skip_after_failure(before, trio.current_time(), self.failure_backoff)
        self._skipped[server.peer_id] = after
        if after is not before:  # a new incident, not the rest of the calls it cut
            self._forget_author(server.peer_id)

    def _forget_author(self, peer_id: PeerID) -> None:
        stale = [n for n, c in self._cache.items() if any(a == peer_id for _, a in c.value)]
        for name in stale:
            del self._cache[name]

    def report_latency(self, server: ExpertServerRef, seconds: float) -> None:
        """Called after every answered call: servers of an expert are then tried fastest
        first, so a trainer routes around slow links and busy volunteers."""
        old = self._latency.get(server.peer_id)
        self._latency[server.peer_id] = seconds if old is None else 0.7 * old + 0.3 * seconds
        # it answers: its next failure is a new first one
        self._skipped.pop(server.peer_id, None)

    def latency(self, peer_id: PeerID) -> float | None:
        return self._latency.get(peer_id)

    def _is_skipped(self, peer_id: PeerID) -> bool:
        skip = self._skipped.get(peer_id)
        return skip is not None and skip.until > trio.current_time()

    def forget(self) -> None:
        """Drop cached lookups (e.g. after many failures)."""
        self._cache.clear()

    async def _records(self, name: str) -> list[tuple[bytes, PeerID]]:
        """(value, author) of the live records under ``name``, cached for cache_ttl (and
        served up to stale_s longer while keep_fresh looks them up again)."""
        now = trio.current_time()
        hit = self._cache.get(name)
        if hit is not None and hit.expires > now:
            self.stats.cache_hits += 1
            return hit.value
        if hit is not None and self._refresh is not None and now < hit.expires + self.stale_s:
            if name not in self._refreshing:
                self._refreshing.add(name)
                self._refresh.send_nowait(name)  # unbounded: one per name at most
            self.stats.stale_hits += 1
            return hit.value
        return await self._look_up(name)

    async def _look_up(self, name: str) -> list[tuple[bytes, PeerID]]:
        self.stats.lookups += 1
        records = await self.dht.get(expert_key(self.project, name))
        values = [
            (r.value, r.author_peer_id) for r in records if not self.is_excluded(r.author_peer_id)
        ]
        self._cache[name] = _Cached(values, trio.current_time() + self.cache_ttl)
        return values

    async def keep_fresh(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Until cancelled: look up again, behind the answers served, the names whose
        cached answers expired, so that a trainer's batches do not wait for lookups they
        made before (behind 100 ms links, a layer's lookups took ~0.5 s of a batch: the
        emulated swarm, 32 volunteers). A name is looked up no more often than without
        it; an answer past stale_s, or forgotten (a failure), is waited for."""
        send, receive = trio.open_memory_channel[str](math.inf)
        self._refresh = send
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for name in receive:
                    nursery.start_soon(self._look_up_behind, name)
        finally:
            self._refresh = None
            self._refreshing.clear()

    async def _look_up_behind(self, name: str) -> None:
        try:
            await self._look_up(name)
        except DhtError as exc:  # a lookup that failed: the next use waits for one
            log.info("could not look up %s again: %s", name, exc)
            self._cache.pop(name, None)
        finally:
            self._refreshing.discard(name)

    async def alive_next(self, prefix: str) -> frozenset[int]:
        """Coordinates that follow ``prefix`` in some live server's declaration."""
        coords: set[int] = set()
        for value, _author in await self._records(prefix):
            try:
                coords.update(PrefixAnnouncement.decode(value).next_coords)
            except RecordRejected:
                continue  # validated on the way in; a newer schema is skipped
        return frozenset(coords)

    async def servers(self, uid: str) -> list[ExpertServerRef]:
        """Live servers of ``uid`` in the order to try them (:func:`rank_servers`)."""
        out = []
        for value, author in await self._records(uid):
            try:
                ann = ExpertAnnouncement.decode(value)
            except RecordRejected:
                continue
            if ann.state == SERVING and ann.uid == uid and not self._is_skipped(author):
                out.append(ExpertServerRef(author, ann.sha256, ann.version, ann.load))
        host = getattr(self.dht, "host", None)
        relayed = {s.peer_id for s in out if host is not None and host.relayed_only(s.peer_id)}
        return rank_servers(out, self._latency, relayed)

    async def route(self, per_dim: Sequence[torch.Tensor], k: int) -> Routing:
        """The best ``k`` live experts of every sample, on the scores' device:
        ``per_dim[d]`` [B, n_d] holds the samples' gating scores over grid dimension d.
        Between dimensions, the prefixes in the beams are looked up (cached)."""
        device = per_dim[0].device
        prefix, score = beams.start(per_dim[0].shape[0], device)
        for d, scores in enumerate(per_dim):
            alive = await self._level_alive(prefix, score, d)
            prefix, score = beams.step(prefix, score, scores, alive, k, self.grid.shape[:d])
        return beams.finish(prefix, score)

    async def beam_search(
        self, scores: Sequence[Sequence[Sequence[float]]], k: int
    ) -> list[list[str]]:
        """``route`` with scores and results as lists: ``scores[d][b]`` holds sample b's
        gating scores over grid dimension d; the best ``k`` live uids of each sample."""
        routing = await self.route([torch.tensor(s, dtype=torch.float64) for s in scores], k)
        experts, valid = routing.experts.tolist(), routing.valid.tolist()
        return [
            [self.uid_name(e) for e, ok in zip(row, ok_row, strict=True) if ok]
            for row, ok_row in zip(experts, valid, strict=True)
        ]

    def uid_name(self, expert: int) -> str:
        """The uid of the expert at flat index ``expert`` (the grid's row-major order)."""
        return _name(self.grid, expert, len(self.grid.shape))

    async def _level_alive(
        self, prefix: torch.Tensor, score: torch.Tensor, depth: int
    ) -> beams.LevelAlive:
        """The live next coordinates of every prefix in the beams (one lookup each)."""
        count = math.prod(self.grid.shape[:depth])
        keys = beams.live_prefixes(prefix, score, count).cpu()
        names = [_name(self.grid, i, depth) for i in keys.tolist()]
        alive = await self._alive_many(names)
        table = beams.alive_table([alive[name] for name in names], self.grid.shape[depth])
        return beams.LevelAlive(keys.to(prefix.device), table.to(prefix.device))

    async def _alive_many(self, prefixes: Sequence[str]) -> dict[str, frozenset[int]]:
        out: dict[str, frozenset[int]] = {}

        async def one(prefix: str) -> None:
            out[prefix] = await self.alive_next(prefix)

        async with trio.open_nursery() as nursery:
            for prefix in prefixes:
                nursery.start_soon(one, prefix)
        return out

    async def servers_many(self, uids: Sequence[str]) -> dict[str, list[ExpertServerRef]]:
        out: dict[str, list[ExpertServerRef]] = {}

        async def one(uid: str) -> None:
            out[uid] = await self.servers(uid)

        async with trio.open_nursery() as nursery:
            for uid in set(uids):
                nursery.start_soon(one, uid)
        return out


def rank_servers(
    servers: Sequence[ExpertServerRef],
    latency: Mapping[PeerID, float],
    relayed: Collection[PeerID] = (),
) -> list[ExpertServerRef]:
    """Servers in the order to try them: those we reach directly before those we reach
    only through a relay (a relay bounds bytes and adds a hop), then fastest first
    (servers not called yet count as fast, so each gets tried), then least loaded, then
    at random. Equally good servers in random order: calls (and so the gradients each
    volunteer contributes) spread over them, which gives the aggregator's robust rules
    several inputs per expert to compare."""
    return sorted(
        servers,
        key=lambda s: (
            s.peer_id in relayed,
            _speed_class(latency.get(s.peer_id)),
            round(s.load, 1),
            random.random(),
        ),
    )


def _speed_class(seconds: float | None) -> int:
    """Latencies in coarse classes (doubling from 10 ms), so that noise between similar
    servers leaves the choice to load."""
    if seconds is None or seconds <= 0.01:
        return 0
    return int(math.log2(seconds / 0.01)) + 1
