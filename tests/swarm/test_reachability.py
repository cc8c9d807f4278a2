"""Dial-backs on loopback: the server dials the address a request came from, checks the
requester's peer id, bounds what a requester may ask, and never answers from a cache.
(Behind a real NAT: tests/nat/test_reachability.py.)"""

from __future__ import annotations

import socket

import pytest
import trio

from net import BadRequest, CallContext, Identity, Peer, PeerConfig, RateLimited, Reply
from net.reach.reachability import (
    DIAL_BACK,
    DialBackService,
    Reachability,
    ReachabilityConfig,
    ReachabilityMonitor,
    tcp_ports,
)
from tests.waiting import eventually


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_dial_back_reaches_a_listening_peer_and_not_a_closed_port():
    config = ReachabilityConfig(dial_timeout_s=3)
    async with trio.open_nursery() as nursery:
        server: Peer = await nursery.start(Peer(Identity.generate()).run)
        service = DialBackService(server.rpc, config)
        await nursery.start(service.run)
        client: Peer = await nursery.start(Peer(Identity.generate()).run)
        client.host.remember(server.peer_id, server.host.listen_addrs())
        (port,) = tcp_ports(client.host.listen_addrs())
        dead = closed_port()

        # a failure first: the next dial-back to the same peer must still really dial
        # (libp2p would answer it from its 60-second negative cache)
        reply = await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": [dead]})
        assert {k: v for k, v in reply.meta.items() if k != "dialer"} == {
            "observed": "127.0.0.1",
            "reachable": [],
            "tried": [dead],
        }
        reply = await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": [port, dead]})
        assert reply.meta["reachable"] == [port]
        assert service.served == 2
        nursery.cancel_scope.cancel()


async def test_requests_are_bounded_and_rate_limited_per_address():
    config = ReachabilityConfig(dial_timeout_s=3, per_ip_burst=2, per_ip_every_s=3600)
    async with trio.open_nursery() as nursery:
        server: Peer = await nursery.start(Peer(Identity.generate()).run)
        service = DialBackService(server.rpc, config)
        await nursery.start(service.run)
        client: Peer = await nursery.start(Peer(Identity.generate()).run)
        client.host.remember(server.peer_id, server.host.listen_addrs())
        for bad in ([0], [70000], ["4001"], [True], list(range(1, 10)), "4001", None):
            with pytest.raises(BadRequest):
                await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": bad})
        # only asking where we are seen from: no dial, so no budget spent
        for _ in range(5):
            reply = await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": []})
            assert reply.meta["observed"] == "127.0.0.1"
            assert reply.meta["tried"] == []
        # dial-backs: a burst of two, then refused
        ports = tcp_ports(client.host.listen_addrs())
        for _ in range(2):
            reply = await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": ports})
            assert reply.meta["reachable"] == ports
        with pytest.raises(RateLimited):
            await client.rpc.call(server.peer_id, DIAL_BACK, {"ports": ports})
        assert service.refused == 8
        assert service.served == 7
        nursery.cancel_scope.cancel()


async def test_peers_with_reachability_on_learn_they_are_reachable():
    config = ReachabilityConfig(dial_timeout_s=3, unknown_recheck_s=0.2)
    async with trio.open_nursery() as nursery:
        first: Peer = await nursery.start(
            Peer(Identity.generate(), PeerConfig(reachability=config)).run
        )
        second: Peer = await nursery.start(
            Peer(
                Identity.generate(), PeerConfig(bootstrap=tuple(first.addrs()), reachability=config)
            ).run
        )
        monitor = second.reachability
        assert isinstance(monitor, ReachabilityMonitor)
        await eventually(lambda: monitor.verdict.reachability is Reachability.PUBLIC, 20)
        (port,) = tcp_ports(second.host.listen_addrs())
        assert monitor.verdict.public_addrs == (f"/ip4/127.0.0.1/tcp/{port}",)
        assert second.host.announce_addrs()[0] == f"/ip4/127.0.0.1/tcp/{port}"
        nursery.cancel_scope.cancel()


async def test_a_dial_back_that_never_came_is_not_believed():
    """Issue 35, finding 4: one answer was proof, on the answering peer's word: a
    volunteer behind NAT was told it was public at an address the attacker chose, took
    no relay place and was unreachable. A port counts only when the dialer named in the
    answer came in on it, and an address only when two sources agree on it."""

    async def liar(ctx: CallContext) -> Reply:
        ports = list(ctx.request.meta.get("ports") or [])
        # "reached you" with nobody dialling (its own id as the dialer, a plausible one)
        return Reply(
            {
                "observed": "198.18.0.66",
                "reachable": ports,
                "tried": ports,
                "dialer": ctx.peer_id.to_bytes(),
            }
        )

    config = ReachabilityConfig(dial_timeout_s=3)
    async with trio.open_nursery() as nursery:
        liars = []
        for _ in range(2):
            peer: Peer = await nursery.start(Peer(Identity.generate()).run)
            peer.rpc.register(DIAL_BACK, liar)
            liars.append(peer)
        client: Peer = await nursery.start(Peer(Identity.generate()).run)
        monitor = ReachabilityMonitor(client.rpc, client.host, config)
        for peer in liars:
            await client.host.connect(peer.peer_id, peer.host.listen_addrs())
        verdict = await monitor.check_once()
        assert verdict.reachability is Reachability.UNKNOWN
        assert verdict.public_addrs == ()
        # an honest server's dial-back is believed, and with a second source the
        # address it saw is ours
        honest: Peer = await nursery.start(Peer(Identity.generate()).run)
        await nursery.start(DialBackService(honest.rpc, config).run)
        await client.host.connect(honest.peer_id, honest.host.listen_addrs())
        answer = await monitor._ask(honest.peer_id, tcp_ports(client.host.listen_addrs()))
        assert answer is not None
        assert answer.reachable_ports == tuple(tcp_ports(client.host.listen_addrs()))
        (lie,) = [await monitor._ask(liars[0].peer_id, [answer.tried_ports[0]])]
        assert lie is not None
        assert lie.reachable_ports == ()
        nursery.cancel_scope.cancel()
