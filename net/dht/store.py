"""The records a peer holds for others: bounded, expiring, newest-per-author, shared
fairly between the addresses that sent them. Pure.

A stranger can sign records with as many fresh identities as it likes, so the limits
that matter are keyed by the *source* that sent a record (the sender's address, see
:func:`net.transport.admission.source_of`), not by its author:

* every record has a weight (its bytes plus what Python spends on it); the store holds
  at most ``max_weight``, each source at most ``source_share`` of it, each author at most
  ``max_author_weight``, each namespace at most its share (noise in an open namespace
  cannot push out expert announcements, manifests or versions);
* under one key at most ``max_authors_per_key`` authors, and ``max_authors_per_source``
  of them sent from one source;
* when something is full, the record that goes is the *oldest* one of the source that
  holds the *most* there. Expiry times play no part (eviction by soonest expiry rewarded
  long lifetimes: a crowd of long-lived records pushed out an honest announcement), and
  a source holding less than the heaviest is never the one to lose a record;
* ``get`` answers source by source in turn, so a crowd from one source cannot fill an
  answer either.
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from net.dht.records import KEY_PREFIX, SignedRecord

#: What a record costs in memory beyond its key and value (Python objects, signature).
RECORD_OVERHEAD: int = 600
#: The source of records this peer put itself.
LOCAL: str = "local"

_Entry = tuple[str, bytes]  # (key, author)


@dataclass(frozen=True)
class StoreLimits:
    max_weight: int = 64 * 1024 * 1024
    #: Share of max_weight one source may hold.
    source_share: float = 1 / 8
    max_author_weight: int = 4 * 1024 * 1024
    max_authors_per_key: int = 1024
    max_authors_per_source: int = 64


@dataclass
class StoreStatistics:
    stored: int = 0
    evicted: Counter[str] = field(default_factory=Counter)  # by the limit that was full


@dataclass
class _Held:
    record: SignedRecord
    source: str
    namespace: str
    weight: int
    seq: int


def record_weight(record: SignedRecord) -> int:
    return len(record.key) + len(record.value) + RECORD_OVERHEAD


T = TypeVar("T")


def _take(counter: Counter[T], name: T, amount: int) -> None:
    counter[name] -= amount
    if counter[name] <= 0:
        del counter[name]


def _namespace(key: str) -> str:
    return key[len(KEY_PREFIX) :].split("/", 1)[0]


class RecordStore:
    """key -> author -> newest record. Every method takes the current time explicitly.

    ``namespace_share(namespace)`` is the share of max_weight a namespace may use
    (validated records only reach the store, so the namespace is a known one)."""

    def __init__(
        self,
        limits: StoreLimits | None = None,
        namespace_share: Callable[[str], float] = lambda namespace: 1.0,
    ) -> None:
        self.limits = limits or StoreLimits()
        self._namespace_share = namespace_share
        self._by_key: dict[str, dict[bytes, _Held]] = {}
        # arrival order per (namespace, source) and per author, for eviction
        self._order: dict[tuple[str, str], OrderedDict[_Entry, None]] = {}
        self._by_author: dict[bytes, OrderedDict[str, None]] = {}
        self._weight = 0
        self._source_weight: Counter[str] = Counter()
        self._namespace_weight: Counter[str] = Counter()
        self._pair_weight: Counter[tuple[str, str]] = Counter()
        self._author_weight: Counter[bytes] = Counter()
        self._seq = itertools.count()
        self.stats = StoreStatistics()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    @property
    def weight(self) -> int:
        return self._weight

    def weight_from(self, source: str) -> int:
        return self._source_weight[source]

    # ------------------------------------------------------------ put

    def put(self, record: SignedRecord, now_ms: int, source: str = LOCAL) -> bool:
        """Keep ``record`` if it is newer than what its author had here. The caller has
        validated it. False when it was not kept (older, or its source, author or
        namespace is over its share and this is what had to go)."""
        authors = self._by_key.get(record.key)
        current = authors.get(record.author) if authors else None
        if (
            current is not None
            and current.record.expires_ms > now_ms
            and not record.newer_than(current.record)
        ):
            return False
        if current is not None:
            self._remove(record.key, record.author, None)
        held = _Held(record, source, _namespace(record.key), record_weight(record), next(self._seq))
        self._add(held)
        self._trim(held)
        kept = self._holds(held)
        if kept:
            self.stats.stored += 1
        return kept

    def _holds(self, held: _Held) -> bool:
        authors = self._by_key.get(held.record.key)
        return authors is not None and authors.get(held.record.author) is held

    def _add(self, held: _Held) -> None:
        r = held.record
        self._by_key.setdefault(r.key, {})[r.author] = held
        pair = (held.namespace, held.source)
        self._order.setdefault(pair, OrderedDict())[(r.key, r.author)] = None
        self._by_author.setdefault(r.author, OrderedDict())[r.key] = None
        self._weight += held.weight
        self._source_weight[held.source] += held.weight
        self._namespace_weight[held.namespace] += held.weight
        self._pair_weight[pair] += held.weight
        self._author_weight[r.author] += held.weight

    def _remove(self, key: str, author: bytes, reason: str | None) -> None:
        authors = self._by_key[key]
        held = authors.pop(author)
        if not authors:
            del self._by_key[key]
        pair = (held.namespace, held.source)
        order = self._order[pair]
        del order[(key, author)]
        if not order:
            del self._order[pair]
        keys = self._by_author[author]
        del keys[key]
        if not keys:
            del self._by_author[author]
        self._weight -= held.weight
        _take(self._source_weight, held.source, held.weight)
        _take(self._namespace_weight, held.namespace, held.weight)
        _take(self._pair_weight, pair, held.weight)
        _take(self._author_weight, author, held.weight)
        if reason is not None:
            self.stats.evicted[reason] += 1

    # ------------------------------------------------------------ limits

    def _trim(self, new: _Held) -> None:
        """Evict until every limit holds again, in order from the narrowest."""
        lim = self.limits
        key, author, source, ns = new.record.key, new.record.author, new.source, new.namespace
        # under the key: first the sending source's own share of authors, then all
        while self._key_count(key, source) > lim.max_authors_per_source:
            self._evict_oldest_in_key(key, source, "key_source")
        while len(self._by_key.get(key, ())) > lim.max_authors_per_key:
            heaviest = Counter(h.source for h in self._by_key[key].values()).most_common(1)
            self._evict_oldest_in_key(key, heaviest[0][0], "key")
        while self._author_weight[author] > lim.max_author_weight:
            oldest_key = next(iter(self._by_author[author]))
            self._remove(oldest_key, author, "author")
        source_cap = lim.source_share * lim.max_weight
        while self._source_weight[source] > source_cap and source != LOCAL:
            self._evict_oldest_of(source, None, "source")
        namespace_cap = self._namespace_share(ns) * lim.max_weight
        while self._namespace_weight[ns] > namespace_cap:
            heaviest_pair = max(
                (p for p in self._pair_weight if p[0] == ns), key=self._pair_weight.__getitem__
            )
            self._evict_oldest_of(heaviest_pair[1], ns, "namespace")
        while self._weight > lim.max_weight:
            heaviest_source = max(self._source_weight, key=self._source_weight.__getitem__)
            self._evict_oldest_of(heaviest_source, None, "full")

    def _key_count(self, key: str, source: str) -> int:
        return sum(1 for h in self._by_key.get(key, {}).values() if h.source == source)

    def _evict_oldest_in_key(self, key: str, source: str, reason: str) -> None:
        oldest = min(
            (h for h in self._by_key[key].values() if h.source == source), key=lambda h: h.seq
        )
        self._remove(key, oldest.record.author, reason)

    def _evict_oldest_of(self, source: str, namespace: str | None, reason: str) -> None:
        """The oldest record ``source`` sent (in ``namespace``, or in any)."""
        candidates = [
            order
            for (ns, src), order in self._order.items()
            if src == source and (namespace is None or ns == namespace)
        ]
        oldest: _Entry | None = None
        oldest_seq = -1
        for order in candidates:
            entry = next(iter(order))
            seq = self._by_key[entry[0]][entry[1]].seq
            if oldest is None or seq < oldest_seq:
                oldest, oldest_seq = entry, seq
        assert oldest is not None
        self._remove(oldest[0], oldest[1], reason)

    # ------------------------------------------------------------ reading

    def get(self, key: str, now_ms: int, limit: int | None = None) -> list[SignedRecord]:
        """Live records under ``key``: newest first within each source, sources taken in
        turn (so every source is heard before any is heard twice), at most ``limit``."""
        authors = self._by_key.get(key)
        if not authors:
            return []
        if any(h.record.expires_ms <= now_ms for h in authors.values()):
            self._drop_expired(key, now_ms)
            authors = self._by_key.get(key, {})
        per_source: dict[str, list[SignedRecord]] = {}
        for held in authors.values():
            per_source.setdefault(held.source, []).append(held.record)
        queues = [
            sorted(records, key=lambda r: r.timestamp_ms, reverse=True)
            for _, records in sorted(per_source.items())
        ]
        out: list[SignedRecord] = []
        for round_ in itertools.zip_longest(*queues):
            out.extend(r for r in round_ if r is not None)
        return out if limit is None else out[:limit]

    def sweep(self, now_ms: int) -> int:
        """Forget expired records; returns how many were dropped."""
        before = len(self)
        for key in list(self._by_key):
            self._drop_expired(key, now_ms)
        return before - len(self)

    def _drop_expired(self, key: str, now_ms: int) -> None:
        for author, held in list(self._by_key.get(key, {}).items()):
            if held.record.expires_ms <= now_ms:
                self._remove(key, author, None)
