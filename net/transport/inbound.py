"""Our handler of inbound connections, in place of py-libp2p 0.8.1's.

Measured with 0.8.1 (issue 14): ``Swarm._handle_inbound_connection`` takes a slot of an
inbound limiter (max_connections - min_connections = 250) and, after a successful
upgrade, waits for the *swarm* to stop before giving it back. After 250 connections in a
node's lifetime (13.7 s for an attacker; honest churn gets a bootstrap peer there too)
every newcomer is refused, although none of those connections is still open. Pending
handshakes held a slot for the whole 10 s upgrade timeout, so 260 idle TCP sockets kept
everyone out.

Here a connection's bookkeeping ends when *it* closes, and admission follows
:mod:`net.transport.admission` (bounds per source address, short handshake deadline, the oldest
stalled handshake dropped first). libp2p's own resource manager is switched off: its
counters are what leaked, and these limits replace it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.swarm import Swarm

from net.logs import ThrottledLog
from net.transport.admission import (
    AdmissionLimits,
    AdmissionStatistics,
    FairSlots,
    InboundAdmission,
    source_of,
)

log = logging.getLogger(__name__)

#: hole punches awaited at once (each lasts one attempt)
_MAX_PUNCHES = 64
#: direct inbound connections remembered (peer, when, port)
_MAX_ARRIVALS = 256


class InboundGate:
    """Installs itself as ``swarm``'s inbound handler; one per host."""

    def __init__(self, swarm: Swarm, limits: AdmissionLimits | None = None) -> None:
        self._swarm = swarm
        self.policy: InboundAdmission[trio.CancelScope] = InboundAdmission(limits)
        self._evicted: set[trio.CancelScope] = set()
        # source -> the scopes of its connections' handlers (cancelled when it is banned)
        self._connections: dict[str, set[trio.CancelScope]] = {}
        self._log = ThrottledLog(log)
        #: (ip, port) -> (peer, until): a hole punch in which we are the Noise initiator
        #: (net/reach/holepunch.py). A connection from there is the punch: when the other
        #: side's SYN came before ours left, our listener accepted it, and must not
        #: take the responder's part the other side takes too.
        self._punches: dict[tuple[str, int], tuple[Any, float]] = {}
        #: peer -> (when, our port) of the latest direct inbound connections: a dial-back
        #: claimed by a peer is believed only when its dialer really came in
        #: (net/reach/reachability.py)
        self._arrivals: OrderedDict[Any, tuple[float, int | None]] = OrderedDict()
        self._arrived = trio.Event()

    def expect_punch(self, endpoint: tuple[str, int], peer: Any, seconds: float) -> None:
        now = trio.current_time()
        self._punches = {k: v for k, v in self._punches.items() if v[1] > now}
        if len(self._punches) < _MAX_PUNCHES:
            self._punches[endpoint] = (peer, now + seconds)

    def _note_arrival(self, peer: Any, stream: Any) -> None:
        if peer is None:
            return
        local: int | None = None
        with contextlib.suppress(Exception):  # not a TCP socket (tests, exotic transports)
            local = int(stream.stream.socket.getsockname()[1])
        self._arrivals.pop(peer, None)
        self._arrivals[peer] = (trio.current_time(), local)
        while len(self._arrivals) > _MAX_ARRIVALS:
            self._arrivals.popitem(last=False)
        self._arrived.set()
        self._arrived = trio.Event()

    async def arrival(self, peer: Any, since: float, timeout: float) -> int | None:
        """The port of ours that ``peer`` connected to directly since ``since`` (trio's
        clock), waiting up to ``timeout`` for it; None when it did not."""
        with trio.move_on_after(timeout):
            while True:
                seen = self._arrivals.get(peer)
                if seen is not None and seen[0] >= since:
                    return seen[1] if seen[1] is not None else -1
                await self._arrived.wait()
        return None

    def install(self) -> None:
        # The listener's callback looks the method up on the instance at each connection.
        self._swarm._handle_inbound_connection = self.handle  # type: ignore[method-assign]
        # Its counters leaked (see above) and every limit it enforced is ours now.
        self._swarm._resource_manager = None

    def statistics(self) -> AdmissionStatistics:
        return self.policy.stats

    def penalize(self, source: str) -> None:
        """``source`` misbehaved (see AdmissionLimits.offences_before_ban); when that
        bans it, every connection it has is closed."""
        if not self.policy.offence(source, trio.current_time()):
            return
        self._log.log(logging.WARNING, "ban", "banning %s for misbehaving", source)
        for scope in self._connections.get(source, ()):
            scope.cancel()

    async def handle(self, read_write_closer: Any, maddr: Any) -> None:
        source = source_of(_remote_host(read_write_closer))
        limits = self.policy.limits
        if not self.policy.admits(source, trio.current_time()):
            await _close_quietly(read_write_closer)
            return
        scope = trio.CancelScope(deadline=trio.current_time() + limits.handshake_seconds)
        for old in self.policy.begin_handshake(source, scope):
            self._evicted.add(old)
            old.cancel()
        muxed: Any = None
        punch = self._punch_from(read_write_closer)
        try:
            with scope:
                if punch is not None:  # we initiate, as our own dial would have
                    conn = await self._swarm.upgrade_outbound_raw_conn(
                        RawConnection(read_write_closer, True), punch
                    )
                    muxed = conn.muxed_conn
                else:
                    muxed = await self._swarm.upgrade_inbound_raw_conn(
                        RawConnection(read_write_closer, False), maddr
                    )
        except Exception as exc:  # noqa: BLE001 - any failed handshake only ends this connection
            self.policy.stats.handshakes_failed += 1
            log.debug("inbound handshake from %s failed: %s", source, exc)
        finally:
            self.policy.end_handshake(source, scope)
            evicted = scope in self._evicted
            self._evicted.discard(scope)
        if muxed is None:
            if scope.cancelled_caught and not evicted:
                self.policy.stats.handshakes_timed_out += 1
            await _close_quietly(read_write_closer)
            return
        self.policy.stats.handshakes_completed += 1
        self._note_arrival(getattr(muxed, "peer_id", None), read_write_closer)
        if not _is_loopback(source):
            # another computer reached us: what the node can say about its reachability
            self.policy.stats.inbound_from_network += 1
        watch = trio.CancelScope()
        for old in self.policy.connection_opened(source, watch):
            old.cancel()  # all inbound connections at their total: the heaviest's oldest
        self._connections.setdefault(source, set()).add(watch)
        try:
            with watch:
                await _wait_closed(muxed)
        finally:
            self.policy.connection_closed(source, watch)
            held = self._connections.get(source)
            if held is not None:
                held.discard(watch)
                if not held:
                    del self._connections[source]
        if watch.cancelled_caught:  # banned or evicted: the connection goes
            await _close_quietly(muxed)

    def _punch_from(self, stream: Any) -> Any | None:
        """The peer whose hole punch this connection is, if it is one."""
        endpoint = None
        with contextlib.suppress(Exception):
            remote = stream.get_remote_address()
            endpoint = (str(remote[0]), int(remote[1]))
        if endpoint is None or endpoint not in self._punches:
            return None
        peer, until = self._punches.pop(endpoint)
        if until <= trio.current_time():
            return None
        log.debug("the connection from %s:%d is the hole punch of %s", *endpoint, peer)
        return peer


