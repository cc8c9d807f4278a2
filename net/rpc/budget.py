"""A byte budget shared by strangers: a total, and a share per peer and per source
address that no one holder may pass. Pure bookkeeping, no I/O.

Peer ids cost nothing, addresses cost something: a crowd of identities from one address
shares that address's share, so it can never take the budget from peers elsewhere.
Holders are forgotten as soon as they hold nothing, so the bookkeeping is bounded by
what is held right now.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class BudgetLimits:
    total: int
    per_peer: int
    per_source: int


class SharedBudget(Generic[P]):
    def __init__(self, limits: BudgetLimits) -> None:
        self.limits = limits
        self.used = 0
        self._by_peer: Counter[P] = Counter()
        self._by_source: Counter[str] = Counter()

    def held_by(self, peer: P) -> int:
        return self._by_peer[peer]

    def held_from(self, source: str) -> int:
        return self._by_source[source]

    def fits(self, peer: P, source: str, nbytes: int) -> bool:
        """Whether ``nbytes`` more could be held by this peer from this source now."""
        lim = self.limits
        return (
            self.used + nbytes <= lim.total
            and self._by_peer[peer] + nbytes <= lim.per_peer
            and self._by_source[source] + nbytes <= lim.per_source
        )

    def could_ever_fit(self, nbytes: int) -> bool:
        """Whether one holder could hold ``nbytes`` even with the budget empty."""
        lim = self.limits
        return nbytes <= min(lim.total, lim.per_peer, lim.per_source)

    def try_reserve(self, peer: P, source: str, nbytes: int) -> bool:
        if not self.fits(peer, source, nbytes):
            return False
        self.used += nbytes
        self._by_peer[peer] += nbytes
        self._by_source[source] += nbytes
        return True

    def release(self, peer: P, source: str, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.used -= nbytes
        self._by_peer[peer] -= nbytes
        self._by_source[source] -= nbytes
        if self._by_peer[peer] <= 0:
            del self._by_peer[peer]
        if self._by_source[source] <= 0:
            del self._by_source[source]
