"""An expert's rounds keep a beat, and a volunteer sends just before one closes: what it
computed since its last contribution joins that round instead of waiting for its next
regular send (a round later). Real peers: a trainer, a volunteer, an aggregator."""

from __future__ import annotations

import torch
import trio

import core.contributing.sender as sender_module
from core.contributing.sender import SenderConfig
from core.namespaces import moehome_validator
from net.testing import open_swarm
from tests.swarm.test_contribution_audits import PROJECT, UID, start_rig, until

ROUND_S = 8.0


async def test_a_volunteer_sends_again_just_before_its_round_closes(tmp_path, monkeypatch):
    # the send lands 3 s before the close (1 s beyond the delivery's own time in the
    # product): a busy test machine's stall does not push it into the next round
    monkeypatch.setattr(sender_module, "LEAD_SLACK_S", 3.0)
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(
            nursery,
            swarm.peers,
            tmp_path,
            # sent at 4 samples, or after an hour: neither happens for the second batch
            SenderConfig(
                project=PROJECT, every_samples=4, every_seconds=3600, round_seconds=ROUND_S
            ),
            round_seconds=ROUND_S,
        )
        sender, core = rig.sender, rig.core
        await rig.backward()  # 4 samples: sent at once; the reply says when the round closes
        await until(lambda: sender.stats.accepted == 1)
        await rig.caller.backward(UID, rig.refs, torch.randn(2, 8), torch.randn(2, 8))
        with trio.fail_after(ROUND_S + 10):
            while core.versions[UID] == 0:
                await trio.sleep(0.05)
        # the two batches' contributions, both computed on version 0, made version 1
        assert sender.stats.accepted == 2
        assert core.stats.lateness_report()["lateness"] == [2]
        assert core.stats.rounds == 1
        nursery.cancel_scope.cancel()
    core.close()
