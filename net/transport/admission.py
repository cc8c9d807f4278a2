"""Who may open a connection to us: bounds on handshakes in progress and on connections
per source address. Pure: the caller passes every event and the clock, and carries out
the decisions (closing the sockets this returns).

Identities cost one key generation, so limits keyed by peer id stop nobody; addresses
cost an attacker much more. Every limit here is keyed by the *source*: an IPv4 address,
or the /64 network of an IPv6 address (one home line gets a /64 or more).

Handshakes in progress are the cheap attack (a TCP connect costs the attacker nothing,
each pending handshake costs us a slot for its whole deadline). When a source has too
many, the *oldest* of its handshakes is dropped, not the newcomer: a stalled socket has
had its chance, and an honest peer that shares the address (a NAT, or loopback in tests)
still gets in as long as it completes its handshake before the same source opens
``max_handshakes_per_source`` more. When all sources together have too many, the oldest
handshake of the source holding the most is dropped, so one source never crowds out
the others.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from net.ratelimit import TokenBucket


@dataclass(frozen=True)
class AdmissionLimits:
    #: Handshakes (Noise + Yamux) in progress, all sources together.
    max_handshakes: int = 64
    #: Handshakes in progress from one source.
    max_handshakes_per_source: int = 8
    #: The longest a handshake may take (honest ones take a few round trips).
    handshake_seconds: float = 5.0
    #: Established inbound connections from one source, and from all together; past
    #: the total, the oldest connection of the source holding the most is closed (a
    #: newcomer is never the one refused). libp2p's own cap sits above this plus
    #: ``outbound_reserve`` (net/_libp2p.py): it refused everyone, in and out, at 300.
    max_inbound_per_source: int = 64
    max_inbound: int = 1024
    #: Connections kept free for our own dials and the handshakes in progress, however
    #: many inbound connections there are.
    outbound_reserve: int = 512

    @property
    def libp2p_max_connections(self) -> int:
        """What libp2p's swarm may hold in all: never the limit that bites."""
        return self.max_inbound + self.max_handshakes + self.outbound_reserve

    #: New connections accepted from one source per second, and in a burst (a refusal
    #: costs an accept and a close; a handshake costs far more).
    connections_per_second: float = 16.0
    connection_burst: float = 64.0
    #: Sources whose connection rate is remembered (least recently seen forgotten).
    max_sources: int = 10_000
    #: Offences (bad frames, stalled requests, rate limits passed...) a source may
    #: commit within ``offence_window_seconds``; one more and it is banned: its
    #: connections closed, new ones refused at once, for ``ban_seconds``.
    offences_before_ban: int = 20
    offence_window_seconds: float = 60.0
    ban_seconds: float = 120.0


def source_of(host: str | None) -> str:
    """The key limits are counted under: the IPv4 address, or the IPv6 /64."""
    if not host:
        return "?"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


@dataclass
class AdmissionStatistics:
    handshakes_started: int = 0
    handshakes_completed: int = 0
    #: dropped to make room for newer ones (per source, or all sources together)
    handshakes_evicted: int = 0
    handshakes_timed_out: int = 0
    handshakes_failed: int = 0
    #: connections refused at once because their source has its share already
    refused_per_source: int = 0
    #: established connections closed to make room for a newcomer from another source
    #: (all inbound connections together at max_inbound)
    connections_evicted: int = 0
    #: connections refused at once because their source opens them too fast
    refused_rate: int = 0
    offences: int = 0
    bans: int = 0
    #: connections refused at once because their source is banned
    refused_banned: int = 0
    inbound_open: int = 0
    #: handshakes completed with peers on other computers (not loopback): proof that
    #: this host can be reached from its network
    inbound_from_network: int = 0


K = TypeVar("K")
H = TypeVar("H")


