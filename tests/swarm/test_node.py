"""The node: joins a project, serves the least-covered experts, moves when the swarm
calls for it, obeys the control API, and remembers its project across restarts."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import trio

from core.control import ControlError, find_node
from core.experts.records import SERVING, ExpertAnnouncement, expert_key
from core.namespaces import moehome_validator
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from core.project.keys import OwnerKey
from core.project.publish import Prepared, prepare, serve_project
from net import Identity, Peer
from tests.swarm.test_project import small_manifest
from tests.waiting import eventually


def is_working(node: Node) -> bool:
    return bool(node.status().state == "working")


def options(tmp_path: Path, i: int, owner: Peer, **kw: object) -> NodeOptions:
    return NodeOptions(
        data_dir=tmp_path / f"node{i}",
        config_dir=tmp_path / f"config{i}",
        bootstrap=(owner.addrs()[0],),
        benchmark=False,
        **kw,  # type: ignore[arg-type]
    )


async def start_owner(nursery: trio.Nursery, tmp_path: Path) -> tuple[Peer, Prepared]:
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    owner: Peer = await nursery.start(Peer(Identity.generate(), validator=moehome_validator()).run)
    await nursery.start(serve_project, owner, prepared)
    return owner, prepared


async def test_a_node_joins_serves_and_obeys(tmp_path):
    async with trio.open_nursery() as nursery:
        owner, prepared = await start_owner(nursery, tmp_path)
        pid = prepared.signed.project_id
        nodes = []
        for i in range(2):
            node = await nursery.start(
                Node(
                    Identity.generate(),
                    options(tmp_path, i, owner, project=pid, experts=2),
                    probes=FakeProbes(),
                ).run
            )
            await eventually(partial(is_working, node))
            nodes.append(node)
        first, second = nodes
        # the second node chose experts the first does not serve (least covered first)
        assert len(first.status().experts) == 2
        assert not set(first.status().experts) & set(second.status().experts)
        status = first.status()
        assert status.project_name == "tiny"
        assert status.device.device == "cpu"
        assert "GB" in status.device.memory
        assert status.readings.gpu_temp_c == 50.0

        client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
        await trio.to_thread.run_sync(client.pause)
        await eventually(lambda: first.serving.server.paused, 2)
        status = await trio.to_thread.run_sync(client.status)
        assert status.state == "paused"
        assert "paused by you" in status.reason
        assert status.reason_code == "paused"
        await trio.to_thread.run_sync(client.resume)
        await eventually(lambda: not first.serving.server.paused, 2)
        second.probes.set(idle_seconds=10.0)  # the second volunteer sits down
        await eventually(lambda: second.serving.server.paused, 2)
        # every change of state reached the event stream, with its reason
        events = await trio.to_thread.run_sync(client.events)
        states = [(e.run, e.reason_code) for e in events if e.kind == "state"]
        assert states[-3:] == [(True, ""), (False, "paused"), (True, "")]
        assert any(e.kind == "experts" for e in events)
        # the project is listed in the swarm's directory, with its verified name
        listed = await trio.to_thread.run_sync(client.projects)
        assert [(p.project, p.name) for p in listed] == [(pid, "tiny")]
        client.close()
        nursery.cancel_scope.cancel()


async def test_measuring_the_device_again_reports_progress(tmp_path):
    async with trio.open_nursery() as nursery:
        owner, _ = await start_owner(nursery, tmp_path)
        node = await nursery.start(
            Node(
                Identity.generate(),
                options(tmp_path, 0, owner, quick_benchmark=True),
                probes=FakeProbes(),
            ).run
        )
        client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
        await trio.to_thread.run_sync(client.benchmark)
        await eventually(lambda: bool(node.device.benchmark), 30)
        events = await trio.to_thread.run_sync(client.events)
        progress = [e for e in events if e.kind == "benchmark"]
        assert [e.what for e in progress][:2] == ["matmul fp32", "matmul fp16"]
        assert progress[-1].what == "done"
        figures = progress[-1].figures
        assert figures is not None
        assert figures["device_type"] == "cpu"
        assert node.status().device.benchmark["matmul_tflops_fp32"] > 0
        client.close()
        nursery.cancel_scope.cancel()


async def test_join_and_leave_through_the_api_and_remember_it(tmp_path):
    async with trio.open_nursery() as nursery:
        owner, prepared = await start_owner(nursery, tmp_path)
        pid = prepared.signed.project_id
        identity = Identity.generate()
        with trio.CancelScope() as first_run:
            async with trio.open_nursery() as inner:
                node = await inner.start(
                    Node(identity, options(tmp_path, 0, owner), probes=FakeProbes()).run
                )
                assert node.status().state == "no project"
                client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
                with pytest.raises(ControlError, match="project id") as bad:
                    await trio.to_thread.run_sync(client.join, "Not A Project!")
                assert bad.value.problems[0].startswith("project:")
                joined = await trio.to_thread.run_sync(client.join, pid)
                # found and verified before the answer: its name is known at once
                assert joined.project_name == prepared.signed.manifest.project.name
                await eventually(lambda: node.status().state == "working")
                first_run.cancel()
        client.close()
        # a restart without --project serves the remembered one
        node = await nursery.start(
            Node(identity, options(tmp_path, 0, owner), probes=FakeProbes()).run
        )
        await eventually(lambda: node.status().state == "working")
        assert node.status().project == pid
        client = await trio.to_thread.run_sync(find_node, tmp_path / "node0")
        status = await trio.to_thread.run_sync(client.leave)
        assert status.state == "no project"
        await eventually(lambda: node.serving.server is None)
        # leaving withdrew the declarations: nobody serves the experts any more
        uids = list(prepared.signed.manifest.model.expert_uids())

        async def servers() -> int:
            total = 0
            for uid in uids:
                found = await owner.dht.announcers(expert_key(pid, uid))
                total += sum(
                    ExpertAnnouncement.decode(r.value).state == SERVING for r in found.values()
                )
            return total

        assert await servers() == 0
        client.close()
        nursery.cancel_scope.cancel()


async def test_an_unknown_project_is_an_error_state_not_a_crash(tmp_path):
    async with trio.open_nursery() as nursery:
        owner, _ = await start_owner(nursery, tmp_path)
        node = await nursery.start(
            Node(
                Identity.generate(),
                options(tmp_path, 0, owner, project="0" * 32, join_retry=60.0, first_look_s=0),
                probes=FakeProbes(),
            ).run
        )
        await eventually(lambda: node.status().state == "error")
        assert "no valid manifest" in node.status().reason
        nursery.cancel_scope.cancel()


async def test_a_node_started_before_the_swarm_knows_its_project_never_says_error(tmp_path, caplog):
    """At 8609050 every start of the tray's node showed a red "no valid manifest" for
    15-25 s (4 of 4 starts), before the lookup found the project."""
    caplog.set_level(logging.INFO, logger="core.node.serving")
    async with trio.open_nursery() as nursery:
        owner: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
        node = await nursery.start(
            Node(
                Identity.generate(),
                options(tmp_path, 0, owner, project=prepared.signed.project_id),
                probes=FakeProbes(),
            ).run
        )
        states: list[str] = []

        async def watch() -> None:
            while True:
                states.append(node.status().state)
                await trio.sleep(0.05)

        nursery.start_soon(watch)
        # the lookups found nothing at least twice before the owner publishes, late
        await eventually(
            lambda: sum("looking again" in r.getMessage() for r in caplog.records) >= 2,
            timeout=30,
        )
        await nursery.start(serve_project, owner, prepared)
        await eventually(lambda: node.status().state == "working", timeout=60)
        assert "error" not in states, states
        nursery.cancel_scope.cancel()


async def test_a_node_moves_from_a_crowded_expert_to_an_uncovered_one(tmp_path):
    async with trio.open_nursery() as nursery:
        owner, prepared = await start_owner(nursery, tmp_path)
        pid = prepared.signed.project_id
        uids = sorted(prepared.signed.manifest.model.expert_uids())  # 4 experts
        node = await nursery.start(
            Node(
                Identity.generate(),
                options(tmp_path, 0, owner, project=pid, experts=1, rebalance_every=0.5),
                probes=FakeProbes(),
            ).run
        )
        await eventually(lambda: node.status().state == "working")
        (mine,) = node.status().experts
        # three other volunteers declare our expert and two of the others: the one left
        # has nobody, so the node should move there (gain 3 >= 2), once
        others = [u for u in uids if u != mine]
        crowd = []
        for _ in range(3):
            peer: Peer = await nursery.start(
                Peer(Identity.generate(), validator=moehome_validator()).run
            )
            await peer.dht.bootstrap([owner.addrs()[0]])
            crowd.append(peer)
        # the two others first, ours last: whenever the node looks (every ~0.5 s, maybe
        # between two puts), the only move worth making (gain >= 2) is to the uncovered
        # expert; declaring ours first made an early look move it to a wrong one
        for uid in [*others[:2], mine]:
            for peer in crowd:
                ann = ExpertAnnouncement(uid, SERVING, 0, "0" * 64, 0.0, 4096)
                await peer.dht.put(expert_key(pid, uid), ann.encode(), ttl=60)
        await eventually(lambda: node.status().experts.keys() == {others[2]}, 20)
        assert node.serving.rebalances == 1
        await trio.sleep(2)  # hysteresis: no further moves (everything else has 3)
        assert node.serving.rebalances == 1
        nursery.cancel_scope.cancel()
