"""Bare swarm peers for the command line: a bootstrap node, one-shot DHT reads and writes."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from core.namespaces import moehome_validator
from net import DhtConfig, DhtError, Identity, NamespacedValidator, Peer, PeerConfig
from net.reach import PortMapConfig, ReachabilityConfig, RelayClientConfig, RelayLimits, Verdict
from net.transport import EVERY_INTERFACE, Keepalive

log = logging.getLogger(__name__)


def print_addresses(peer: Peer) -> None:
    """The peer's full addresses on standard output, one per line: the first line a
    long-running command prints, for scripts and tests to read."""
    for addr in peer.addrs():
        sys.stdout.write(addr + "\n")
    sys.stdout.flush()


async def run_peer(
    identity: Identity,
    listen: Sequence[str] | None,
    bootstrap: Sequence[str],
    reachability: ReachabilityConfig | None = None,
    *,
    map_port: bool = False,
    relay_limits: RelayLimits | None = None,
    keepalive: Keepalive | None = None,
) -> None:
    """Serve DHT and RPC until cancelled; print our addresses on stdout for scripts, then
    a JSON line for each new reachability verdict (and our relayed addresses). With
    ``map_port``, the home router is asked to forward the listening port."""
    config = PeerConfig(
        listen=tuple(listen or EVERY_INTERFACE),
        bootstrap=tuple(bootstrap),
        reachability=reachability or ReachabilityConfig(),
        # a bootstrap peer is public by design: it relays for those behind NAT, and
        # one that turns out not to be dialable keeps reservations itself
        relay=relay_limits or RelayLimits(),
        relay_client=RelayClientConfig(),
        address_record=True,
        port_mapping=PortMapConfig() if map_port else None,
        keepalive=keepalive or Keepalive(),
    )
    # the swarm's records are checked here too: a bootstrap peer stores its share
    peer = Peer(identity, config, validator=moehome_validator())
    peer.reachability_listeners.append(print_verdict)
    peer.relayed_listeners.append(print_relayed)
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.run)
        print_addresses(peer)
        # SIGTERM (a supervisor, a test) stops as cleanly as Ctrl-C: a port the router
        # forwards for us is closed again
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


def print_verdict(verdict: Verdict) -> None:
    line = {
        "reachability": verdict.reachability.value,
        "observed_ip": verdict.observed_ip,
        "public_addrs": list(verdict.public_addrs),
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def print_relayed(addrs: list[str]) -> None:
    sys.stdout.write(json.dumps({"relayed_addrs": addrs}) + "\n")
    sys.stdout.flush()


@asynccontextmanager
async def joined_client(
    identity: Identity, bootstrap: Sequence[str], validator: NamespacedValidator | None = None
) -> AsyncIterator[Peer]:
    """A short-lived peer in client mode (it asks the DHT but is never asked)."""
    if not bootstrap:
        raise DhtError("give at least one --bootstrap address of a running peer")
    config = PeerConfig(dht=DhtConfig(server_mode=False))
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(identity, config, validator=validator).run)
        await peer.dht.bootstrap(bootstrap)
        yield peer
        nursery.cancel_scope.cancel()


async def dht_get(identity: Identity, bootstrap: Sequence[str], key: str) -> list[dict[str, Any]]:
    async with joined_client(identity, bootstrap) as peer:
        records = await peer.dht.get(key)
    now = time.time()
    return [
        {
            "key": r.key,
            "author": str(r.author_peer_id),
            "value": r.value.decode(errors="replace"),
            "timestamp": r.timestamp_ms / 1000,
            "expires_in_s": r.expires_ms / 1000 - now,
        }
        for r in records
    ]


async def dht_put(
    identity: Identity, bootstrap: Sequence[str], key: str, value: bytes, ttl: float
) -> int:
    async with joined_client(identity, bootstrap) as peer:
        return await peer.dht.put(key, value, ttl)
