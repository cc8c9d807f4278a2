"""Circuit relay, the relay's side (the wire format and dialling: net/reach/circuit.py).

py-libp2p 0.8.1's relay keys a reservation by a field the client writes, holds 4
reservations for the whole relay, lets an idle circuit outlive its duration limit and
tears down a circuit when a second one to the same peer opens (docs/decisions/007); this
relay is ours.

- **Relay** (:class:`RelayService`): a reachable peer grants *reservations* (bounded in
  number, per address and in time) to the peer at the other end of the stream, never to
  a peer named in the message. A peer that wants to reach a reserved one asks for a
  *circuit*; the relay opens a STOP stream to the reserved peer and splices the two
  streams, each circuit bounded in time and in bytes per direction: a relay carries
  handshakes and light traffic, never a swarm's.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.exceptions import BaseLibp2pError
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Limit, Reservation, StopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.pb.circuit_pb2 import Status as Code

from net._libp2p import PeerID
from net.ratelimit import FairRate
from net.reach.circuit import HOP, STOP, RelayError, read_message, reset_quietly, write_message
from net.transport.admission import FairSlots, source_of
from net.transport.host import DialError, SwarmHost

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
#: A read this small through a circuit is a keepalive (a Noise-sealed yamux ping is 30
#: bytes), not traffic: it does not keep an idle circuit open.
_KEEPALIVE_BYTES = 64


@dataclass(frozen=True)
class RelayLimits:
    """What a relay grants. A circuit is meant for the first answers and for hole
    punching (net/reach/holepunch.py); heavy traffic goes direct when it can."""

    max_reservations: int = 128
    reservations_per_ip: int = 4
    reservation_s: float = 3600.0
    max_circuits: int = 64
    #: circuits to one reserved peer at once
    circuits_per_peer: int = 8
    #: circuits opened from one source address (the initiator's), through the relay
    #: and to one reserved peer: a source at its share is refused; past the totals, the
    #: oldest circuit of the source holding the most is closed, never a newcomer from
    #: another (16 idle circuits from one address kept a volunteer behind NAT
    #: unreachable)
    circuits_per_source: int = 16
    circuits_per_source_per_peer: int = 2
    #: a circuit that carried nothing (beyond keepalives) this long is closed
    circuit_idle_s: float = 20.0
    #: a circuit ends after this long, and when this many bytes went one way
    circuit_s: float = 600.0
    circuit_bytes: int = 64 * 1024 * 1024
    #: the longest the relay waits for a hop or stop message
    message_s: float = 10.0
    #: bytes per second forwarded, all circuits together (both ways count: each byte
    #: is received and sent again): the relay's own line is never filled by others.
    #: 4 MiB/s for public peers; a volunteer's node gives it a home uplink's share.
    bytes_per_s: float = 4 * 1024 * 1024
    #: It is shared fairly between the sources (initiators' addresses) of the circuits
    #: that carry bytes (net/ratelimit.py: FairRate): one bucket for all let a hog
    #: drain what an honest caller needed (1 MiB fell from 21 MB/s to 0.11 MB/s).


@dataclass
class RelayStatistics:
    reservations_granted: int = 0
    reservations_refused: int = 0
    circuits_opened: int = 0
    circuits_refused: int = 0
    #: circuits ended because they reached a limit
    circuits_cut_bytes: int = 0
    circuits_cut_time: int = 0
    circuits_cut_idle: int = 0
    #: closed to make room for a circuit from another source
    circuits_evicted: int = 0
    bytes_relayed: int = 0


@dataclass
class _Reservation:
    expires: float  # trio clock
    source: str  # the address it came from
    circuits: int = 0


# ------------------------------------------------------------------ relay


class RelayService:
    """The relay: serves HOP streams while ``enabled()`` (we are reachable)."""

    def __init__(
        self, host: SwarmHost, limits: RelayLimits | None = None, *, enabled: Callable[[], bool]
    ) -> None:
        self.host = host
        self.limits = limits or RelayLimits()
        self._enabled = enabled
        self._reservations: dict[PeerID, _Reservation] = {}
        lim = self.limits
        # circuits by the initiator's source: through the relay, and to each target
        self._circuits: FairSlots[str, trio.CancelScope] = FairSlots(
            lim.circuits_per_source, lim.max_circuits
        )
        self._to_target: dict[PeerID, FairSlots[str, trio.CancelScope]] = {}
        self._evicted: set[trio.CancelScope] = set()
        self.stats = RelayStatistics()
        # a burst of a second of each source's share, and at least one chunk (else a
        # chunk never passes)
        self._rate = FairRate(lim.bytes_per_s, min_burst=_CHUNK)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host.set_stream_handler(HOP, self._on_hop)
        task_status.started()
        await trio.sleep_forever()

    def reserved(self) -> list[PeerID]:
        return list(self._reservations)

    async def _on_hop(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id  # authenticated by Noise: never a message field
        try:
            with trio.fail_after(self.limits.message_s):
                message = await read_message(stream, HopMessage)
        except (RelayError, trio.TooSlowError, BaseLibp2pError, OSError) as exc:
            log.debug("bad hop request from %s: %s", peer, exc)
            await reset_quietly(stream)
            return
        if message.type == HopMessage.RESERVE:
            await self._reserve(stream, peer)
        elif message.type == HopMessage.CONNECT:
            await self._connect(stream, peer, message)
        else:
            await _answer_hop(stream, Code.UNEXPECTED_MESSAGE)

    def _forget_expired(self, now: float) -> None:
        for peer, r in list(self._reservations.items()):
            gone = r.expires <= now or not self.host.is_connected(peer)
            if gone and not r.circuits:
                del self._reservations[peer]
                self._to_target.pop(peer, None)

    @property
    def circuits(self) -> int:
        return len(self._circuits)

    async def _reserve(self, stream: Any, peer: PeerID) -> None:
        now = trio.current_time()
        self._forget_expired(now)
        source = source_of(_remote_ip(stream))
        ours = self._reservations.get(peer)
        from_source = sum(
            1 for p, r in self._reservations.items() if r.source == source and p != peer
        )
        if not self._enabled():
            refusal: Any = Code.RESERVATION_REFUSED
        elif ours is None and (
            len(self._reservations) >= self.limits.max_reservations
            or from_source >= self.limits.reservations_per_ip
        ):
            refusal = Code.RESOURCE_LIMIT_EXCEEDED
        else:
            refusal = None
        if refusal is not None:
            self.stats.reservations_refused += 1
            await _answer_hop(stream, refusal)
            return
        expires = now + self.limits.reservation_s
        if ours is None:
            self._reservations[peer] = _Reservation(expires, source)
        else:
            ours.expires = expires
        self.stats.reservations_granted += 1
        reply = HopMessage(
            type=HopMessage.STATUS,
            status=Code.OK,
            reservation=Reservation(
                expire=int(time.time() + self.limits.reservation_s),
                addrs=[multiaddr.Multiaddr(a).to_bytes() for a in self.host.addrs()],
            ),
            limit=self._limit(),
        )
        await _send_and_close(stream, reply)

    def _limit(self) -> Limit:
        return Limit(duration=int(self.limits.circuit_s), data=self.limits.circuit_bytes)

    async def _connect(self, stream: Any, initiator: PeerID, message: HopMessage) -> None:
        try:
            target = PeerID(message.peer.id)
        except Exception:  # noqa: BLE001 - any malformed id is refused alike
            await _answer_hop(stream, Code.MALFORMED_MESSAGE)
            return
        self._forget_expired(trio.current_time())
        reservation = self._reservations.get(target)
        if reservation is None or not self.host.is_connected(target):
            await self._refuse_circuit(stream, Code.NO_RESERVATION)
            return
        lim = self.limits
        source = source_of(_remote_ip(stream))
        to_target = self._to_target.setdefault(
            target, FairSlots(lim.circuits_per_source_per_peer, lim.circuits_per_peer)
        )
        if (
            to_target.held(source) >= lim.circuits_per_source_per_peer
            or self._circuits.held(source) >= lim.circuits_per_source
        ):
            # a source over its share is refused at once (before any stream to the
            # target): evicting its own oldest instead let one churn the target
            await self._refuse_circuit(stream, Code.RESOURCE_LIMIT_EXCEEDED)
            return
        scope = trio.CancelScope()
        # room for a newcomer past the totals: the oldest circuit of the source holding
        # the most goes
        for old in [*self._circuits.add(source, scope), *to_target.add(source, scope)]:
            if old is not scope:
                self._evicted.add(old)
                old.cancel()
        reservation.circuits += 1
        try:
            with scope:
                await self._open_circuit(stream, initiator, target, source)
            if scope.cancelled_caught:
                if scope in self._evicted:
                    self.stats.circuits_evicted += 1
                await reset_quietly(stream)
        finally:
            self._evicted.discard(scope)
            self._circuits.remove(source, scope)
            to_target.remove(source, scope)
            reservation.circuits -= 1

    async def _refuse_circuit(self, stream: Any, code: Any) -> None:
        self.stats.circuits_refused += 1
        await _answer_hop(stream, code)

    async def _open_circuit(
        self, stream: Any, initiator: PeerID, target: PeerID, source: str
    ) -> None:
        try:
            with trio.fail_after(self.limits.message_s):
                far = await self.host.new_stream(target, STOP, timeout=self.limits.message_s)
                await write_message(
                    far,
                    StopMessage(
                        type=StopMessage.CONNECT,
                        # where the initiator's connection came from: the only address
                        # the target may dial for it (hole punching, net/reach/holepunch.py)
                        peer=CircuitPeer(id=initiator.to_bytes(), addrs=_seen(_remote_ip(stream))),
                        limit=self._limit(),
                    ),
                )
                answer = await read_message(far, StopMessage)
        except (DialError, RelayError, trio.TooSlowError, BaseLibp2pError, OSError) as exc:
            log.debug("circuit %s -> %s: the target did not answer: %s", initiator, target, exc)
            await self._refuse_circuit(stream, Code.CONNECTION_FAILED)
            return
        if answer.type != StopMessage.STATUS or answer.status != Code.OK:
            await reset_quietly(far)
            await self._refuse_circuit(stream, Code.CONNECTION_FAILED)
            return
        try:
            target_seen = (
                self._reservations[target].source if target in self._reservations else None
            )
            await write_message(
                stream,
                HopMessage(
                    type=HopMessage.STATUS,
                    status=Code.OK,
                    limit=self._limit(),
                    # where the target's reservation came from, likewise
                    peer=CircuitPeer(id=target.to_bytes(), addrs=_seen(target_seen)),
                ),
            )
        except (BaseLibp2pError, OSError):
            await reset_quietly(far)
            return
        self.stats.circuits_opened += 1
        try:
            await self._splice(stream, far, source)
        finally:
            await reset_quietly(far)  # evicted or ended: the far side is told at once

    async def _spend(self, nbytes: int, source: str) -> None:
        """Wait until ``source``'s share of the relay's rate lets ``nbytes`` through."""
        while True:
            now = trio.current_time()
            if self._rate.try_take(source, nbytes, now):
                return
            # as long as the missing tokens take to come back at today's share
            await trio.sleep(self._rate.wait_s(source, nbytes, now))

    async def _splice(self, a: Any, b: Any, source: str) -> None:
        """Copy both ways until both ends closed, a limit is reached, nothing but
        keepalives passed for ``circuit_idle_s``, or one end fails."""
        cut = False
        idle = trio.CancelScope(deadline=trio.current_time() + self.limits.circuit_idle_s)

        async def pump(src: Any, dst: Any, cancel: trio.CancelScope) -> None:
            nonlocal cut
            sent = 0
            try:
                while True:
                    try:
                        chunk = await src.read(_CHUNK)
                    except EOFError:
                        chunk = b""
                    if not chunk:
                        await dst.close()  # half-close: the other way may go on
                        return
                    sent += len(chunk)
                    if len(chunk) > _KEEPALIVE_BYTES:  # traffic, not a yamux ping
                        idle.deadline = trio.current_time() + self.limits.circuit_idle_s
                    if sent > self.limits.circuit_bytes:
                        self.stats.circuits_cut_bytes += 1
                        log.info(
                            "a circuit reached %d bytes one way: cut", self.limits.circuit_bytes
                        )
                        cut = True
                        cancel.cancel()
                        return
                    await self._spend(len(chunk), source)
                    await dst.write(chunk)
                    self.stats.bytes_relayed += len(chunk)
            except (BaseLibp2pError, OSError):
                cut = True
                cancel.cancel()

        with trio.move_on_after(self.limits.circuit_s) as timer, idle:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, a, b, nursery.cancel_scope)
                nursery.start_soon(pump, b, a, nursery.cancel_scope)
        if timer.cancelled_caught:
            self.stats.circuits_cut_time += 1
            log.info("a circuit reached %.0f s: cut", self.limits.circuit_s)
            cut = True
        if idle.cancelled_caught:
            self.stats.circuits_cut_idle += 1
            log.debug("a circuit idle for %.0f s: closed", self.limits.circuit_idle_s)
            cut = True
        if cut:
            await reset_quietly(a)
            await reset_quietly(b)


async def _answer_hop(stream: Any, code: Any) -> None:
    await _send_and_close(stream, HopMessage(type=HopMessage.STATUS, status=code))


async def _send_and_close(stream: Any, message: HopMessage | StopMessage) -> None:
    try:
        await write_message(stream, message)
        await stream.close()
    except (BaseLibp2pError, OSError):
        await reset_quietly(stream)


def _seen(ip: str | None) -> list[bytes]:
    """An address as the relay saw it, for a circuit message (none when not IPv4)."""
    try:
        return [multiaddr.Multiaddr(f"/ip4/{ipaddress.IPv4Address(ip or '')}").to_bytes()]
    except ValueError:
        return []


def _remote_ip(stream: Any) -> str | None:
    try:
        address = stream.muxed_conn.secured_conn.get_remote_address()
    except Exception:  # noqa: BLE001 - a relayed or exotic connection has none
        return None
    return str(address[0]) if address else None
