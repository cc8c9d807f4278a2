"""Circuit relay, the client's side (the wire format: net/reach/circuit.py; the relay:
net/reach/relay.py). py-libp2p 0.8.1's client renews reservations only after they expired
(docs/decisions/007); this client is ours.

- **Client** (:class:`RelayClient`): a peer that learned it cannot be dialled keeps
  reservations on ``relays`` peers, renews them at half their life, replaces a relay
  whose connection ended, accepts circuits only from its relays, and gives its relayed
  addresses (``<relay address>/p2p/<relay>/p2p-circuit``) to announce.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p.connection_types import ConnectionType
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, StopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import Status as Code

from net._libp2p import PeerID
from net.reach.circuit import (
    HOP,
    STOP,
    RelayError,
    _readable_addr,
    _status,
    circuit_addr,
    read_message,
    reset_quietly,
    seen_ip,
    write_message,
)
from net.transport.host import DialError, SwarmHost

log = logging.getLogger(__name__)


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
