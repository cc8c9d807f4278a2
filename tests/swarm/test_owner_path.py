"""What an owner's first real project met (issue 36), on real peers: a lone honest
volunteer facing a round that waits for more contributors, and a volunteer whose
aggregator is gone. Both fail at 8609050: the first volunteer's address was banned (its
refusals counted as junk), the second dialled its dead aggregator once per contribution
and still said "working"."""

from __future__ import annotations

from typing import Any

import torch
import trio

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.contributing.sender import ContributionSender, SenderConfig
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertServerRef, ReceiptSigner
from core.namespaces import moehome_validator
from core.protocol.aggregator_methods import STATS
from core.protocol.refusals import WAITING
from net import Identity, Peer
from net._libp2p import PeerID
from net.testing import open_swarm
from tests.reports import stats_of

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
UIDS = [f"ffn0.{i // 4}.{i % 4}" for i in range(16)]
PROJECT = "0123456789abcdef0123456789abcdef"
SERVER = ServerConfig(project=PROJECT, require_receipts=True)


def backends() -> dict[str, ExpertBackend]:
    return {
        uid: ExpertBackend(ExpertUID.parse(uid), SPEC, build_expert(SPEC, seed=i))
        for i, uid in enumerate(UIDS)
    }


async def start_volunteer(
    nursery: trio.Nursery, volunteer: Peer, aggregator: PeerID, **config: Any
) -> tuple[dict[str, ExpertBackend], ContributionSender]:
    """A volunteer serving every expert and sending what it computes to ``aggregator``
    as often as it may."""
    served = backends()
    await nursery.start(ExpertServer(volunteer, served, SERVER).run)
    sender = await nursery.start(
        ContributionSender(
            volunteer,
            served,
            [aggregator],
            SenderConfig(project=PROJECT, every_samples=4, every_seconds=0.05, **config),
        ).run
    )
    return served, sender


async def keep_training(caller: ExpertCaller, volunteer, served, rounds: int) -> None:
    """The trainer's backward calls to every expert, ``rounds`` times over."""
    for _ in range(rounds):
        for uid, backend in served.items():
            ref = [ExpertServerRef(volunteer.peer_id, backend.sha256)]
            await caller.backward(uid, ref, torch.randn(4, 8), torch.randn(4, 8))
        await trio.sleep(0.05)


async def test_a_lone_honest_volunteer_is_never_banned_and_paces_its_contributions(tmp_path):
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer, aggregator = swarm.peers
        # three contributors per version, one volunteer: every round waits; once it
        # holds THIN_ROUND_ROUNDS rounds of this volunteer's samples, the rest is refused
        settings = AggregatorSettings(
            project=PROJECT,
            spec=SPEC,
            uids=tuple(UIDS),
            trainers=frozenset({trainer.identity.public_key}),
            round_samples=4,
            round_seconds=3600,
            min_contributors=3,
        )
        core = AggregatorCore(settings, tmp_path / "agg")
        await nursery.start(AggregatorService(aggregator, core).run)
        served, sender = await start_volunteer(nursery, volunteer, aggregator.peer_id)
        caller = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
        # at 8609050 the volunteer sent each expert's surplus every half second; within
        # 80 refusals its address was banned (60 of credit, then 20 offences)
        await keep_training(caller, volunteer, served, rounds=40)
        await sender.delivered()
        waiting = sender.stats.refused[WAITING]
        assert waiting > 0  # the rounds did fill up and wait
        # one refusal per expert, then it waits a round's time (60 s) before the next
        assert waiting <= len(UIDS)
        assert sender.stats.held_back > 0  # what it computed meanwhile was not sent
        assert sender.stats.sent <= sender.stats.accepted + len(UIDS)
        assert aggregator.host.admission_statistics().bans == 0
        assert core.stats.banned_peers == 0
        assert sender.problem().endswith("once other volunteers serve them too")
        # the trainer still reaches the aggregator: nobody at 127.0.0.1 was cut off
        assert stats_of((await trainer.rpc.call(aggregator.peer_id, STATS)).meta)["accepted"] > 0
        core.close()
        nursery.cancel_scope.cancel()


async def test_a_dead_aggregator_is_backed_off_once_and_the_volunteer_hears_of_it():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        dead = Identity.generate().peer_id
        volunteer.host.remember(dead, ["/ip4/127.0.0.1/tcp/1"])  # nothing listens there
        served, sender = await start_volunteer(
            nursery, volunteer, dead, retry_initial=1.0, unreachable_after=1.0
        )
        caller = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
        with trio.move_on_after(4):  # the node keeps serving the trainer meanwhile
            await keep_training(caller, volunteer, served, rounds=10_000)
        # one back-off for the aggregator (1 s, 2 s, ...), not a dial per contribution
        # (16 experts sending every half second, each retrying on its own at 8609050)
        assert 1 <= sender.stats.retries <= 4
        assert sender.stats.held_back > 0  # nothing piles up while it is gone
        assert "has not answered" in sender.problem()
        nursery.cancel_scope.cancel()
