"""Signed address records (net/reach/addressbook.py): a peer publishes where it can be dialled,
and is found there by a peer that knew no address of it, or only an old one."""

from __future__ import annotations

import pytest
import trio

from net import Identity
from net.dht.records import decode_peer_addrs, peer_record_key
from net.peer import PeerConfig
from net.testing import open_swarm
from net.transport.host import DialError
from tests.waiting import eventually

PUBLISHING = PeerConfig(address_record=True)


async def forget(peer, other) -> None:
    await peer.host.disconnect(other.peer_id)
    peer.host.libp2p_host.get_peerstore().clear_addrs(other.peer_id)
    await eventually(lambda: not peer.host.is_connected(other.peer_id))
    assert peer.host.known_addrs(other.peer_id) == []


async def test_a_peer_whose_addresses_are_unknown_is_found_by_its_record():
    async with open_swarm(4) as swarm:
        author = await swarm.add(config=PUBLISHING)
        await eventually(lambda: author.addressbook.publications >= 1, timeout=10)
        records = await swarm.node(1).dht.get(peer_record_key(author.peer_id))
        assert [decode_peer_addrs(r.value) for r in records] == [author.host.announce_addrs()]
        caller = swarm.node(2)
        await forget(caller, author)
        await caller.host.connect(author.peer_id, timeout=10)
        assert caller.host.is_connected(author.peer_id)
        assert set(author.host.announce_addrs()) <= set(caller.host.known_addrs(author.peer_id))


async def test_a_peer_that_moved_is_found_at_its_new_address_for_the_next_call():
    identity = Identity.generate()
    async with open_swarm(4) as swarm:
        before = await swarm.add(identity, PUBLISHING)
        caller = swarm.node(2)
        await caller.host.connect(before.peer_id, before.host.listen_addrs(), timeout=5)
        old = before.host.listen_addrs()
        swarm.stop(before)
        await eventually(lambda: not caller.host.is_connected(before.peer_id))
        # the same peer comes back elsewhere (another port) and publishes it there
        after = await swarm.add(identity, PUBLISHING)
        assert after.host.listen_addrs() != old
        await eventually(lambda: after.addressbook.publications >= 1, timeout=10)
        await forget(caller, after)  # (its bootstrap may have connected them)
        caller.host.remember(after.peer_id, old)
        # the call fails at the old address and looks the record up meanwhile ...
        with pytest.raises(DialError):
            await caller.host.connect(after.peer_id, timeout=3, attempts=1)
        await eventually(
            lambda: set(after.host.listen_addrs()) <= set(caller.host.known_addrs(after.peer_id)),
            timeout=10,
        )
        # ... so the next call gets through
        with trio.fail_after(10):
            await caller.host.connect(after.peer_id, timeout=10)
        assert caller.host.is_connected(after.peer_id)


async def test_lookups_of_one_peer_are_rate_limited_and_never_nested():
    async with open_swarm(3) as swarm:
        book = swarm.node(1).addressbook
        nobody = Identity.generate().peer_id
        assert await book.resolve(nobody) == []
        queries = swarm.node(1).dht.stats.queries_sent
        assert await book.resolve(nobody) == []  # again at once: no lookup at all
        assert swarm.node(1).dht.stats.queries_sent == queries
