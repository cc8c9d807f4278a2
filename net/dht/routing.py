"""Kademlia routing table over 256-bit ids. Pure: no I/O, time passed in.

A peer's DHT id is SHA-256 of its PeerID bytes, so it is bound to its public key and
cannot be chosen freely (unlike hivemind's self-reported ids).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

P = TypeVar("P", bound=Hashable)

ID_BITS: Final = 256


def node_id_of(peer_bytes: bytes) -> int:
    return int.from_bytes(hashlib.sha256(peer_bytes).digest(), "big")


def key_id_of(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest(), "big")


@dataclass
class Contact(Generic[P]):
    peer: P
    node_id: int
    addrs: tuple[str, ...]
    last_seen: float = 0.0
    failures: int = 0


@dataclass
class _Bucket(Generic[P]):
    live: list[Contact[P]] = field(default_factory=list)  # least recently seen first
    replacements: list[Contact[P]] = field(default_factory=list)


class RoutingTable(Generic[P]):
    def __init__(self, self_id: int, k: int = 20, max_failures: int = 2) -> None:
        self.self_id = self_id
        self.k = k
        self.max_failures = max_failures
        self._buckets: list[_Bucket[P]] = [_Bucket() for _ in range(ID_BITS)]
        self._index: dict[P, Contact[P]] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, peer: P) -> bool:
        return peer in self._index

    def _bucket_of(self, node_id: int) -> _Bucket[P]:
        return self._buckets[max(0, (self.self_id ^ node_id).bit_length() - 1)]

    def get(self, peer: P) -> Contact[P] | None:
        return self._index.get(peer)

    def add(self, peer: P, node_id: int, addrs: Iterable[str], now: float) -> bool:
        """Record that ``peer`` answered or contacted us. Returns True if it is in the table.

        A full bucket keeps its old contacts (long-lived peers tend to stay, and this
        resists flooding with fresh identities); the newcomer waits as a replacement.
        """
        if node_id == self.self_id:
            return False
        addrs = tuple(addrs)
        bucket = self._bucket_of(node_id)
        existing = self._index.get(peer)
        if existing is not None:
            existing.last_seen = now
            existing.failures = 0
            if addrs:
                existing.addrs = addrs
            bucket.live.remove(existing)
            bucket.live.append(existing)
            return True
        contact = Contact(peer, node_id, addrs, now)
        if len(bucket.live) < self.k:
            bucket.live.append(contact)
            self._index[peer] = contact
            return True
        bucket.replacements = [c for c in bucket.replacements if c.peer != peer][-(self.k - 1) :]
        bucket.replacements.append(contact)
        return False

    def mark_failed(self, peer: P) -> None:
        """A query to ``peer`` failed; after ``max_failures`` in a row it is replaced."""
        contact = self._index.get(peer)
        if contact is None:
            return
        contact.failures += 1
        if contact.failures >= self.max_failures:
            self.remove(peer)

    def remove(self, peer: P) -> None:
        contact = self._index.pop(peer, None)
        if contact is None:
            return
        bucket = self._bucket_of(contact.node_id)
        bucket.live.remove(contact)
        if bucket.replacements:
            promoted = bucket.replacements.pop()
            bucket.live.append(promoted)
            self._index[promoted.peer] = promoted

    def closest(self, target: int, count: int, exclude: Iterable[P] = ()) -> list[Contact[P]]:
        excluded = set(exclude)
        candidates = [c for c in self._index.values() if c.peer not in excluded]
        candidates.sort(key=lambda c: c.node_id ^ target)
        return candidates[:count]

    def contacts(self) -> list[Contact[P]]:
        return list(self._index.values())

    def bucket_indices(self) -> list[int]:
        return [i for i, b in enumerate(self._buckets) if b.live]
