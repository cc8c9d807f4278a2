"""A libp2p host on trio: TCP + Noise + Yamux, dials with retries and deadlines."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import multiaddr
import psutil
import trio
from libp2p.connection_types import ConnectionType
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.swarm import Swarm
from libp2p.peer.peerstore import PeerStoreError

from net._libp2p import (
    PeerID,
    PeerInfo,
    RetryConfig,
    TProtocol,
    connection_config,
    info_from_p2p_addr,
    new_host,
)
from net.identity import Identity
from net.transport.admission import AdmissionLimits, AdmissionStatistics, source_of
from net.transport.dialing import (
    CIRCUIT_AFTER_S,
    CIRCUIT_TIMEOUT_S,
    STAGGER_S,
    dial_order,
    relayed_candidates,
)
from net.transport.inbound import InboundGate, StreamGate, StreamLimits
from net.transport.keepalive import Keepalive, KeepaliveNotifee

log = logging.getLogger(__name__)

DEFAULT_LISTEN = ("/ip4/127.0.0.1/tcp/0",)
#: What the roles other computers must reach listen on by default (a bootstrap peer,
#: an owner's publisher, an aggregator): every interface, a port the system picks.
EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/0",)
#: How long dialled addresses stay in the peerstore (seconds).
_ADDR_TTL = 3600

StreamHandler = Callable[[Any], Awaitable[None]]
#: (peer, circuit address, timeout) -> a connection through that relay
RelayedDialer = Callable[[PeerID, str, float], Awaitable[Any]]
#: peer -> the addresses it published ([] when none could be found)
Resolver = Callable[[PeerID], Awaitable[list[str]]]


class DialError(Exception):
    """No connection to a peer could be made within the deadline."""


@dataclass
class _Dial:
    """A dial in flight, shared by the callers that want the same peer."""

    done: trio.Event
    #: what it dials: a caller with an address outside it dials alongside
    addrs: frozenset[str] = frozenset()
    error: BaseException | None = None


class AddressError(ValueError):
    """A multiaddress could not be parsed or lacks its /p2p/ part."""


def parse_peer_addr(addr: str) -> PeerInfo:
    """PeerInfo of a full address such as ``/ip4/127.0.0.1/tcp/4001/p2p/12D3Koo...``."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(addr))
    except Exception as exc:  # multiaddr raises several unrelated types
        raise AddressError(f"{addr!r} is not a valid peer address ({exc})") from exc


def interface_addresses() -> list[str]:
    """This computer's IP addresses (every interface, loopback included)."""
    found = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.append(a.address.split("%", 1)[0])
    return found


def expand_unspecified(bound: Sequence[str], interfaces: Sequence[str]) -> list[str]:
    """``bound`` with each listener on every interface (``/ip4/0.0.0.0``, ``/ip6/::``)
    replaced by the interfaces' addresses of its family: the others first, loopback last
    (it reaches only this computer), link-local left out (it needs a zone to be dialled)."""
    out: list[str] = []
    for addr in bound:
        parts = addr.split("/")  # "", "ip4", "0.0.0.0", "tcp", "4001", ...
        if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
            out.append(addr)
            continue
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            out.append(addr)
            continue
        if not ip.is_unspecified:
            out.append(addr)
            continue
        family = [
            candidate
            for candidate in (_ip_or_none(i) for i in interfaces)
            if candidate is not None
            and candidate.version == ip.version
            and not candidate.is_link_local
        ]
        family.sort(key=lambda c: c.is_loopback)
        rest = "/".join(parts[3:])
        out.extend(f"/{parts[1]}/{c}/{rest}" for c in family)
    return list(dict.fromkeys(out))


def is_loopback_addr(addr: str) -> bool:
    """Whether a multiaddress names this computer's loopback (127.0.0.0/8, ::1)."""
    parts = addr.split("/")
    ip = _ip_or_none(parts[2]) if len(parts) > 2 and parts[1] in ("ip4", "ip6") else None
    return ip is not None and ip.is_loopback


