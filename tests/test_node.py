"""The node: joins a project, serves the least-covered experts, obeys the control API."""

from __future__ import annotations

import trio

from core.control import find_node
from core.namespaces import moehome_validator
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from net import Identity, Peer
from tests.test_project import small_manifest


async def test_a_node_joins_serves_and_obeys(tmp_path):
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    async with trio.open_nursery() as nursery:
        owner: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(serve_project, owner, prepared)
        nodes = []
        for i in range(2):
            options = NodeOptions(
                data_dir=tmp_path / f"node{i}",
                config_dir=tmp_path / f"config{i}",
                project=pid,
                bootstrap=(owner.addrs()[0],),
                experts=2,
            )
            nodes.append(
                await nursery.start(Node(Identity.generate(), options, probes=FakeProbes()).run)
            )
        first, second = nodes
        assert first.status()["state"] == "working"
        # the second node chose experts the first does not serve (least covered first)
        assert not set(first.status()["experts"]) & set(second.status()["experts"])

        client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
        await trio.to_thread.run_sync(client.pause)
        with trio.fail_after(2):
            while not first.server.paused:
                await trio.sleep(0.05)
        status = await trio.to_thread.run_sync(client.status)
        assert status["state"] == "paused"
        assert "paused by you" in status["reason"]
        await trio.to_thread.run_sync(client.resume)
        with trio.fail_after(2):
            while first.server.paused:
                await trio.sleep(0.05)
        second.probes.set(idle_seconds=10.0)  # the second volunteer sits down
        with trio.fail_after(2):
            while not second.server.paused:
                await trio.sleep(0.05)
        client.close()
        nursery.cancel_scope.cancel()
