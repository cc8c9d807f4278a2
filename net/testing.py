"""An in-process swarm for tests and benchmarks: ``async with open_swarm(n) as swarm``.

Shipped beside the real thing (like ``trio.testing``): every peer is a real libp2p host
on 127.0.0.1 with the real RPC and DHT; only the process is shared.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from net.dht import NamespacedValidator
from net.identity import Identity
from net.peer import Peer, PeerConfig


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
