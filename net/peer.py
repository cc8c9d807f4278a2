"""A swarm peer: libp2p host + framed RPC + DHT, as one service with one owner nursery."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import trio

from net._libp2p import PeerID
from net.dht import DhtConfig, DhtError, DhtNode, NamespacedValidator
from net.identity import Identity
from net.reach.addressbook import AddressBook
from net.reach.circuit import dial_relayed
from net.reach.holepunch import HolePuncher
from net.reach.portmap import PortMapConfig, PortMapper
from net.reach.reachability import (
    DialBackService,
    Reachability,
    ReachabilityConfig,
    ReachabilityMonitor,
    Verdict,
    tcp_ports,
)
from net.reach.relay import RelayLimits, RelayService
from net.reach.relay_client import RelayClient, RelayClientConfig
from net.rpc import CallContext, Reply, RpcConfig, RpcService
from net.transport.admission import AdmissionLimits
from net.transport.host import (
    DEFAULT_LISTEN,
    AddressError,
    SwarmHost,
    is_loopback_addr,
    parse_peer_addr,
)
from net.transport.inbound import StreamLimits
from net.transport.keepalive import Keepalive

log = logging.getLogger(__name__)

#: Every peer answers this: round-trip and upload measurements, liveness checks.
PING = "net.ping"


async def _ping(ctx: CallContext) -> Reply:
    """Answers with the number of payload bytes received (never echoes them back, so a
    ping cannot be used to make a peer send data)."""
    return Reply({"bytes": sum(t.nbytes for t in ctx.request.tensors)})


@dataclass(frozen=True)
class PeerConfig:
    listen: Sequence[str] = DEFAULT_LISTEN
    bootstrap: Sequence[str] = ()
    rpc: RpcConfig = field(default_factory=RpcConfig)
    dht: DhtConfig = field(default_factory=DhtConfig)
    #: How long run() waits for the first bootstrap before it reports started anyway
    #: (the DHT keeps retrying in the background).
    bootstrap_timeout: float = 15.0
    #: Who may connect, and how many streams they may hold (net/transport/admission.py).
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    streams: StreamLimits = field(default_factory=StreamLimits)
    #: How soon a connection that died silently is dropped (net/transport/keepalive.py).
    keepalive: Keepalive = field(default_factory=Keepalive)
    #: Learn from peers' dial-backs whether we can be dialled, and answer theirs
    #: (net/reach/reachability.py); None: neither (tests of other things, one-shot tools).
    reachability: ReachabilityConfig | None = None
    #: Relay for others while we are reachable (net/reach/relay.py); None: never.
    relay: RelayLimits | None = None
    #: Keep reservations on relays while we cannot be dialled; None: never. Both need
    #: ``reachability``.
    relay_client: RelayClientConfig | None = None
    #: Publish our addresses as a signed DHT record (net/reach/addressbook.py); any peer
    #: looks others' records up when it knows no address of theirs.
    address_record: bool = False
    #: Ask the home router to forward our port (UPnP IGD, net/reach/portmap.py); None: never.
    #: Needs ``reachability``, which learns from dial-backs whether it worked.
    port_mapping: PortMapConfig | None = None


def network_config(
    listen: Sequence[str],
    bootstrap: Sequence[str],
    *,
    relay: bool = False,
    port_mapping: bool = False,
) -> PeerConfig:
    """The configuration of a role's peer: it publishes its addresses; on loopback
    only, that is all; listening beyond this computer, it also learns whether it can be
    dialled, keeps places on relays while it cannot, (``relay``) relays for others
    while it can, and (``port_mapping``) asks its router to forward its port."""
    local = all(is_loopback_addr(a) for a in listen)
    return PeerConfig(
        listen=tuple(listen),
        bootstrap=tuple(bootstrap),
        reachability=None if local else ReachabilityConfig(),
        relay_client=None if local else RelayClientConfig(),
        relay=RelayLimits() if relay and not local else None,
        # on loopback too: a manifest may list an aggregator by its key alone, and its
        # peers find where to dial it in its record
        address_record=True,
        port_mapping=PortMapConfig() if port_mapping and not local else None,
    )


class Peer:
    """Use as a service::

    async with trio.open_nursery() as nursery:
        peer = await nursery.start(Peer(identity, config).run)
        await peer.dht.put(...)
        nursery.cancel_scope.cancel()      # stops everything, closes connections
    """

    def __init__(
        self,
        identity: Identity,
        config: PeerConfig | None = None,
        *,
        validator: NamespacedValidator | None = None,
    ) -> None:
        self.identity = identity
        self.config = config or PeerConfig()
        self.host = SwarmHost(
            identity,
            self.config.listen,
            admission=self.config.admission,
            streams=self.config.streams,
            keepalive=self.config.keepalive,
        )
        self.rpc = RpcService(self.host, self.config.rpc)
        self.dht = DhtNode(identity, self.host, self.rpc, validator, self.config.dht)
        self.rpc.register(PING, _ping)
        self.addressbook = AddressBook(
            self.dht, self.host.announce_addrs, publish=self.config.address_record
        )
        self.host.resolver = self.addressbook.resolve
        self.reachability: ReachabilityMonitor | None = None
        #: told every new reachability verdict (after our announced addresses changed)
        self.reachability_listeners: list[Callable[[Verdict], None]] = []
        self._dial_backs: DialBackService | None = None
        # any peer can reach others through their relays, and answer hole punches
        self.host.relayed_dialer = partial(dial_relayed, self.host)
        self.holepunch = HolePuncher(self.host, self._observed_addrs)
        self.relay: RelayService | None = None
        self.relay_client: RelayClient | None = None
        #: told our relayed addresses whenever they change
        self.relayed_listeners: list[Callable[[list[str]], None]] = []
        self.port_mapper: PortMapper | None = None
        if self.config.reachability is not None:
            self.reachability = ReachabilityMonitor(
                self.rpc, self.host, self.config.reachability, on_change=self._reached
            )
            self._dial_backs = DialBackService(self.rpc, self.config.reachability)
            if self.config.relay is not None:
                self.relay = RelayService(
                    self.host,
                    self.config.relay,
                    enabled=lambda: self._verdict_is(Reachability.PUBLIC),
                )
            if self.config.relay_client is not None:
                self.relay_client = RelayClient(
                    self.host,
                    candidates=self._relay_candidates,
                    wanted=lambda: self._verdict_is(Reachability.PRIVATE),
                    config=self.config.relay_client,
                    on_change=self._relayed,
                    on_circuit=self.holepunch.punch,
                )
            if self.config.port_mapping is not None:
                self.port_mapper = PortMapper(
                    lambda: tcp_ports(self.host.listen_addrs()),
                    self.config.port_mapping,
                    on_change=self._mapped,
                )

    def _verdict_is(self, reachability: Reachability) -> bool:
        return (
            self.reachability is not None and self.reachability.verdict.reachability is reachability
        )

    def _reached(self, verdict: Verdict) -> None:
        self.host.set_public_addrs(verdict.public_addrs)
        if self.relay_client is not None:
            self.relay_client.wake()
        for listener in self.reachability_listeners:
            listener(verdict)

    def _observed_addrs(self) -> list[str]:
        """Where the internet sees our listeners: the addresses peers dialled us back
        on, or our router's address with our own ports (a NAT that keeps ports)."""
        if self.reachability is None:
            return []
        verdict = self.reachability.verdict
        if verdict.public_addrs:
            return list(verdict.public_addrs)
        if verdict.observed_ip is None:
            return []
        return [f"/ip4/{verdict.observed_ip}/tcp/{p}" for p in tcp_ports(self.host.listen_addrs())]

    def _mapped(self, external_ports: list[int]) -> None:
        """The router forwards these ports to us now: have peers dial us back there."""
        if self.reachability is not None:
            self.reachability.extra_ports = external_ports
            self.reachability.recheck_soon()

    def _relayed(self, addrs: list[str]) -> None:
        self.host.set_relayed_addrs(addrs)
        for listener in self.relayed_listeners:
            listener(addrs)

    def _relay_candidates(self) -> list[PeerID]:
        """Peers to ask for a reservation: our bootstrap peers first (public by
        design), then those we are connected to, then the rest of the routing table."""
        boot = []
        for addr in self.config.bootstrap:
            try:
                boot.append(parse_peer_addr(addr).peer_id)
            except AddressError:
                continue
        connected = self.host.connected_peers()
        random.shuffle(connected)
        known = self.dht.known_peers()
        return [p for p in dict.fromkeys([*boot, *connected, *known]) if p != self.peer_id]

    @property
    def peer_id(self) -> PeerID:
        return self.host.peer_id

    def addrs(self) -> list[str]:
        return self.host.addrs()

    async def run(self, *, task_status: trio.TaskStatus[Peer] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.host.running():
            self.rpc.attach()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.dht.run)
                    if self.config.bootstrap:
                        try:
                            await self.dht.bootstrap(
                                self.config.bootstrap, timeout=self.config.bootstrap_timeout
                            )
                        except DhtError as exc:
                            log.warning("%s; will retry in the background", exc)
                    if self._dial_backs is not None and self.reachability is not None:
                        await nursery.start(self._dial_backs.run)
                        nursery.start_soon(self.reachability.run)
                    await nursery.start(self.holepunch.run)
                    await nursery.start(self.addressbook.run)
                    if self.relay is not None:
                        await nursery.start(self.relay.run)
                    if self.relay_client is not None:
                        await nursery.start(self.relay_client.run)
                    if self.port_mapper is not None:
                        await nursery.start(self.port_mapper.run)
                    log.debug("peer %s listening on %s", self.host.peer_id, ", ".join(self.addrs()))
                    task_status.started(self)
                    await trio.sleep_forever()
            finally:
                self.rpc.close()


@asynccontextmanager
async def running_last(peer: Peer) -> AsyncIterator[Peer]:
    """Run ``peer`` around the body and stop it only after the body has finished, also
    when the whole thing is cancelled: the services on top get to say goodbye (withdraw
    their DHT records, flush) over a peer that still works."""
    shield = trio.CancelScope(shield=True)

    async def run(*, task_status: trio.TaskStatus[Peer]) -> None:
        with shield:
            await peer.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        try:
            yield peer
        finally:
            shield.cancel()
