"""Dialling a peer at the addresses it gave: the right one is found whatever comes
first, Identify never gives 0.0.0.0, and every connection has keepalive on (a dead one
is noticed in seconds). (Behind a NAT whose address changes: tests/nat.)"""

from __future__ import annotations

import contextlib
import socket

import trio
from libp2p.peer.peerstore import PeerStoreError

from net import Identity
from net.transport.host import DialError, SwarmHost, interface_addresses
from net.transport.keepalive import Keepalive, socket_of
from tests.waiting import eventually


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def silent_listener(*, task_status: trio.TaskStatus[int]) -> None:
    """Accepts TCP connections and never says a word (a wrong or dead address that
    still completes the TCP handshake: the Noise handshake would wait its whole
    timeout)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    held = []
    while True:
        held.append(await listeners[0].accept())


async def test_a_peer_is_reached_at_its_working_address_whatever_comes_first():
    async with trio.open_nursery() as nursery:
        silent = await nursery.start(silent_listener)
        other = SwarmHost(Identity.generate())  # a different peer (an address now reused)
        b = SwarmHost(Identity.generate())
        async with SwarmHost(Identity.generate()).running() as a, other.running(), b.running():
            good = b.listen_addrs()
            bad = [
                f"/ip4/127.0.0.1/tcp/{closed_port()}",  # refused
                f"/ip4/127.0.0.1/tcp/{silent}",  # silent: the next is dialled meanwhile
                other.listen_addrs()[0],  # another identity: Noise refuses
                "/ip4/0.0.0.0/tcp/1",  # never dialled
            ]
            # libp2p 0.8.1 would dial only the first of these TCP addresses
            await a.connect(b.peer_id, [*bad, *good], timeout=5, attempts=1)
            assert a.is_connected(b.peer_id)
            # the addresses are still known after a wrong identity answered one
            assert set(good) <= set(a.known_addrs(b.peer_id))
        nursery.cancel_scope.cancel()


async def test_a_dial_goes_on_when_its_caller_gives_up():
    """An expert call that came too late is cancelled; its dial must not be, or a peer
    slower to reach than one call's patience is never connected."""
    async with trio.open_nursery() as nursery:
        silent = await nursery.start(silent_listener)
        a, b = SwarmHost(Identity.generate()), SwarmHost(Identity.generate())
        async with a.running(), b.running():
            addrs = [f"/ip4/127.0.0.1/tcp/{silent}", *b.listen_addrs()]
            with trio.move_on_after(0.1):  # before the second address is even dialled
                await a.connect(b.peer_id, addrs, attempts=1)
            assert not a.is_connected(b.peer_id)
            await eventually(lambda: a.is_connected(b.peer_id), 5)
        nursery.cancel_scope.cancel()


async def test_concurrent_connects_to_one_peer_share_one_dial():
    a, b = SwarmHost(Identity.generate()), SwarmHost(Identity.generate())
    async with a.running(), b.running():
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(a.connect, b.peer_id, b.listen_addrs())
        assert len(a.libp2p_host.get_network().connections[b.peer_id]) == 1


async def test_a_caller_with_an_address_the_dial_in_flight_lacks_dials_it_alongside():
    """A trainer given a volunteer's relay circuits waited for a DHT dial begun earlier
    to time out at an old address (2-5 s in the lab); with one attempt it failed."""

    async def dial_quietly(host: SwarmHost, peer, addrs: list[str]) -> None:
        with contextlib.suppress(DialError):
            await host.connect(peer, addrs, timeout=30, attempts=1)

    async with trio.open_nursery() as nursery:
        silent = await nursery.start(silent_listener)
        a, b = SwarmHost(Identity.generate()), SwarmHost(Identity.generate())
        async with a.running(), b.running():
            nursery.start_soon(dial_quietly, a, b.peer_id, [f"/ip4/127.0.0.1/tcp/{silent}"])
            await eventually(lambda: b.peer_id in a._dialing)  # in flight, and stuck
            with trio.fail_after(10):  # the stuck dial holds on for 30 s
                await a.connect(b.peer_id, b.listen_addrs(), timeout=30, attempts=1)
            assert a.is_connected(b.peer_id)
        nursery.cancel_scope.cancel()


async def test_identify_gives_what_we_announce_never_the_unspecified_address():
    host = SwarmHost(Identity.generate(), ["/ip4/0.0.0.0/tcp/0"])
    async with host.running():
        given = [str(a) for a in host.libp2p_host.get_addrs()]
        assert given == [f"{a}/p2p/{host.peer_id}" for a in host.announce_addrs()]
        assert not any("/0.0.0.0/" in a for a in given)
        if any(not a.startswith(("127.", "::1", "fe80")) for a in interface_addresses()):
            assert not any("/127.0.0.1/" in a for a in given)  # it reaches only us


