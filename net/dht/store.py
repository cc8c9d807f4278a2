"""The records a peer holds for others: bounded, expiring, newest-per-author. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from net.dht.records import SignedRecord


@dataclass(frozen=True)
class StoreLimits:
    max_keys: int = 100_000
    max_authors_per_key: int = 1024


class RecordStore:
    """key -> author -> newest record. Every method takes the current time explicitly."""

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self.limits = limits or StoreLimits()
        self._by_key: dict[str, dict[bytes, SignedRecord]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def put(self, record: SignedRecord, now_ms: int) -> bool:
        """Keep ``record`` if it is newer than what its author had here. The caller has
        validated it. False when it was not kept (older, or the store is full)."""
        authors = self._by_key.get(record.key)
        if authors is None:
            if len(self._by_key) >= self.limits.max_keys:
                self.sweep(now_ms)
                if len(self._by_key) >= self.limits.max_keys:
                    return False
            authors = self._by_key[record.key] = {}
        current = authors.get(record.author)
        if current is not None:
            if current.expires_ms > now_ms and not record.newer_than(current):
                return False
        elif len(authors) >= self.limits.max_authors_per_key:
            # full: make room only by dropping an expired or sooner-expiring record
            soonest = min(authors.values(), key=lambda r: r.expires_ms)
            if soonest.expires_ms > now_ms and soonest.expires_ms >= record.expires_ms:
                return False
            del authors[soonest.author]
        authors[record.author] = record
        return True

    def get(self, key: str, now_ms: int) -> list[SignedRecord]:
        """Live records under ``key``, newest first."""
        authors = self._by_key.get(key)
        if not authors:
            return []
        live = [r for r in authors.values() if r.expires_ms > now_ms]
        if len(live) != len(authors):
            self._drop_expired(key, now_ms)
        live.sort(key=lambda r: r.timestamp_ms, reverse=True)
        return live

    def sweep(self, now_ms: int) -> int:
        """Forget expired records; returns how many were dropped."""
        before = len(self)
        for key in list(self._by_key):
            self._drop_expired(key, now_ms)
        return before - len(self)

    def _drop_expired(self, key: str, now_ms: int) -> None:
        authors = self._by_key[key]
        for author in [a for a, r in authors.items() if r.expires_ms <= now_ms]:
            del authors[author]
        if not authors:
            del self._by_key[key]
