"""With fake probes, a serving node stops taking new work within 1 s of the user coming
back (or the GPU crossing its limit) and resumes afterwards; trainers route around it."""

from __future__ import annotations

import torch
import trio

from core.control.preferences import Preferences
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertCallError, ExpertServerRef
from core.namespaces import moehome_validator
from core.node.governor import Governor
from core.node.probes import FakeProbes
from core.node.throttle import Reason
from net.testing import open_swarm
from tests.waiting import eventually

SPEC = ExpertSpec("ffn", hidden=8, inner=16)


def reason_of(governor: Governor) -> Reason | None:
    assert governor.decision is not None
    return governor.decision.reason


async def test_the_node_pauses_within_a_second_and_resumes():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        node, trainer = swarm.peers
        backend = ExpertBackend(ExpertUID.parse("ffn.0.0"), SPEC, build_expert(SPEC, seed=0))
        server = await nursery.start(ExpertServer(node, {"ffn.0.0": backend}, ServerConfig()).run)
        probes = FakeProbes()
        prefs = Preferences()
        governor = await nursery.start(Governor(probes, lambda: prefs, server).run)
        caller = ExpertCaller(trainer.rpc, forward_timeout=2)
        ref = [ExpertServerRef(node.peer_id, backend.sha256)]

        async def serving() -> bool:
            try:
                await caller.forward("ffn.0.0", ref, torch.randn(1, 8))
                return True
            except ExpertCallError:
                return False

        async def refused() -> bool:
            return not await serving()

        assert await serving()
        probes.set(idle_seconds=1.0)  # the volunteer touches the mouse
        assert await eventually(refused, 1.0) < 1.0
        assert reason_of(governor) is Reason.USER_ACTIVE
        assert server.paused
        # its declaration says withdrawn, so trainers' beam search skips it
        from core.experts.records import ExpertAnnouncement, expert_key

        (record,) = await trainer.dht.get(expert_key("demo", "ffn.0.0"))
        assert ExpertAnnouncement.decode(record.value).state == "withdrawn"

        probes.set(idle_seconds=3600.0)  # gone again
        assert await eventually(serving, 2.0) < 2.0

        probes.set(gpu_temp_c=90.0)  # too hot: pause...
        assert await eventually(refused, 1.0) < 1.0
        assert reason_of(governor) is Reason.GPU_HOT
        probes.set(gpu_temp_c=80.0)  # ...still above the resume temperature: stay paused
        await governor.step()  # a decision made on the new reading
        assert governor.last_reading is not None
        assert governor.last_reading.gpu_temp_c == 80.0
        assert await refused()
        probes.set(gpu_temp_c=70.0)
        assert await eventually(serving, 2.0) < 2.0

        governor.pause()  # by hand, from the tray
        assert await eventually(refused, 1.0) < 1.0
        assert reason_of(governor) is Reason.PAUSED
        governor.resume()
        assert await eventually(serving, 2.0) < 2.0
        nursery.cancel_scope.cancel()