async def test_connections_have_keepalive_and_a_user_timeout():
    quick = Keepalive.within(12)  # a test's: dead connections dropped within 12 s
    assert (quick.idle_s, quick.interval_s, quick.probes) == (6, 2, 3)
    a = SwarmHost(Identity.generate())
    b = SwarmHost(Identity.generate(), keepalive=quick)
    async with a.running(), b.running():
        await a.connect(b.peer_id, b.listen_addrs())
        for host, peer, times in ((a, b.peer_id, Keepalive()), (b, a.peer_id, quick)):
            (conn,) = host.libp2p_host.get_network().connections[peer]
            sock = socket_of(conn)
            assert sock is not None
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == times.idle_s
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == times.probes
                user_timeout = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                assert user_timeout == times.dead_after_s * 1000


async def test_a_host_that_stops_leaves_no_connection_open_to_peers_that_keep_dialling_it():
    """libp2p's Swarm.close() closed connections one by one (0.1 s each) with its
    listener still open, then forgot the table: a peer that dialled in meanwhile could
    keep a connection that nobody served or closed. The host shuts its door first (a
    guard: the old code passed it too)."""
    stopping = SwarmHost(Identity.generate(), listen=["/ip4/127.0.0.1/tcp/0"])
    callers = [SwarmHost(Identity.generate(), listen=[]) for _ in range(12)]
    async with trio.open_nursery() as nursery:
        for caller in callers:
            await nursery.start(_run, caller)
        stop = trio.CancelScope()
        await nursery.start(_run, stopping, stop)
        addrs = stopping.listen_addrs()

        async def keep_dialling(caller: SwarmHost) -> None:
            while True:
                try:
                    await caller.connect(stopping.peer_id, addrs, timeout=2, attempts=1)
                except DialError:  # refused once it stopped: what we wait for
                    await trio.sleep(0)
                await trio.sleep(0)

        async with trio.open_nursery() as dialling:
            for caller in callers:
                dialling.start_soon(keep_dialling, caller)
            await eventually(lambda: all(c.is_connected(stopping.peer_id) for c in callers))
            stop.cancel()
            await trio.sleep(1)  # dials go on through the whole shutdown, and after it
            dialling.cancel_scope.cancel()
        await eventually(
            lambda: not any(c.is_connected(stopping.peer_id) for c in callers), timeout=5
        )
        nursery.cancel_scope.cancel()


async def test_a_connection_whose_closer_is_cancelled_half_way_still_closes():
    """libp2p's SwarmConn.close() marks the connection closed, then closes its muxer,
    and returns at once when called again: when the host stopped, the swarm's own close
    was cancelled in between, the host's close then did nothing, and the socket stayed
    open: the peer at the other end was "connected" to a stopped host for good (a CI
    failure; on loopback, 1 stop in 5 of a peer that had dialled out)."""
    closing = SwarmHost(Identity.generate(), listen=["/ip4/127.0.0.1/tcp/0"])
    other = SwarmHost(Identity.generate(), listen=["/ip4/127.0.0.1/tcp/0"])
    async with trio.open_nursery() as nursery:
        stop = trio.CancelScope()
        await nursery.start(_run, closing, stop)
        await nursery.start(_run, other)
        await closing.connect(other.peer_id, other.listen_addrs(), timeout=5)
        [conn] = closing.libp2p_host.get_network().connections[other.peer_id]
        # quiet first: a stream opening meanwhile (Identify's) would close it by chance
        await eventually(lambda: _identified(closing, other) and not conn.get_streams())
        with trio.CancelScope() as closer:
            closer.cancel()  # cancelled at its first checkpoint, as at shutdown ...
            await conn.close()
        stop.cancel()  # ... and the host stops before anything else runs
        await eventually(lambda: not other.is_connected(closing.peer_id), timeout=5)
        nursery.cancel_scope.cancel()


def _identified(host: SwarmHost, other: SwarmHost) -> bool:
    try:
        return bool(host.libp2p_host.get_peerstore().get_protocols(other.peer_id))
    except PeerStoreError:  # until Identify ran
        return False


async def _run(
    host: SwarmHost,
    scope: trio.CancelScope | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope or trio.CancelScope():
        async with host.running():
            task_status.started()
            await trio.sleep_forever()