def _ip_or_none(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class SwarmHost:
    """One libp2p host. Use ``async with host.running():`` to listen; leaving it closes
    every connection and listener."""

    def __init__(
        self,
        identity: Identity,
        listen: Sequence[str] = DEFAULT_LISTEN,
        *,
        dial_timeout: float = 10.0,
        admission: AdmissionLimits | None = None,
        streams: StreamLimits | None = None,
        keepalive: Keepalive | None = None,
    ) -> None:
        self.identity = identity
        self._dial_timeout = dial_timeout
        self._listen = [multiaddr.Multiaddr(a) for a in listen]
        self._public: list[str] = []
        self._relayed: list[str] = []
        #: dials a circuit address (net/peer.py sets it to net/reach/circuit.py's
        #: dial_relayed; None: circuits are not dialled)
        self.relayed_dialer: RelayedDialer | None = None
        #: looks up the addresses a peer published (net/reach/addressbook.py); None: never
        self.resolver: Resolver | None = None
        self._host = new_host(
            key_pair=identity.key_pair(),
            connection_config=connection_config(
                dial_timeout=dial_timeout,
                max_connections=(admission or AdmissionLimits()).libp2p_max_connections,
            ),
            listen_addrs=self._listen,
            # Identify tells peers what we announce, never the raw listeners: libp2p
            # sent /ip4/0.0.0.0/... and peers dialled themselves (net/transport/dialing.py)
            addrs_factory=self._identify_addrs,
        )
        # One dial attempt per call of ours: connect() below owns retries and deadlines
        # (libp2p's own retries, 4 tries over ~0.7 s, would hide inside every call).
        network = self._host.get_network()
        if not isinstance(network, Swarm):
            raise TypeError(f"libp2p gave a {type(network).__name__}, not its Swarm")
        network.retry_config = RetryConfig(max_retries=0)
        # Inbound connections are admitted by our gate (net/transport/inbound.py: libp2p's leaked
        # a slot per connection and let idle sockets hold every slot).
        self._gate = InboundGate(network, admission)
        self._gate.install()
        # Every inbound stream, ours and libp2p's own, passes a gate: bounded per peer,
        # and no error a peer provokes in a handler reaches the swarm's nursery.
        self.streams = StreamGate(network, streams)
        self.streams.install()
        # a connection that died silently (a router restarted) is dropped in seconds
        network.register_notifee(KeepaliveNotifee(keepalive or Keepalive()))
        self._swarm = network
        self._running = False
        #: dials in flight, so that concurrent callers share one; they run in this
        #: nursery while the host runs
        self._dialing: dict[PeerID, _Dial] = {}
        self._seen_by_relay: OrderedDict[PeerID, str] = OrderedDict()
        self._dials: trio.Nursery | None = None

    @property
    def peer_id(self) -> PeerID:
        return self._host.get_id()

    @property
    def libp2p_host(self) -> Any:
        return self._host

    def admission_statistics(self) -> AdmissionStatistics:
        """Inbound handshakes and connections: started, evicted, timed out, open."""
        return self._gate.statistics()

    def penalize(self, source: str) -> None:
        """A peer from ``source`` misbehaved: enough offences ban the source (its
        connections closed, new ones refused for a while; net/transport/admission.py)."""
        self._gate.penalize(source)

    def listen_addrs(self) -> list[str]:
        """Addresses we listen on, without the /p2p/ part (what peers store for us);
        none once the host stopped (libp2p then fails on the closed listening socket, and a
        task still announcing must get an RPC error, not a crash). A listener on every
        interface (0.0.0.0, ::) is given as the interfaces' own addresses."""
        try:
            bound = [str(a) for a in self._host.get_transport_addrs()]
        except OSError:
            return []
        if not any(a.startswith(("/ip4/0.0.0.0/", "/ip6/::/")) for a in bound):
            return bound  # the usual case (and the DHT asks on every message)
        return expand_unspecified(bound, interface_addresses())

    def set_public_addrs(self, addrs: Sequence[str]) -> None:
        """Addresses peers outside dialled us back on (net/reach/reachability.py): announced
        before the interfaces' own, which a NAT or a LAN may hide from others."""
        self._public = list(addrs)

    def set_relayed_addrs(self, addrs: Sequence[str]) -> None:
        """Circuit addresses of the relays that hold a reservation for us
        (net/reach/relay_client.py): announced after the direct ones."""
        self._relayed = list(addrs)

    def announce_addrs(self) -> list[str]:
        """What we tell peers to dial, best first, without the /p2p/ part. Loopback is
        left out when there is anything else: it would reach only this computer, and a
        peer elsewhere that dials it reaches itself."""
        ordered = list(dict.fromkeys([*self._public, *self.listen_addrs()]))
        outside = [a for a in ordered if not is_loopback_addr(a)]
        return [*(outside or ordered), *self._relayed]

    def _identify_addrs(self, candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        if not hasattr(self, "_host"):  # libp2p asks while new_host() builds it
            return candidates
        return [multiaddr.Multiaddr(a) for a in self.announce_addrs()]

    def addrs(self) -> list[str]:
        """Full addresses to give to others, e.g. as bootstrap peers."""
        return [f"{a}/p2p/{self.peer_id}" for a in self.announce_addrs()]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SwarmHost]:
        try:
            async with self._host.run(self._listen), trio.open_nursery() as dials:
                self._running = True
                self._dials = dials
                try:
                    yield self
                finally:
                    self._running = False
                    self._dials = None
                    dials.cancel_scope.cancel()
                    await self._close()
        finally:
            await self._close()

    async def _close(self) -> None:
        """Close connections and listeners. Leaving libp2p's ``run()`` alone leaves the
        TCP listener serving in a trio system task (measured with 0.8.1: the port stays
        open and a restarted peer cannot bind it); ``host.close()`` stops it."""
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            # The door first: Swarm.close() closes its listeners only after closing the
            # connections, and then forgets its table, so one that a peer opened
            # meanwhile stayed open with nobody serving or closing it.
            for listener in list(self._swarm.listeners.values()):
                with contextlib.suppress(BaseLibp2pError, OSError):
                    await listener.close()
            # Swarm.close() closes connections one by one, each Yamux close ending in a
            # 0.1 s sleep (5-6 s for 50 peers): close them all at once first.
            connections = self._swarm.connections
            async with trio.open_nursery() as nursery:
                for conns in list(connections.values()):
                    for conn in list(conns):
                        nursery.start_soon(_close_connection, conn)
            try:
                await self._host.close()
            except (BaseLibp2pError, OSError) as exc:
                log.debug("error while closing the host: %s", exc)

    def set_stream_handler(self, protocol: str, handler: StreamHandler) -> None:
        self._host.set_stream_handler(TProtocol(protocol), handler)

    def remember(self, peer_id: PeerID, addrs: Iterable[str]) -> None:
        """Add addresses for a peer to the peerstore, skipping unparsable ones."""
        parsed = []
        for a in addrs:
            try:
                parsed.append(multiaddr.Multiaddr(a))
            except Exception:  # noqa: BLE001 - a bad address from a peer is only skipped
                log.debug("ignoring unparsable address %r for %s", a, peer_id)
        if parsed:
            self._host.get_peerstore().add_addrs(peer_id, parsed, _ADDR_TTL)

    def known_addrs(self, peer_id: PeerID) -> list[str]:
        try:
            return [str(a) for a in self._host.get_peerstore().addrs(peer_id)]
        except (BaseLibp2pError, PeerStoreError):
            return []

    def is_connected(self, peer_id: PeerID) -> bool:
        """Whether an open connection to ``peer_id`` exists (a closed one can linger in
        libp2p's table for a moment: a relay circuit cut at its limit, for one)."""
        return bool(self._open_connections(peer_id))

    def _open_connections(self, peer_id: PeerID) -> list[Any]:
        conns = self._host.get_network().connections.get(peer_id, [])
        # the muxer sees the end of a connection before the swarm's task that drops it
        return [c for c in conns if not c.is_closed and not c.muxed_conn.is_closed]

    def note_seen_by_relay(self, peer_id: PeerID, ip: str | None) -> None:
        """The relay we reached ``peer_id`` through saw it at ``ip`` (net/reach/circuit.py):
        the one address a hole punch may dial for it (net/reach/holepunch.py)."""
        self._seen_by_relay.pop(peer_id, None)
        if ip is not None:
            self._seen_by_relay[peer_id] = ip
            while len(self._seen_by_relay) > 1024:
                self._seen_by_relay.popitem(last=False)

    def seen_by_relay(self, peer_id: PeerID) -> str | None:
        return self._seen_by_relay.get(peer_id)

    async def arrival(self, peer_id: PeerID, since: float, timeout: float) -> int | None:
        """Our port that ``peer_id`` connected to directly (not through a relay) since
        ``since`` (trio's clock), waiting up to ``timeout``; None when it did not (-1: it
        did, the port is not known)."""
        return await self._gate.arrival(peer_id, since, timeout)

    def source_of_peer(self, peer_id: PeerID) -> str | None:
        """The source address (net.transport.admission.source_of) of a direct connection to
        ``peer_id``; None when there is none."""
        for conn in self._open_connections(peer_id):
            if conn.get_connection_type() == ConnectionType.RELAYED:
                continue
            with contextlib.suppress(Exception):  # a connection without a socket address
                remote = conn.muxed_conn.secured_conn.get_remote_address()
                if remote:
                    return source_of(str(remote[0]))
        return None

    def relayed_only(self, peer_id: PeerID) -> bool:
        """Whether every open connection to ``peer_id`` goes through a relay (and there
        is one): a peer behind NAT whose hole punch failed, or has not happened yet."""
        open_conns = self._open_connections(peer_id)
        return bool(open_conns) and all(
            c.get_connection_type() == ConnectionType.RELAYED for c in open_conns
        )

    def worth_reusing(self, stream: Any) -> bool:
        """Whether an idle stream of ours may carry another call: its connection is still
        open, and it does not go through a relay while a direct connection to the same
        peer exists (heavy traffic goes direct once hole punching made a way)."""
        muxed = stream.muxed_conn
        if muxed.is_closed:
            return False
        if muxed.get_connection_type() != ConnectionType.RELAYED:
            return True
        return self.relayed_only(muxed.peer_id)

    def connected_peers(self) -> list[PeerID]:
        return list(self._host.get_connected_peers())

    async def connect(
        self,
        peer_id: PeerID,
        addrs: Sequence[str] = (),
        *,
        timeout: float = 10.0,
        attempts: int = 3,
    ) -> None:
        """Connect to a peer, retrying with backoff, within ``timeout`` seconds overall.

        Explicit ``addrs`` are dialled alone and replace what the peerstore knew: a peer
        that restarted listens elsewhere, and libp2p would keep trying the old address.
        Otherwise, when no address is known, the addresses the peer published are looked
        up (``resolver``) and dialled; when every known one failed, they are looked up in
        the background for the next call (the caller of a dead peer must not wait)."""
        if peer_id == self.peer_id:
            raise DialError("refusing to dial ourselves")
        if addrs:
            with contextlib.suppress(BaseLibp2pError, PeerStoreError):
                self._host.get_peerstore().clear_addrs(peer_id)
            self.remember(peer_id, addrs)
        if self.is_connected(peer_id):
            return
        deadline = trio.current_time() + timeout
        known = list(addrs) or self.known_addrs(peer_id)
        if not known:
            known = await self._resolve(peer_id, deadline)
            if not known:
                raise DialError(f"no known address for {peer_id}")
        try:
            await self._connect_to(peer_id, known, deadline, attempts)
        except DialError:
            if not addrs and self.resolver is not None and self._dials is not None:
                self._dials.start_soon(self._resolve, peer_id, math.inf)
            raise

    async def _resolve(self, peer_id: PeerID, deadline: float) -> list[str]:
        """The addresses ``peer_id`` published, remembered for the next dials."""
        found: list[str] = []
        if self.resolver is not None:
            with trio.move_on_at(deadline):
                found = await self.resolver(peer_id)
            self.remember(peer_id, found)
        return found

    async def _connect_to(
        self, peer_id: PeerID, known: list[str], deadline: float, attempts: int
    ) -> None:
        ordered = dial_order(known, own=self._own_addrs())
        circuits = relayed_candidates(known) if self.relayed_dialer is not None else []
        if not ordered and not circuits:
            raise DialError(f"no dialable address for {peer_id} (known: {', '.join(known[:4])})")
        delay = 0.05
        last: BaseException | None = None
        with trio.move_on_at(deadline):
            for attempt in range(1, attempts + 1):
                try:
                    left = deadline - trio.current_time()
                    await self._dial_shared(peer_id, ordered, circuits, left)
                    return
                except (BaseLibp2pError, OSError, DialError) as exc:
                    last = exc
                    log.debug("dial %s attempt %d failed: %s", peer_id, attempt, exc)
                    if attempt < attempts:
                        await trio.sleep(delay)
                        delay *= 4
                finally:
                    # libp2p forgets every address of a peer when one answered with
                    # another identity (an old address, now someone else's)
                    if not self.known_addrs(peer_id):
                        self.remember(peer_id, [*ordered, *circuits])
        raise DialError(f"cannot connect to {peer_id}: {last or 'timed out'}")

    def _own_addrs(self) -> list[str]:
        try:
            bound = [str(a) for a in self._host.get_transport_addrs()]
        except OSError:
            bound = []
        return [*bound, *self.listen_addrs()]

    async def _dial_shared(
        self, peer_id: PeerID, addrs: list[str], circuits: list[str], timeout: float
    ) -> None:
        """One dial per peer at a time, run by the host, not by its caller: a caller
        that gives up (an expert call that came too late) leaves the dial going, so a
        slow or relayed peer still gets connected for the next call instead of never.
        A caller that finds a dial in flight to the same addresses waits for it; one
        that brings an address it lacks dials alongside (measured in the lab: a trainer
        given a volunteer's relay circuits waited 2-5 s for a DHT dial, begun earlier,
        to time out at an old or unreachable address)."""
        wanted = frozenset([*addrs, *circuits])
        while (pending := self._dialing.get(peer_id)) is not None and wanted <= pending.addrs:
            await pending.done.wait()
            if self.is_connected(peer_id):
                return
            if pending.error is not None:
                raise DialError(str(pending.error)) from pending.error
        if self.is_connected(peer_id):
            return
        dial = _Dial(trio.Event(), wanted)
        self._dialing[peer_id] = dial  # the newest: later callers wait for this one
        if self._dials is None:  # not running (yet): the caller dials
            await self._run_dial(peer_id, addrs, circuits, timeout, dial)
        else:
            self._dials.start_soon(self._run_dial, peer_id, addrs, circuits, timeout, dial)
            await dial.done.wait()
        if dial.error is not None:
            raise DialError(str(dial.error)) from dial.error

    async def _run_dial(
        self, peer_id: PeerID, addrs: list[str], circuits: list[str], timeout: float, dial: _Dial
    ) -> None:
        try:
            # at least the host's dial timeout, whatever the first caller allowed
            with trio.move_on_after(max(timeout, self._dial_timeout)) as scope:
                await self._dial_in_turn(peer_id, addrs, circuits)
            if scope.cancelled_caught:
                dial.error = DialError("timed out")
        except (DialError, BaseLibp2pError, OSError) as exc:
            dial.error = exc
        finally:
            if self._dialing.get(peer_id) is dial:
                del self._dialing[peer_id]
            dial.done.set()

    async def _dial_in_turn(self, peer_id: PeerID, addrs: list[str], circuits: list[str]) -> None:
        """Dial ``addrs`` in order, the next one when the previous failed or after
        ``STAGGER_S``; then the relay ``circuits``, once every direct dial failed or
        after ``CIRCUIT_AFTER_S``. The first connection made wins and the other dials
        are cancelled. (libp2p's own dial_peer would try only the first TCP address.)"""
        made: list[Any] = []
        errors: list[BaseException] = []
        direct_left = len(addrs)
        directs_failed = trio.Event()
        if not addrs:
            directs_failed.set()

        async def attempt(addr: str, failed: trio.Event, circuit: bool) -> None:
            nonlocal direct_left
            try:
                if circuit:
                    assert self.relayed_dialer is not None
                    conn = await self.relayed_dialer(peer_id, addr, CIRCUIT_TIMEOUT_S)
                else:
                    conn = await self._swarm.dial_addr(multiaddr.Multiaddr(addr), peer_id)
            except Exception as exc:  # noqa: BLE001 - a handshake that an attacker (or a
                # tampering relay) breaks raises whatever its crypto library raises
                log.debug("dial %s at %s failed: %r", peer_id, addr, exc)
                errors.append(exc)
                failed.set()
                if not circuit:
                    direct_left -= 1
                    if not direct_left:
                        directs_failed.set()
                return
            made.append(conn)
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                failed = trio.Event()
                nursery.start_soon(attempt, addr, failed, False)
                with trio.move_on_after(STAGGER_S):
                    await failed.wait()
            if circuits:
                with trio.move_on_after(CIRCUIT_AFTER_S):
                    await directs_failed.wait()
            for addr in circuits:
                failed = trio.Event()
                nursery.start_soon(attempt, addr, failed, True)
                with trio.move_on_after(STAGGER_S):
                    await failed.wait()
        for extra in made[1:]:  # two dials finished before the cancellation landed
            await _close_connection(extra)
        if not made:
            last = errors[-1] if errors else "no address answered"
            raise DialError(f"every address failed ({len(errors)}): {last}")

    def expect_punch(self, addrs: Sequence[str], peer_id: PeerID, seconds: float) -> None:
        """We take the Noise initiator's part in a hole punch to ``peer_id`` at ``addrs``
        (/ip4/.../tcp/...) for ``seconds``: a connection from there is its other half."""
        for addr in addrs:
            parts = addr.split("/")
            if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp" and parts[4].isdigit():
                self._gate.expect_punch((parts[2], int(parts[4])), peer_id, seconds)

    def forget_failures(self, peer_id: PeerID) -> None:
        """Let the next dial to ``peer_id`` really happen: libp2p refuses for 60 s to
        dial a peer whose addresses all failed once, whatever address is dialled next."""
        network = self._host.get_network()
        if isinstance(network, Swarm):
            network.unblock_peer(peer_id)

    async def disconnect(self, peer_id: PeerID) -> None:
        """Close every connection to ``peer_id`` (quietly: it may be gone already)."""
        try:
            await self._host.disconnect(peer_id)
        except (BaseLibp2pError, OSError) as exc:
            log.debug("error while disconnecting %s: %s", peer_id, exc)

    async def connect_addr(self, addr: str, *, timeout: float = 10.0) -> PeerID:
        """Connect to a full /p2p/ address; returns the peer's id."""
        info = parse_peer_addr(addr)
        await self.connect(info.peer_id, [str(a) for a in info.addrs], timeout=timeout)
        return info.peer_id

    async def new_stream(
        self, peer_id: PeerID, protocol: str, *, timeout: float = 10.0, attempts: int = 3
    ) -> Any:
        """A new stream to ``peer_id``, dialling first if needed."""
        if not self.is_connected(peer_id):
            await self.connect(peer_id, timeout=timeout, attempts=attempts)
        try:
            return await self._host.new_stream(peer_id, [TProtocol(protocol)])
        except (BaseLibp2pError, OSError) as exc:
            raise DialError(f"cannot open a {protocol} stream to {peer_id}: {exc}") from exc


async def _close_connection(conn: Any) -> None:
    try:
        await conn.close()
    except (BaseLibp2pError, OSError) as exc:
        log.debug("error while closing a connection: %s", exc)
