"""An in-process swarm for tests and benchmarks: ``async with open_swarm(n) as swarm``.

Shipped beside the real thing (like ``trio.testing``): every peer is a real libp2p host
on 127.0.0.1 with the real RPC and DHT; only the process is shared.
"""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import msgpack
import trio
from libp2p.transport.tcp.tcp import TCP

from net.dht import NamespacedValidator
from net.identity import Identity
from net.peer import Peer, PeerConfig
from net.transport.host import SwarmHost


def dial_from(host: SwarmHost, source_ip: str) -> SwarmHost:
    """Make ``host``'s TCP dials leave from ``source_ip`` (e.g. 127.0.0.2): loopback has
    2**24 addresses, so a test's stranger can come from an address of its own, as on the
    internet, and limits per source address see what they would see there."""
    manager = host.libp2p_host.get_network().transport_manager
    for transport in manager.get_transports():
        if isinstance(transport, TCP):
            transport.dial = partial(transport.dial_with_source, source=(source_ip, 0))  # type: ignore[method-assign]
    return host


def raw_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """A request frame with any header at all (net.rpc.frames's encoder would refuse most of
    what hostile tests send)."""
    raw: bytes = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">2sBBI", b"MH", 1, 1, len(raw)) + raw + payload


@dataclass
class Swarm:
    peers: list[Peer] = field(default_factory=list)
    nursery: trio.Nursery | None = None
    validator: NamespacedValidator | None = None
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)

    def node(self, i: int) -> Peer:
        return self.peers[i]

    def __len__(self) -> int:
        return len(self.peers)

    async def add(
        self,
        identity: Identity | None = None,
        config: PeerConfig | None = None,
        validator: NamespacedValidator | None = None,
    ) -> Peer:
        """Start one more peer, bootstrapped through peer 0 and up to two random others."""
        assert self.nursery is not None
        live = [p for p in self.peers if id(p) in self._scopes]
        boots = [live[0].addrs()[0]] if live else []
        boots += [p.addrs()[0] for p in random.sample(live[1:], min(2, max(0, len(live) - 1)))]
        base = config or PeerConfig()
        config = replace(base, bootstrap=tuple(dict.fromkeys(boots)) or base.bootstrap)
        peer = Peer(identity or Identity.generate(), config, validator=validator or self.validator)
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[Peer] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await peer.run(task_status=task_status)

        await self.nursery.start(run)
        self._scopes[id(peer)] = scope
        self.peers.append(peer)
        return peer

    def stop(self, peer: Peer) -> None:
        """Stop one peer (its host closes all its connections)."""
        self._scopes.pop(id(peer)).cancel()

    def running(self) -> list[Peer]:
        return [p for p in self.peers if id(p) in self._scopes]


@asynccontextmanager
async def open_swarm(
    n: int,
    config_factory: Callable[[int], PeerConfig] | None = None,
    *,
    validator: NamespacedValidator | None = None,
) -> AsyncIterator[Swarm]:
    """``n`` peers; ``validator`` (the DHT namespaces they accept) applies to all of them."""
    async with trio.open_nursery() as nursery:
        swarm = Swarm(nursery=nursery, validator=validator)
        for i in range(n):
            await swarm.add(config=config_factory(i) if config_factory else None)
        try:
            yield swarm
        finally:
            nursery.cancel_scope.cancel()


async def count_connections(
    ip: str, ports: int, counts: list[int], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """A third party that hostile tests and benchmarks aim strangers at: ``ports`` TCP
    listeners on ``ip`` (a loopback address of its own) counting who connects in
    ``counts[0]``; started with ``nursery.start``, it answers the ports' numbers."""

    async def handler(stream: trio.SocketStream) -> None:
        counts[0] += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = []
        for _ in range(ports):
            listeners += await trio.open_tcp_listeners(0, host=ip)
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, handler, [listener])
        task_status.started([lst.socket.getsockname()[1] for lst in listeners])
