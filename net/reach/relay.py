"""Circuit relay: a peer that cannot be dialled (behind NAT) is reached through a public
peer that it keeps a connection to.

The wire format is libp2p's circuit relay v2 (``/libp2p/circuit/relay/0.2.0/hop`` and
``/stop``, its protobuf messages from py-libp2p), so the roles and codes are the spec's;
the relay and its client are ours. py-libp2p 0.8.1's relay keys a reservation by a field
the client writes, holds 4 reservations for the whole relay, lets an idle circuit outlive
its duration limit and tears down a circuit when a second one to the same peer opens;
its client renews reservations only after they expired (docs/decisions/007).

- **Relay** (:class:`RelayService`): a reachable peer grants *reservations* (bounded in
  number, per address and in time) to the peer at the other end of the stream, never to
  a peer named in the message. A peer that wants to reach a reserved one asks for a
  *circuit*; the relay opens a STOP stream to the reserved peer and splices the two
  streams, each circuit bounded in time and in bytes per direction: a relay carries
  handshakes and light traffic, never a swarm's.
- **Client** (:class:`RelayClient`): a peer that learned it cannot be dialled keeps
  reservations on ``relays`` peers, renews them at half their life, replaces a relay
  whose connection ended, accepts circuits only from its relays, and gives its relayed
  addresses (``<relay address>/p2p/<relay>/p2p-circuit``) to announce.
- **Dialling** (:func:`dial_relayed`): open a circuit through the relay and run the
  usual Noise + Yamux upgrade over it. The relay sees only ciphertext, and Noise checks
  the far end's peer id, so a relay can break a connection but never read or alter it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from google.protobuf.message import Message
from libp2p.connection_types import ConnectionType
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.relay.circuit_v2.pb.circuit_pb2 import (
    HopMessage,
    Limit,
    Reservation,
    StopMessage,
)
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.pb.circuit_pb2 import Status as Code

from net._libp2p import PeerID
from net.ratelimit import FairRate
from net.transport.admission import FairSlots, source_of
from net.transport.host import DialError, SwarmHost, parse_peer_addr

log = logging.getLogger(__name__)

HOP = "/libp2p/circuit/relay/0.2.0/hop"
STOP = "/libp2p/circuit/relay/0.2.0/stop"
#: The longest hop or stop message we read (a few addresses and ids).
MAX_MESSAGE_BYTES = 4096
_CHUNK = 64 * 1024
#: A read this small through a circuit is a keepalive (a Noise-sealed yamux ping is 30
#: bytes), not traffic: it does not keep an idle circuit open.
_KEEPALIVE_BYTES = 64


class RelayError(DialError):
    """A relay refused or failed a reservation or a circuit."""


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


# ------------------------------------------------------------------ messages


async def write_message(stream: Any, message: Message) -> None:
    """One length-prefixed protobuf message (the relay's and DCUtR's framing)."""
    body = message.SerializeToString()
    await stream.write(_varint(len(body)) + body)


async def read_message(stream: Any, kind: type[Any]) -> Any:
    """One length-prefixed protobuf message, read byte by byte up to its end (the bytes
    after it belong to the circuit); bounded before anything is allocated."""
    length = 0
    for shift in range(0, 35, 7):
        byte = await _read_exactly(stream, 1)
        length |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            break
    else:
        raise RelayError("malformed message length")
    if length > MAX_MESSAGE_BYTES:
        raise RelayError(f"a relay message of {length} bytes (the limit is {MAX_MESSAGE_BYTES})")
    message = kind()
    try:
        message.ParseFromString(await _read_exactly(stream, length))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise RelayError(f"malformed relay message: {exc}") from exc
    return message


async def _read_exactly(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        try:
            chunk = await stream.read(n - len(data))
        except EOFError:
            chunk = b""
        if not chunk:
            raise RelayError("the stream ended inside a relay message")
        data += chunk
    return data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _status(code: Any) -> str:
    try:
        return str(Code.Name(code))
    except ValueError:
        return str(code)


def circuit_addr(relay_addr: str, relay: PeerID) -> str:
    """The address a peer reserved on ``relay`` announces (without its own /p2p/)."""
    return f"{relay_addr.split('/p2p/', 1)[0]}/p2p/{relay}/p2p-circuit"


def split_circuit(addr: str) -> tuple[str, PeerID] | None:
    """``<relay address>/p2p/<relay>``, and the relay's id, of a circuit address; None
    when ``addr`` is not one."""
    head, sep, _ = addr.partition("/p2p-circuit")
    if not sep or "/p2p/" not in head:
        return None
    try:
        info = parse_peer_addr(head)
    except ValueError:
        return None
    return head, info.peer_id


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


async def reset_quietly(stream: Any) -> None:
    """Reset a stream that may be gone already (relay and hole-punch streams)."""
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(Exception),  # already gone
    ):
        await stream.reset()


def _seen(ip: str | None) -> list[bytes]:
    """An address as the relay saw it, for a circuit message (none when not IPv4)."""
    try:
        return [multiaddr.Multiaddr(f"/ip4/{ipaddress.IPv4Address(ip or '')}").to_bytes()]
    except ValueError:
        return []


def seen_ip(peer: Any) -> str | None:
    """The IPv4 address a relay said it saw a peer at (a circuit message's ``peer``)."""
    for raw in list(getattr(peer, "addrs", []))[:1]:
        addr = _readable_addr(raw)
        parts = (addr or "").split("/")
        if len(parts) == 3 and parts[1] == "ip4":
            return parts[2]
    return None


def _remote_ip(stream: Any) -> str | None:
    try:
        address = stream.muxed_conn.secured_conn.get_remote_address()
    except Exception:  # noqa: BLE001 - a relayed or exotic connection has none
        return None
    return str(address[0]) if address else None


# ------------------------------------------------------------------ client


@dataclass(frozen=True)
class RelayClientConfig:
    #: reservations kept at once
    relays: int = 2
    #: a reservation is renewed when this share of its life has passed
    renew_at: float = 0.5
    #: seconds between looks (connections lost, reservations to renew or replace)
    check_s: float = 2.0
    #: a peer that refused a reservation is not asked again for this long; one that
    #: could not be reached, for this long
    refused_s: float = 300.0
    unreachable_s: float = 30.0
    #: circuits accepted at once
    max_inbound_circuits: int = 32


@dataclass
class _Held:
    relay: PeerID
    #: the relay's own addresses (full, with /p2p/), from its answer
    addrs: tuple[str, ...]
    renew_at: float  # trio clock
    expires: float


@dataclass
class RelayClient:
    """Keeps reservations on relays while ``wanted()`` (we cannot be dialled), and
    accepts the circuits they bring. ``candidates()`` names peers to ask, best first;
    ``on_change`` is told our relayed addresses whenever they change."""

    host: SwarmHost
    candidates: Callable[[], Sequence[PeerID]]
    wanted: Callable[[], bool]
    config: RelayClientConfig = field(default_factory=RelayClientConfig)
    on_change: Callable[[list[str]], None] | None = None
    #: run for each circuit accepted, while it lasts, with the address the relay saw
    #: its initiator at (hole punching: net/reach/holepunch.py)
    on_circuit: Callable[[PeerID, str | None], Awaitable[Any]] | None = None
    held: dict[PeerID, _Held] = field(default_factory=dict)
    circuits_accepted: int = 0
    circuits_refused: int = 0
    _refused: dict[PeerID, float] = field(default_factory=dict)
    _inbound: int = 0
    _wake: trio.Event = field(default_factory=trio.Event)

    def relayed_addrs(self) -> list[str]:
        out: list[str] = []
        for held in self.held.values():
            for addr in held.addrs:
                parts = addr.split("/")
                if len(parts) > 2 and parts[2].startswith("127.") and len(held.addrs) > 1:
                    continue
                out.append(circuit_addr(addr, held.relay))
        return out

    def wake(self) -> None:
        """Look again now (e.g. we just learned that we cannot be dialled)."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host.set_stream_handler(STOP, self._on_stop)
        task_status.started()
        while True:
            before = self.relayed_addrs()
            await self._tend()
            after = self.relayed_addrs()
            if after != before and self.on_change is not None:
                self.on_change(after)
            with trio.move_on_after(self.config.check_s):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _tend(self) -> None:
        now = trio.current_time()
        if not self.wanted():
            self.held.clear()
            return
        for relay, held in list(self.held.items()):
            if held.expires <= now or not self.host.is_connected(relay):
                log.info("relay %s lost; looking for another", relay)
                del self.held[relay]
            elif held.renew_at <= now:
                await self._reserve(relay)
        tried: set[PeerID] = set()
        for peer in self.candidates():
            if len(self.held) >= self.config.relays:
                break
            if peer in self.held or peer in tried or self._refused.get(peer, 0) > now:
                continue
            tried.add(peer)
            await self._reserve(peer)

    async def _reserve(self, relay: PeerID) -> None:
        try:
            with trio.fail_after(10):
                stream = await self.host.new_stream(relay, HOP, timeout=5, attempts=1)
                await write_message(stream, HopMessage(type=HopMessage.RESERVE))
                answer = await read_message(stream, HopMessage)
                await stream.close()
        except (DialError, RelayError, trio.TooSlowError, BaseLibp2pError, OSError) as exc:
            log.debug("no reservation on %s: %s", relay, exc)
            self._refused[relay] = trio.current_time() + self.config.unreachable_s
            self.held.pop(relay, None)
            return
        if answer.status != Code.OK or not answer.HasField("reservation"):
            log.debug("%s refused a reservation: %s", relay, _status(answer.status))
            self._refused[relay] = trio.current_time() + self.config.refused_s
            self.held.pop(relay, None)
            return
        now = trio.current_time()
        life = max(1.0, answer.reservation.expire - time.time())
        addrs = []
        for raw in list(answer.reservation.addrs)[:8]:
            addr = _readable_addr(raw)
            if addr is not None and addr.endswith(f"/p2p/{relay}") and len(addr) <= 200:
                addrs.append(addr)
        if not addrs:
            self._refused[relay] = now + self.config.refused_s
            return
        if relay not in self.held:
            log.info("reservation on relay %s for %.0f s", relay, life)
        self.held[relay] = _Held(relay, tuple(addrs), now + life * self.config.renew_at, now + life)

    async def _on_stop(self, stream: Any) -> None:
        relay = stream.muxed_conn.peer_id
        if relay not in self.held or self._inbound >= self.config.max_inbound_circuits:
            self.circuits_refused += 1
            await reset_quietly(stream)
            return
        try:
            with trio.fail_after(10):
                message = await read_message(stream, StopMessage)
                initiator = PeerID(message.peer.id)
                initiator_ip = seen_ip(message.peer)
                if message.type != StopMessage.CONNECT:
                    raise RelayError("unexpected stop message")
                await write_message(stream, StopMessage(type=StopMessage.STATUS, status=Code.OK))
        except Exception as exc:  # noqa: BLE001 - a bad stop request ends only itself
            log.debug("bad circuit from relay %s: %s", relay, exc)
            await reset_quietly(stream)
            return
        addr = multiaddr.Multiaddr(f"/p2p/{relay}/p2p-circuit/p2p/{initiator}")
        raw = RawConnection(stream, False, ConnectionType.RELAYED, [addr])
        self._inbound += 1
        try:
            swarm = self.host.libp2p_host.get_network()
            muxed = await swarm.upgrade_inbound_raw_conn(raw, addr)
            if muxed.peer_id != initiator:  # Noise proved another identity than claimed
                raise RelayError(f"the circuit's peer is {muxed.peer_id}, not {initiator}")
            self.circuits_accepted += 1
            # the circuit lives as long as this handler: wait for its connection to end
            for conn in list(swarm.connections.get(initiator, [])):
                if conn.muxed_conn is muxed:
                    async with trio.open_nursery() as nursery:
                        if self.on_circuit is not None:
                            nursery.start_soon(self.on_circuit, initiator, initiator_ip)
                        await conn.event_closed.wait()
                        nursery.cancel_scope.cancel()
        except (BaseLibp2pError, OSError, RelayError) as exc:
            log.debug("relayed connection from %s failed: %s", initiator, exc)
            await reset_quietly(stream)
        finally:
            self._inbound -= 1


def _readable_addr(raw: bytes) -> str | None:
    try:
        return str(multiaddr.Multiaddr(raw))
    except Exception as exc:  # noqa: BLE001 - an address we cannot read is skipped
        log.debug("unreadable relay address: %s", exc)
        return None


# ------------------------------------------------------------------ dialling


async def dial_relayed(host: SwarmHost, target: PeerID, circuit: str, timeout: float) -> Any:
    """A connection to ``target`` through the relay named in ``circuit``; raises
    :class:`RelayError` (or DialError) when the relay refuses or cannot be reached."""
    parsed = split_circuit(circuit)
    if parsed is None:
        raise RelayError(f"{circuit!r} is not a relay circuit address")
    relay_addr, relay = parsed
    if relay in (target, host.peer_id):
        raise RelayError("a circuit through the target itself or through us")
    with trio.fail_after(timeout):
        await host.connect(relay, [relay_addr.split("/p2p/", 1)[0]], timeout=timeout, attempts=1)
        stream = await host.new_stream(relay, HOP, timeout=timeout, attempts=1)
        try:
            await write_message(
                stream,
                HopMessage(type=HopMessage.CONNECT, peer=CircuitPeer(id=target.to_bytes())),
            )
            answer = await read_message(stream, HopMessage)
            if answer.type != HopMessage.STATUS or answer.status != Code.OK:
                raise RelayError(f"relay {relay} refused the circuit: {_status(answer.status)}")
            host.note_seen_by_relay(target, seen_ip(answer.peer))
            addr = multiaddr.Multiaddr(f"{circuit}/p2p/{target}")
            raw = RawConnection(stream, True, ConnectionType.RELAYED, [addr])
            return await host.libp2p_host.upgrade_outbound_connection(raw, target)
        except BaseException:
            await reset_quietly(stream)
            raise
