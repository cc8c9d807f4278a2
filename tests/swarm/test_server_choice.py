"""The emulated swarm's parts on real peers: an uplink that sends one answer at a time at
its rate, and a trainer that sends each call to the server expected to finish it first
(core/moe/load.py) from the backlog, speed and time per call that servers report with
their answers, and the time its link adds."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from operator import mul

import torch
import trio

from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertServerRef
from core.moe.load import ServerLoads
from core.namespaces import moehome_validator
from net import PeerConfig, Reply, Tensor
from net.testing import open_swarm
from net.testing.link import EmulatedLink

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
UID = "ffn0.0.0"


async def test_an_emulated_uplink_sends_one_answer_at_a_time_at_its_rate():
    rate = 1_000_000.0  # bytes per second
    answer = bytes(100_000)  # 0.1 s each on that uplink

    def config(i: int) -> PeerConfig:
        base = PeerConfig()
        if i == 1:
            return replace(
                base, rpc=replace(base.rpc, link=EmulatedLink(upload_bytes_per_second=rate))
            )
        return base

    async with open_swarm(2, config) as swarm:
        caller, server = swarm.peers

        async def big(ctx):
            return Reply({}, (Tensor("uint8", (len(answer),), answer),))

        server.rpc.register("big", big)
        await caller.rpc.call(server.peer_id, "big", timeout=30)  # connected
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lambda: caller.rpc.call(server.peer_id, "big", timeout=30))
        assert trio.current_time() - started >= 3 * len(answer) / rate


async def test_calls_go_to_the_server_expected_to_finish_first():
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, slow_peer, fast_peer = swarm.peers
        servers = {}
        for peer, per_row in ((slow_peer, 0.01), (fast_peer, 0.0)):
            backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
            pace = partial(mul, per_row) if per_row else None
            servers[peer.peer_id] = await nursery.start(
                ExpertServer(
                    peer,
                    {UID: backend},
                    ServerConfig(pace=pace),
                ).run
            )
        slow = ExpertServerRef(slow_peer.peer_id, "")
        fast = ExpertServerRef(fast_peer.peer_id, "")
        loads = ServerLoads()
        caller = ExpertCaller(trainer.rpc, loads=loads)
        x = torch.randn(10, 8)
        for ref in (slow, fast):  # one answer from each: their speeds are known
            await caller.forward(UID, [ref], x)
        slow_rate = loads._servers[slow.peer_id].rate
        assert slow_rate is not None
        assert 50 <= slow_rate <= 100
        answered: list[ExpertServerRef] = []

        async def one() -> None:
            answered.append((await caller.forward(UID, [slow, fast], x)).server)

        async with trio.open_nursery() as calls:
            for _ in range(6):
                calls.start_soon(one)
        # the slow server is listed first each time; the fast one finishes every call
        # (and its backlog of 60 rows) long before the slow one would finish one
        assert answered == [fast] * 6
        assert servers[slow_peer.peer_id].backlog().queue == 0
        nursery.cancel_scope.cancel()


async def test_of_two_equal_servers_the_one_behind_a_slow_link_gets_fewer_calls():
    delay = 0.25  # seconds the far server's link adds to each answer

    def config(i: int) -> PeerConfig:
        base = PeerConfig()
        if i == 1:
            return replace(base, rpc=replace(base.rpc, link=EmulatedLink(delay=delay)))
        return base

    async with (
        open_swarm(3, config, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, far_peer, near_peer = swarm.peers
        for peer in (far_peer, near_peer):
            backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
            await nursery.start(
                ExpertServer(peer, {UID: backend}, ServerConfig(pace=partial(mul, 0.002))).run
            )
        far = ExpertServerRef(far_peer.peer_id, "")
        near = ExpertServerRef(near_peer.peer_id, "")
        loads = ServerLoads()
        caller = ExpertCaller(trainer.rpc, loads=loads)
        x = torch.randn(10, 8)  # 20 ms of device time per call on either server
        for ref in (far, near):
            await caller.forward(UID, [ref], x)
        overhead = loads._servers[far.peer_id].overhead
        assert overhead is not None
        assert overhead >= delay  # the server's own time is not taken for the link's
        answered: list[ExpertServerRef] = []

        async def one() -> None:
            answered.append((await caller.forward(UID, [far, near], x)).server)

        async with trio.open_nursery() as calls:
            for _ in range(8):
                calls.start_soon(one)
        # the far server is listed first each time. Ranked by backlog alone the two
        # would share the calls; with its link counted, the near server takes calls
        # until its queue outweighs the far link (250 ms: 12 calls of 20 ms)
        assert answered.count(near) == 8, answered
        nursery.cancel_scope.cancel()