def _is_loopback(source: str) -> bool:
    try:
        return ipaddress.ip_network(source, strict=False).is_loopback
    except ValueError:
        return False


def _remote_host(stream: Any) -> str | None:
    with contextlib.suppress(Exception):
        remote = stream.get_remote_address()
        if remote:
            return str(remote[0])
    return None


async def _wait_closed(muxed: Any) -> None:
    event = muxed.event_closed  # Yamux's, set however the connection ends
    assert isinstance(event, trio.Event)
    await event.wait()


async def _close_quietly(stream: Any) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1), contextlib.suppress(Exception):
        await stream.close()


@dataclass(frozen=True)
class StreamLimits:
    """Inbound streams open at once (negotiating or served). Yamux buffers up to a
    receive window (256 KiB, growing) per stream, and each stream holds a task: a peer
    that opens streams and says nothing must not hold them all."""

    max_streams_per_peer: int = 128
    max_streams: int = 2048


@dataclass
class StreamStatistics:
    opened: int = 0
    #: reset to make room (the peer over its share, or the heaviest when all are full)
    dropped: int = 0
    #: a handler failed with an error nobody caught (logged, the stream reset)
    failed: int = 0


class StreamGate:
    """Wraps the swarm's handler of every inbound stream (ours and libp2p's own, such as
    identify): bounded per peer and in total, and a last-resort guard, so that no error
    a peer provokes in any handler can reach the swarm's nursery and stop the node."""

    def __init__(self, swarm: Swarm, limits: StreamLimits | None = None) -> None:
        self._swarm = swarm
        self.limits = limits or StreamLimits()
        self._slots: FairSlots[Any, trio.CancelScope] = FairSlots(
            self.limits.max_streams_per_peer, self.limits.max_streams
        )
        self._dropped: set[trio.CancelScope] = set()
        self.stats = StreamStatistics()
        self._log = ThrottledLog(log)

    def install(self) -> None:
        inner = self._swarm.common_stream_handler

        async def guarded(stream: Any) -> None:
            await self._handle(inner, stream)

        self._swarm.common_stream_handler = guarded
        # libp2p's global stream semaphore queued inbound streams behind idle ones.
        self._swarm._stream_semaphore = None

    def open_streams(self) -> int:
        return len(self._slots)

    async def _handle(self, inner: Callable[[Any], Awaitable[None]], stream: Any) -> None:
        peer = getattr(getattr(stream, "muxed_conn", None), "peer_id", None)
        scope = trio.CancelScope()
        self.stats.opened += 1
        for old in self._slots.add(peer, scope):
            self._dropped.add(old)
            old.cancel()
        try:
            with scope:
                await inner(stream)
        except Exception as exc:  # noqa: BLE001 - the last resort: log, reset, go on
            self.stats.failed += 1
            self._log.log(
                logging.ERROR,
                f"failure:{type(exc).__name__}",
                "a stream from %s failed in its handler: %r",
                peer,
                exc,
                exc_info=True,
            )
            await _reset_quietly(stream)
        finally:
            self._slots.remove(peer, scope)
            dropped = scope in self._dropped
            self._dropped.discard(scope)
        if dropped:
            self.stats.dropped += 1
            await _reset_quietly(stream)


async def _reset_quietly(stream: Any) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1), contextlib.suppress(Exception):
        await stream.reset()
