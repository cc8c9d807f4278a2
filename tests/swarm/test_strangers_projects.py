"""Projects as strangers make them (issue 35): what a volunteer's node is handed through
an invite or the swarm's directory is untrusted input until the volunteer joins."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from core.control import find_node
from core.namespaces import moehome_validator
from core.node.node import Node
from core.node.probes import FakeProbes
from core.project import records as project_records
from core.project.chunks import ChunkStore
from core.project.distribution import GET_CHUNK, HEDGE_S, ProjectNotFound, WeightsFetcher
from core.project.keys import OwnerKey
from core.project.manifest import ManifestError, load_manifest, parse_manifest
from core.project.publish import prepare, serve_project
from core.project.signed import SignedManifest, canonical, project_id
from net import CallContext, Identity, NamespacedValidator, Peer, Reply
from net.codec import pack
from net.dht.node import DhtError
from net.testing import open_swarm
from tests.swarm.test_node import options
from tests.swarm.test_project import small_manifest

#: The largest grid the schema allowed at 8609050: 4096^4 experts in each of 64 layers.
BOMB: dict[str, Any] = {"mixture_layers": 64, "grid": [4096, 4096, 4096, 4096]}


def bomb(tmp_path: Path, owner: OwnerKey) -> SignedManifest:
    """A validly signed manifest whose grid is the bomb (signed by hand: our own
    publishing code refuses to sign it)."""
    obj = load_manifest(small_manifest(tmp_path, name="bomb")).to_obj()
    obj["model"].update(BOMB)
    unsigned = SignedManifest(
        pack(canonical(obj)),
        owner.public_key,
        owner.public_key,
        (),
        "0" * 64,
        time.time_ns() // 1000,
        b"",
    )
    return replace(unsigned, signature=owner.sign(unsigned.payload()))


def test_the_schema_bounds_experts_per_layer_and_in_all(tmp_path):
    obj = load_manifest(small_manifest(tmp_path)).to_obj()
    cases: list[tuple[dict[str, Any], str]] = [
        (BOMB, "experts per layer"),
        ({"grid": [128, 129]}, "16512 experts per layer; at most 16384"),
        ({"grid": [128, 128], "mixture_layers": 5}, "make 81920; at most 65536"),
    ]
    for model, says in cases:
        with pytest.raises(ManifestError, match=says):
            parse_manifest({**obj, "model": {**obj["model"], **model}})
    largest = parse_manifest(
        {**obj, "model": {**obj["model"], "grid": [128, 128], "mixture_layers": 4}}
    )
    assert largest.model.expert_count == 65_536


async def test_a_manifest_bomb_from_a_stranger_is_refused_and_the_node_stays_responsive(
    tmp_path,
):
    """Issue 35, finding 2: the node counted the bomb's experts one by one on its event
    loop: its control API and RPC answered 0 of 6 for as long as it ran, at 92-94% CPU."""
    owner = OwnerKey.generate()
    signed = bomb(tmp_path, owner)
    # the stranger's own DHT node keeps the record without checking it
    lax = {**project_records.RULES}
    lax["project"] = replace(lax["project"], check=None)
    validator = NamespacedValidator().with_rules(lax)
    async with trio.open_nursery() as nursery:
        attacker: Peer = await nursery.start(Peer(Identity.generate(), validator=validator).run)
        pid = project_id(owner.public_key, "bomb")
        for key, value in [
            (project_records.project_key(pid), signed.encode()),
            (project_records.DIRECTORY_KEY, pack([pid])),
        ]:
            with contextlib.suppress(DhtError):  # no other peer yet: kept at home
                await attacker.dht.put(key, value, 3600)
        node = await nursery.start(
            Node(Identity.generate(), options(tmp_path, 0, attacker), probes=FakeProbes()).run
        )
        client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
        with trio.fail_after(60):
            with pytest.raises(ProjectNotFound, match="no valid manifest"):
                await node.find_project(pid, [attacker.addrs()[0]])
            assert await node.announced_projects() == []  # the directory lists it
        with trio.fail_after(5):  # the control API answers at once
            status = await trio.to_thread.run_sync(client.status)
        assert status.project is None
        client.close()
        nursery.cancel_scope.cancel()


async def silent(ctx: CallContext) -> Reply:
    """A provider that takes chunk requests and never answers them."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def test_silent_providers_neither_hold_up_a_join_nor_each_chunk(tmp_path):
    """Issue 35, finding 6: anyone may announce itself a provider of a project's
    weights; providers were asked in one shuffled order, 30 s each, and only a hash
    mismatch marked one bad: 8 silent Sybils stretched a join from 1.8 s to 65-365 s."""
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    pid, index = prepared.signed.project_id, prepared.index.sha256
    uids = list(prepared.signed.manifest.model.expert_uids())
    async with (
        open_swarm(8, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, volunteer, again, *sybils = (swarm.node(i) for i in range(8))
        await nursery.start(serve_project, owner, prepared)
        for sybil in sybils:
            sybil.rpc.register(GET_CHUNK, silent)
            await sybil.dht.put(
                project_records.providers_key(pid),
                project_records.ProviderAnnouncement(index, ()).encode(),
                600,
            )
        fetcher = WeightsFetcher(volunteer, ChunkStore(tmp_path / "v-chunks"))
        found = await fetcher.providers(pid, index)
        assert len(found) == 6
        # the silent ones answer no probe: the owner goes first, whatever the shuffle
        with trio.fail_after(15):
            ranked = await fetcher.rank(found, index)
            assert ranked[0] == owner.peer_id
            files = await fetcher.fetch(prepared.signed, uids)
        assert sorted(files) == sorted(uids)
        # asked in the worst order (every silent one first), each chunk waits HEDGE_S
        # per silent provider at most, and only until they are known to be slow
        fetcher = WeightsFetcher(again, ChunkStore(tmp_path / "again-chunks"))
        with trio.fail_after(len(sybils) * HEDGE_S + 15):
            files = await fetcher.fetch(
                prepared.signed, uids, providers=[*(s.peer_id for s in sybils), owner.peer_id]
            )
        assert sorted(files) == sorted(uids)
        nursery.cancel_scope.cancel()
