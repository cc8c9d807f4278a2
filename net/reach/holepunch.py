"""Hole punching: two peers that met through a relay open a direct TCP connection by
dialling each other at the same moment (a TCP simultaneous open through both NATs).

The exchange is libp2p's DCUtR (``/libp2p/dcutr``, its protobuf from py-libp2p), driven
from one side only. py-libp2p 0.8.1's DCUtR starts from both sides at once and cannot
be turned off once run (docs/decisions/007), so this is ours; its swarm's
``dial_addr_as_responder`` gives the fixed Noise roles a simultaneous open needs.

1. B, the peer that accepted a relayed connection (it is behind NAT: that is why it
   has a relay), opens a DCUtR stream over it and sends CONNECT with the address the
   internet sees it at (its router's address, its own port: a NAT that keeps ports).
2. A answers CONNECT with its own; B measures the round trip.
3. B sends SYNC and waits half a round trip; A dials B's address when SYNC arrives,
   B dials A's then: both SYNs cross the NATs at about the same time, each opening
   the way for the other. Both dial from their listening port (SO_REUSEPORT), the
   port their NAT showed the world. A is the Noise initiator, B the responder;
   when B's SYN reaches A before A's leaves (A is slow, or A's NAT kept the way open
   since an earlier attempt), A's listener accepts it and A still initiates.
   A that does not know its own address yet (it met B, through a DHT lookup, before
   its reachability was known) answers CONNECT with none: B asks again later.
4. Once a direct connection exists, the relayed one is closed after a grace period
   (calls in flight finish; new streams already take the direct connection).

A NAT that picks a new port for every destination (symmetric, many carrier NATs)
defeats this; the relayed connection then stays (within the relay's limits).

Anyone can open a circuit to a peer behind NAT (issue 35): its punch used to dial
whatever the other side named (a third party, its own router's LAN port, the relay's
host on any port) and told that side the home's public address. So each side dials
only addresses on the IP the relay saw the other at (the relay is in the circuit
message: net/reach/relay.py), and B punches (and names its address) only for the peers
``allowed`` says it chose to talk to.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.connection_types import ConnectionType
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch

from net._libp2p import PeerID
from net.reach.circuit import RelayError, read_message, reset_quietly, write_message
from net.transport.host import SwarmHost

log = logging.getLogger(__name__)

PROTOCOL = "/libp2p/dcutr"
_MAX_ADDRS = 8


@dataclass(frozen=True)
class HolePunchConfig:
    attempts: int = 3
    #: one exchange and its dials (a SYN that a NAT drops waits for this long)
    attempt_s: float = 5.0
    #: the relayed connection stays this long once a direct one exists
    grace_s: float = 5.0
    #: a peer that does not know its own address yet (it met us before learning it)
    #: is asked again, after 1, 2, 4 ... s, this long at most
    address_patience_s: float = 60.0


@dataclass
class HolePunchStatistics:
    attempts: int = 0
    succeeded: int = 0
    failed: int = 0


class HolePuncher:
    """Answers DCUtR streams (side A) and punches from side B after a relayed
    connection came in (:meth:`punch`). ``observed()`` names the addresses the
    internet sees us at (``/ip4/<router>/tcp/<our port>``)."""

    def __init__(
        self,
        host: SwarmHost,
        observed: Callable[[], Sequence[str]],
        config: HolePunchConfig | None = None,
    ) -> None:
        self.host = host
        self.observed = observed
        self.config = config or HolePunchConfig()
        self.stats = HolePunchStatistics()
        #: the peers whose relayed connections we punch (and tell our address to): a
        #: node serving a project sets it to the project's trainers and aggregators
        self.allowed: Callable[[PeerID], bool] = lambda peer: True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host.set_stream_handler(PROTOCOL, self._answer)
        task_status.started()
        await trio.sleep_forever()

    # ---------------------------------------------------------------- side B

    async def punch(self, peer: PeerID, seen_at: str | None = None) -> bool:
        """Try to replace our relayed connection to ``peer`` with a direct one; only
        addresses on ``seen_at`` (the IP its relay saw it at) are dialled."""
        if not self.allowed(peer) or seen_at is None:
            log.debug("no hole punch for %s (not a peer we talk to, or not seen)", peer)
            return False
        attempt = 0
        wait, patience = 1.0, trio.current_time() + self.config.address_patience_s
        while attempt < self.config.attempts and self.host.is_connected(peer):
            if self.direct_connection(peer) is not None:
                break
            no_address = False
            with trio.move_on_after(self.config.attempt_s):
                try:
                    await self._attempt(peer, seen_at)
                except _NoAddress:
                    no_address = True
                except (RelayError, OSError, Exception) as exc:  # noqa: BLE001 - a failed
                    # round (the relay closed, the peer left, a handshake broke) is retried
                    log.debug("hole punch %d to %s failed: %r", attempt + 1, peer, exc)
            if no_address:
                # it met us (a DHT lookup, say) before it learned where it is seen from:
                # ask again later, without spending an attempt
                if trio.current_time() + wait > patience:
                    break
                log.debug("%s does not know its address yet; asking in %g s", peer, wait)
                await trio.sleep(wait)
                wait *= 2
                continue
            attempt += 1
            self.stats.attempts += 1
            if self.direct_connection(peer) is not None:
                break
        direct = self.direct_connection(peer)
        if direct is None:
            self.stats.failed += 1
            log.info("no direct connection to %s: it stays relayed", peer)
            return False
        self.stats.succeeded += 1
        log.info("direct connection to %s after hole punching", peer)
        await trio.sleep(self.config.grace_s)
        await self._close_relayed(peer)
        return True

    async def _attempt(self, peer: PeerID, seen_at: str) -> None:
        stream = await self.host.libp2p_host.new_stream(peer, [PROTOCOL])
        try:
            started = trio.current_time()
            await write_message(stream, _connect(self.observed()))
            answer = await read_message(stream, HolePunch)
            rtt = trio.current_time() - started
            if answer.type != HolePunch.CONNECT:
                raise RelayError("expected CONNECT")
            theirs = _on(_addrs(answer.ObsAddrs), seen_at)
            if not theirs:  # no SYNC: it does not dial either
                raise _NoAddress("the peer gave no address to punch to")
            await write_message(stream, HolePunch(type=HolePunch.SYNC))
        finally:
            await _close(stream)
        await trio.sleep(rtt / 2)
        await self._dial(peer, theirs, as_responder=True)

    # ---------------------------------------------------------------- side A

    async def _answer(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        # the spec: only over a relayed connection; and only with a peer we chose to
        # talk to (we dialled it, or it is allowed): a stranger who came in through our
        # relay and punched as side B would learn our address and aim our dials
        if not _over_relay(stream) or not (_we_dialled(stream) or self.allowed(peer)):
            await reset_quietly(stream)
            return
        try:
            with trio.fail_after(self.config.attempt_s):
                offer = await read_message(stream, HolePunch)
                if offer.type != HolePunch.CONNECT:
                    raise RelayError("expected CONNECT")
                await write_message(stream, _connect(self.observed()))
                sync = await read_message(stream, HolePunch)
                if sync.type != HolePunch.SYNC:
                    raise RelayError("expected SYNC")
                # only where the relay we reached it through saw it
                theirs = _on(_addrs(offer.ObsAddrs), self.host.seen_by_relay(peer))
                await _close(stream)
                if theirs:
                    # B's SYN may reach us before ours leaves (we are slow, or our NAT
                    # kept the way open since a former attempt): our listener then
                    # accepts it, and must initiate Noise as this dial would have
                    self.host.expect_punch(theirs, peer, self.config.attempt_s)
                    await self._dial(peer, theirs, as_responder=False)
        except Exception as exc:  # noqa: BLE001 - a failed punch ends only itself
            log.debug("hole punch from %s failed: %r", peer, exc)
            await reset_quietly(stream)

    # ---------------------------------------------------------------- both

    async def _dial(self, peer: PeerID, addrs: list[str], *, as_responder: bool) -> None:
        swarm = self.host.libp2p_host.get_network()
        source = _listen_source(self.host)
        dial = swarm.dial_addr_as_responder if as_responder else swarm.dial_addr
        for addr in addrs:
            try:
                await dial(multiaddr.Multiaddr(addr), peer, source)
                return
            except Exception as exc:  # noqa: BLE001 - the next address, or the next round
                log.debug("punching %s at %s: %r", peer, addr, exc)

    def direct_connection(self, peer: PeerID) -> Any | None:
        for conn in self.host.libp2p_host.get_network().connections.get(peer, []):
            if not conn.is_closed and conn.get_connection_type() != ConnectionType.RELAYED:
                return conn
        return None

    async def _close_relayed(self, peer: PeerID) -> None:
        for conn in list(self.host.libp2p_host.get_network().connections.get(peer, [])):
            if conn.get_connection_type() == ConnectionType.RELAYED:
                try:
                    await conn.close()
                except Exception as exc:  # noqa: BLE001 - it may be gone already
                    log.debug("closing the relayed connection to %s: %r", peer, exc)


class _NoAddress(RelayError):
    """The peer does not know where the internet sees it (yet)."""


def _listen_source(host: SwarmHost) -> tuple[str, int] | None:
    """The (ip, port) our first IPv4 TCP listener is bound to, as bound (0.0.0.0 for
    every interface): a punch leaves from there, the port the NAT showed the world."""
    for addr in host.libp2p_host.get_transport_addrs():
        parts = str(addr).split("/")
        if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp" and parts[4].isdigit():
            return parts[2], int(parts[4])
    return None


def _connect(addrs: Sequence[str]) -> HolePunch:
    return HolePunch(
        type=HolePunch.CONNECT,
        ObsAddrs=[multiaddr.Multiaddr(a).to_bytes() for a in list(addrs)[:_MAX_ADDRS]],
    )


def _addrs(raw: Sequence[bytes]) -> list[str]:
    """The peer's IPv4 TCP addresses, checked: at most a few, no unspecified, loopback
    or multicast address (a punch is never aimed at this computer or at everyone)."""
    out = []
    for item in list(raw)[:_MAX_ADDRS]:
        try:
            parts = str(multiaddr.Multiaddr(item)).split("/")
            ip = ipaddress.IPv4Address(parts[2])
        except Exception:  # noqa: BLE001, S112 - an address we cannot read is skipped
            continue
        if parts[1] != "ip4" or len(parts) < 5 or parts[3] != "tcp" or not parts[4].isdigit():
            continue
        if ip.is_unspecified or ip.is_loopback or ip.is_multicast:
            continue
        out.append(f"/ip4/{ip}/tcp/{int(parts[4])}")
    return out


def _on(addrs: list[str], ip: str | None) -> list[str]:
    """The addresses on ``ip`` (none when it is not known)."""
    return [a for a in addrs if ip is not None and a.split("/")[2] == ip]


def _raw_of(muxed: Any) -> Any:
    """The RawConnection under a Yamux connection (Noise read-writer, then raw)."""
    return getattr(getattr(getattr(muxed, "secured_conn", None), "conn", None), "conn", None)


def _we_dialled(stream: Any) -> bool:
    """Whether our side opened the (secured) connection the stream runs on."""
    secured = getattr(getattr(stream, "muxed_conn", None), "secured_conn", None)
    return getattr(secured, "is_initiator", False) is True


def _over_relay(stream: Any) -> bool:
    raw = _raw_of(getattr(stream, "muxed_conn", None))
    return getattr(raw, "_connection_type", None) is ConnectionType.RELAYED


async def _close(stream: Any) -> None:
    try:
        await stream.close()
    except Exception as exc:  # noqa: BLE001 - closing a stream that is gone
        log.debug("closing a dcutr stream: %r", exc)