class FairSlots(Generic[K, H]):
    """Slots held by keys (sources, peers), each holding its handles oldest first.

    A key over its share loses its own oldest handle; when all keys together are over
    the total, the key holding the most loses its oldest. A newcomer is never the one
    dropped at its own arrival, and no key can crowd out the others."""

    def __init__(self, per_key: int, total: int) -> None:
        self.per_key, self.total = per_key, total
        self._held: dict[K, OrderedDict[H, None]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def held(self, key: K) -> int:
        return len(self._held.get(key, ()))

    def add(self, key: K, handle: H) -> list[H]:
        """Hold ``handle`` for ``key``; returns the handles to drop to make room."""
        queue = self._held.setdefault(key, OrderedDict())
        queue[handle] = None
        self._count += 1
        dropped: list[H] = []
        while len(queue) > self.per_key:
            dropped.append(self._drop_oldest(key))
        while self._count > self.total:
            heaviest = max(self._held, key=lambda k: len(self._held[k]))
            if heaviest == key and len(queue) == 1:
                break  # only the newcomer is left there: the total is below one per key
            dropped.append(self._drop_oldest(heaviest))
        return dropped

    def _drop_oldest(self, key: K) -> H:
        queue = self._held[key]
        handle, _ = queue.popitem(last=False)
        self._count -= 1
        if not queue:
            del self._held[key]
        return handle

    def remove(self, key: K, handle: H) -> None:
        """Give a slot back (idempotent: a dropped handle may be removed again)."""
        queue = self._held.get(key)
        if queue is not None and handle in queue:
            del queue[handle]
            self._count -= 1
            if not queue:
                del self._held[key]


class InboundAdmission(Generic[H]):
    """Bookkeeping of inbound handshakes and connections. ``H`` is whatever the caller
    needs to abort a handshake (a cancel scope); it is returned when one must go."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self._pending: FairSlots[str, H] = FairSlots(
            self.limits.max_handshakes_per_source, self.limits.max_handshakes
        )
        self._inbound: FairSlots[str, H] = FairSlots(
            self.limits.max_inbound_per_source, self.limits.max_inbound
        )
        self._rates: OrderedDict[str, TokenBucket] = OrderedDict()
        # source -> times of its recent offences; source -> end of its ban
        self._offences: OrderedDict[str, list[float]] = OrderedDict()
        self._banned_until: OrderedDict[str, float] = OrderedDict()
        self.stats = AdmissionStatistics()

    def pending(self, source: str | None = None) -> int:
        return len(self._pending) if source is None else self._pending.held(source)

    def inbound(self, source: str | None = None) -> int:
        if source is None:
            return len(self._inbound)
        return self._inbound.held(source)

    def begin_handshake(self, source: str, handle: H) -> list[H]:
        """A connection arrived from ``source``. Returns the handshakes to abort to make
        room (never ``handle`` itself, the newest)."""
        self.stats.handshakes_started += 1
        evicted = self._pending.add(source, handle)
        self.stats.handshakes_evicted += len(evicted)
        return evicted

    def end_handshake(self, source: str, handle: H) -> None:
        """The handshake finished, failed or was aborted (idempotent)."""
        self._pending.remove(source, handle)

    def banned(self, source: str, now: float) -> bool:
        until = self._banned_until.get(source)
        if until is None:
            return False
        if until <= now:
            del self._banned_until[source]
            return False
        return True

    def offence(self, source: str, now: float) -> bool:
        """``source`` misbehaved. True when this offence bans it (the caller then closes
        its connections)."""
        self.stats.offences += 1
        lim = self.limits
        if self.banned(source, now):
            return False
        window = now - lim.offence_window_seconds
        times = [t for t in self._offences.pop(source, []) if t > window] + [now]
        if len(times) <= lim.offences_before_ban:
            self._offences[source] = times  # most recent last
            while len(self._offences) > lim.max_sources:
                self._offences.popitem(last=False)
            return False
        self._banned_until[source] = now + lim.ban_seconds
        while len(self._banned_until) > lim.max_sources:
            self._banned_until.popitem(last=False)
        self.stats.bans += 1
        return True

    def admits(self, source: str, now: float) -> bool:
        """Whether a new connection from ``source`` may even start its handshake: refused
        at once when the source is banned, has its share of connections or opens them
        too fast."""
        if self.banned(source, now):
            self.stats.refused_banned += 1
            return False
        if self._inbound.held(source) >= self.limits.max_inbound_per_source:
            self.stats.refused_per_source += 1
            return False
        bucket = self._rates.pop(source, None)
        if bucket is None:
            lim = self.limits
            bucket = TokenBucket.full(lim.connections_per_second, lim.connection_burst, now)
        self._rates[source] = bucket  # most recently seen last
        while len(self._rates) > self.limits.max_sources:
            self._rates.popitem(last=False)
        if not bucket.try_take(1.0, now):
            self.stats.refused_rate += 1
            return False
        return True

    def connection_opened(self, source: str, handle: H) -> list[H]:
        """A handshake completed; the connection counts until connection_closed.
        Returns the connections to close to make room (the heaviest source's oldest;
        never ``handle``, unless its own source is over its share)."""
        evicted = self._inbound.add(source, handle)
        self.stats.inbound_open = len(self._inbound)
        self.stats.connections_evicted += len(evicted)
        return evicted

    def connection_closed(self, source: str, handle: H) -> None:
        """The connection closed (idempotent: an evicted one may be closed again)."""
        self._inbound.remove(source, handle)
        self.stats.inbound_open = len(self._inbound)
