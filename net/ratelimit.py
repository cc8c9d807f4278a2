"""Per-peer admission policy for inbound requests: pure, driven by an explicit clock."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar


@dataclass
class TokenBucket:
    """Classic token bucket: ``rate`` tokens per second, holding at most ``burst``."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def try_take(self, amount: float, now: float) -> bool:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = now
        if amount <= self.tokens:
            self.tokens -= amount
            return True
        return False


class Admission(Enum):
    ADMIT = "admit"
    TOO_MANY_REQUESTS = "too_many_requests"
    TOO_MANY_BYTES = "too_many_bytes"


@dataclass(frozen=True)
class RateLimits:
    requests_per_second: float = 1000.0
    request_burst: float = 2000.0
    bytes_per_second: float = 1024.0 * 1024 * 1024
    #: At least one maximal message must fit in a full bucket.
    byte_burst: float = 2.0 * 1024 * 1024 * 1024
    #: Peers remembered at once; the least recently seen are forgotten (with full buckets).
    max_peers: int = 10_000


K = TypeVar("K")


class PeerRateLimiter(Generic[K]):
    """Token buckets for requests and bytes, one pair per peer, with bounded memory."""

    def __init__(self, limits: RateLimits) -> None:
        self._limits = limits
        self._buckets: OrderedDict[K, tuple[TokenBucket, TokenBucket]] = OrderedDict()

    def exhausted(self, peer: K, now: float) -> bool:
        """Whether ``peer`` has less than one request token left (takes none)."""
        pair = self._buckets.get(peer)
        if pair is None:
            return False
        bucket = pair[0]
        return not bucket.try_take(0.0, now) or bucket.tokens < 1.0

    def admit(self, peer: K, nbytes: int, now: float, requests: float = 1.0) -> Admission:
        """Take ``requests`` request tokens and ``nbytes`` byte tokens from ``peer``'s
        buckets (records in a batch count as requests of their own, for instance)."""
        pair = self._buckets.pop(peer, None)
        if pair is None:
            lim = self._limits
            pair = (
                TokenBucket.full(lim.requests_per_second, lim.request_burst, now),
                TokenBucket.full(lim.bytes_per_second, lim.byte_burst, now),
            )
        self._buckets[peer] = pair  # most recently seen last
        while len(self._buckets) > self._limits.max_peers:
            self._buckets.popitem(last=False)
        request_bucket, volume = pair
        if not request_bucket.try_take(requests, now):
            return Admission.TOO_MANY_REQUESTS
        if not volume.try_take(float(nbytes), now):
            return Admission.TOO_MANY_BYTES
        return Admission.ADMIT


class FairRate:
    """One rate shared fairly between sources (max-min): each source that spent within
    ``active_s`` gets an equal share, and a bucket of a second of it. A source alone
    gets the whole rate; a newcomer's bucket starts full, so its first bytes pass at
    once whoever else is busy (one bucket for everyone let a hog drain what an honest
    caller's first megabyte needed: 21 MB/s fell to 0.11 MB/s). Pure: the caller passes
    the clock."""

    def __init__(
        self, rate: float, *, min_burst: float = 0.0, active_s: float = 2.0, max_sources: int = 1024
    ) -> None:
        self.rate = rate
        self.min_burst = min_burst
        self.active_s = active_s
        self.max_sources = max_sources
        # source -> [tokens, updated, last spent]; least recently used first
        self._sources: OrderedDict[str, list[float]] = OrderedDict()

    def share(self, source: str, now: float) -> float:
        """The rate ``source`` gets now (counting it as active)."""
        since = now - self.active_s
        others = sum(
            1 for s, (_, _, spent) in self._sources.items() if s != source and spent > since
        )
        return self.rate / (1 + others)

    def _bucket(self, source: str, now: float) -> tuple[list[float], float]:
        share = self.share(source, now)
        burst = max(share, self.min_burst)
        state = self._sources.pop(source, None)
        if state is None:
            state = [burst, now, -math.inf]  # a newcomer: full
        else:
            state[0] = min(burst, state[0] + max(0.0, now - state[1]) * share)
            state[1] = now
        self._sources[source] = state
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        return state, share

    def try_take(self, source: str, amount: float, now: float) -> bool:
        state, _ = self._bucket(source, now)
        if amount <= state[0]:
            state[0] -= amount
            state[2] = now
            return True
        return False

    def wait_s(self, source: str, amount: float, now: float) -> float:
        """How long until ``amount`` may pass for ``source`` at today's share."""
        state, share = self._bucket(source, now)
        return max(0.0, amount - state[0]) / share
