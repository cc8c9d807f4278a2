"""An expert's rounds keep a beat, and a volunteer sends just before one closes: what it
computed since its last contribution joins that round instead of waiting for its next
regular send (a round later); and it looks for the version that round makes as soon as
it closes, not at its next regular look. Real peers: a trainer, a volunteer, an
aggregator."""

from __future__ import annotations

import torch
import trio

import core.contributing.sender as sender_module
from core.contributing.puller import WeightsPuller
from core.contributing.sender import SenderConfig
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from net.testing import open_swarm
from tests.swarm.test_contribution_audits import PROJECT, UID, start_rig, until

ROUND_S = 8.0
#: sent at 4 samples, or after an hour: neither happens for a batch of 2
SENDER = SenderConfig(project=PROJECT, every_samples=4, every_seconds=3600, round_seconds=ROUND_S)


async def test_a_volunteer_sends_again_just_before_its_round_closes(tmp_path, monkeypatch):
    # the send lands 3 s before the close (1 s beyond the delivery's own time in the
    # product): a busy test machine's stall does not push it into the next round
    monkeypatch.setattr(sender_module, "LEAD_SLACK_S", 3.0)
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(nursery, swarm.peers, tmp_path, SENDER, round_seconds=ROUND_S)
        sender, core = rig.sender, rig.core
        await rig.backward()  # 4 samples: sent at once; the reply says when the round closes
        await until(lambda: sender.stats.accepted == 1)
        await rig.caller.backward(UID, rig.refs, torch.randn(2, 8), torch.randn(2, 8))
        await until(lambda: core.versions[UID] == 1)  # within 20 s: a round is 8
        # the two batches' contributions (6 samples), computed on version 0, made version 1
        assert sender.stats.accepted == 2
        assert core.stats.lateness_report()["lateness"] == [6]
        assert core.stats.rounds == 1
        nursery.cancel_scope.cancel()
    core.close()


async def test_a_volunteer_pulls_the_version_its_round_made_when_it_closes(tmp_path, monkeypatch):
    monkeypatch.setattr(sender_module, "LEAD_SLACK_S", 3.0)
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(
            nursery, swarm.peers, tmp_path, SENDER, weights=True, round_seconds=ROUND_S
        )
        sender, core, backend = rig.sender, rig.core, rig.backend
        puller = WeightsPuller(
            rig.volunteer,
            PROJECT,
            {UID: backend},
            [rig.service.peer.identity.public_key],
            ChunkStore(tmp_path / "vol-chunks"),
            rig.server.device,
            before_swap=sender.flush,
            interval=3600,  # its regular look: once now, then in an hour
        )
        await nursery.start(puller.run)
        sender.on_round_close = puller.expect  # as core/contributing/wiring.py
        await rig.backward()
        await until(lambda: sender.stats.accepted == 1)
        await rig.caller.backward(UID, rig.refs, torch.randn(2, 8), torch.randn(2, 8))
        await until(lambda: core.versions[UID] == 1)
        # the round the volunteer sent to closed: it has the version long before its hour
        await until(lambda: backend.version == 1)
        assert backend.sha256 == core.weights_sha256(UID)
        assert puller.swaps == 1
        nursery.cancel_scope.cancel()
    core.close()
