"""The published weights of experts' versions, fetched and kept for answer audits.

:class:`PublishedWeights` gives an auditor (core/moe/audit.py) the expert at the
version an answer names, so that the trainer can recompute the answer locally: the
owner's initial files (checked against the signed manifest's index) and the versions
the project's aggregators announce (checked against their signed records, remembered
by a watch), the most recently used kept within a memory budget. An expert larger than
that budget is never fetched (its answers go to other servers instead).
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Collection, Iterable

import torch
import trio
from torch import nn

from core.experts.registry import ExpertSpec, build_expert
from core.experts.weights import WeightsError, load_weights_bytes, weights_hash
from core.project.assignment import expert_assignment
from core.project.chunks import ChunkStore
from core.project.distribution import FetchError, WeightsFetcher
from core.project.signed import SignedManifest
from core.project.versions import VersionFinder, VersionRecord, fetch_version
from net import Peer
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)


class PublishedWeights:
    """The weights of experts' versions as the project published them: the owner's
    initial files (checked against the signed manifest's index) and the versions the
    project's aggregators announce (checked against their signed records), the most
    recently used kept up to ``max_bytes``.

    Answers name the version their volunteer serves, often one that is no longer the
    newest: ``watch`` reads the announced records of the watched experts every
    ``interval`` and remembers the last ``history`` of each, so that an older version's
    file can still be fetched (aggregators keep the chunks) when one of its answers is
    drawn. Only audited versions are downloaded. The watched experts are the
    ``max_watched`` most recently audited (at first, the manifest's first ones), asked of
    their aggregators together each ``interval`` (core/project/versions.py)."""

    def __init__(
        self,
        peer: Peer,
        signed: SignedManifest,
        store: ChunkStore,
        *,
        max_bytes: int = 256 * 2**20,
        aggregator_keys: Collection[bytes] | None = None,
        interval: float = 10.0,
        history: int = 8,
        max_watched: int = 256,
    ) -> None:
        self.peer = peer
        self.signed = signed
        self.spec: ExpertSpec = signed.manifest.model.expert_spec()
        keys = aggregator_keys
        if keys is None:
            keys = [bytes.fromhex(a.key) for a in signed.manifest.aggregators]
        self.finder = VersionFinder(
            peer,
            signed.project_id,
            [peer_id_from_public_key(k) for k in keys],
            expert_assignment(signed.manifest),
        )
        self.fetcher = WeightsFetcher(peer, store)
        self.max_bytes = max_bytes
        self.interval = interval
        self.history = history
        self.max_watched = max_watched
        self._cache: OrderedDict[tuple[str, int], tuple[nn.Module, int]] = OrderedDict()
        self._missing: set[tuple[str, int]] = set()
        #: per expert, the announced records seen, by version (the newest ``history``)
        self._records: dict[str, dict[int, VersionRecord]] = {}
        #: the experts whose records are read, most recently asked about last
        self._watched: OrderedDict[str, None] = OrderedDict()
        for uid in itertools.islice(signed.manifest.model.expert_uids(), max_watched):
            self._watch(uid)
        self._lock = trio.Lock()
        # an expert's size, without its memory (parameters on the meta device): one larger
        # than the budget is never fetched (its answers go to other servers instead)
        with torch.device("meta"):
            shapes = build_expert(self.spec).state_dict().values()
        self.expert_bytes = _nbytes(shapes)
        if self.expert_bytes > max_bytes:
            log.warning(
                "an expert's weights (%.1f MiB) exceed the audits' budget (%.1f MiB): "
                "answers are audited by other servers' recomputations",
                self.expert_bytes / 2**20,
                max_bytes / 2**20,
            )

    @property
    def cached_bytes(self) -> int:
        return sum(size for _, size in self._cache.values())

    def announced(self, uid: str) -> list[int]:
        """The versions of ``uid`` whose records were seen (and are remembered)."""
        return sorted(self._records.get(uid, {}))

    def _watch(self, uid: str) -> None:
        self._watched[uid] = None
        self._watched.move_to_end(uid)
        while len(self._watched) > self.max_watched:
            self._records.pop(self._watched.popitem(last=False)[0], None)

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._look(list(self._watched))
            await trio.sleep(self.interval)

    async def _look(self, uids: list[str]) -> dict[str, VersionRecord | None]:
        """The newest announced records of ``uids``, remembered with the last few."""
        records = await self.finder.newest(uids)
        for uid, record in records.items():
            if record is not None:
                seen = self._records.setdefault(uid, {})
                seen[record.version] = record
                for old in sorted(seen)[: -self.history]:
                    del seen[old]
        return records

    async def newest(self, uid: str) -> tuple[int, nn.Module]:
        """The newest announced version of ``uid`` and its weights (the owner's initial
        file when no aggregator announced one), checked as ``module``'s are; whatever
        the memory budget (export takes every expert, one at a time)."""
        record = (await self._look([uid]))[uid]
        if record is not None:
            blob = await fetch_version(self.fetcher, record)
            module, _ = await trio.to_thread.run_sync(self._load, blob)
            if weights_hash(module) != record.sha256:
                raise FetchError(
                    f"version {record.version} of {uid} has other weights than announced"
                )
            return record.version, module
        files = await self.fetcher.fetch(self.signed, [uid])
        module, initial = await trio.to_thread.run_sync(self._load, files[uid])
        return initial, module

    async def module(self, uid: str, version: int) -> nn.Module | None:
        if self.expert_bytes > self.max_bytes:
            return None
        key = (uid, version)
        self._watch(uid)
        async with self._lock:  # one fetch of a version, however many audits want it
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit[0]
            if key in self._missing:
                return None
            try:
                module, final = await self._fetch(uid, version)
            except (FetchError, WeightsError) as exc:
                log.info("weights of %s version %d for an audit: %s", uid, version, exc)
                module, final = None, False
            if module is None:
                if final:  # an old version is not announced again: no lookup per answer
                    self._missing.add(key)
                return None
            size = _nbytes(module.state_dict().values())
            self._cache[key] = (module, size)
            while self.cached_bytes > self.max_bytes and len(self._cache) > 1:
                self._cache.popitem(last=False)
            return module

    async def _fetch(self, uid: str, version: int) -> tuple[nn.Module | None, bool]:
        """The weights of ``version``, or None and whether they will never be had here
        (a version older than every record seen, other than the initial one)."""
        seen = self._records.get(uid, {})
        record = seen.get(version)
        if record is None and (not seen or version > max(seen)):
            newest = (await self._look([uid]))[uid]
            record = newest if newest is not None and newest.version == version else None
        if record is not None:
            blob = await fetch_version(self.fetcher, record)
            module, _ = await trio.to_thread.run_sync(self._load, blob)
            if weights_hash(module) != record.sha256:
                raise FetchError(f"version {version} of {uid} has other weights than announced")
            return module, True
        files = await self.fetcher.fetch(self.signed, [uid])
        module, initial = await trio.to_thread.run_sync(self._load, files[uid])
        if initial == version:
            return module, True
        seen = self._records.get(uid, {})
        return None, bool(seen) and version < max(seen)

    def _load(self, blob: bytes) -> tuple[nn.Module, int]:
        """The expert with these weights, and the version the file names."""
        module = build_expert(self.spec)
        info = load_weights_bytes(module, blob)
        module.requires_grad_(False)
        return module, info.version


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
