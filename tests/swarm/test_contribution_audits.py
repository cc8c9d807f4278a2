"""Contribution audits on real peers: a trainer's backward requests reach volunteers, their
contributions reach an aggregator that audits every one; the honest volunteer's pass and
make a version, the cheater's fail, are discarded and leave evidence a third party
checks; a volunteer that cannot reveal loses the contribution without blame."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
import trio

from core.aggregator.audit import check_contribution_evidence
from core.aggregator.auditor import ContributionFinding
from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.contributing.sender import ContributionSender, SenderConfig
from core.demo.attacks import Attack
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertServerRef, ReceiptSigner
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.distribution import WeightsService
from net import Peer
from net.testing import open_swarm

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
UID = "ffn0.0.0"
PROJECT = "0123456789abcdef0123456789abcdef"


@dataclass
class Rig:
    """A trainer calling one volunteer's expert, whose contributions go to an aggregator."""

    core: AggregatorCore
    service: AggregatorService
    backend: ExpertBackend
    sender: ContributionSender
    caller: ExpertCaller
    refs: list[ExpertServerRef]
    volunteer: Peer
    server: ExpertServer

    async def backward(self) -> None:
        await self.caller.backward(UID, self.refs, torch.randn(4, 8), torch.randn(4, 8))


async def start_rig(
    nursery: trio.Nursery,
    peers: list[Peer],
    folder: Path,
    sender_config: SenderConfig,
    *,
    attack: str | None = None,
    banned: bool = False,
    weights: bool = False,
    **settings: object,
) -> Rig:
    """``weights``: the aggregator serves its versions' weights (a volunteer can pull
    them)."""
    trainer, volunteer, aggregator = peers
    base = AggregatorSettings(
        project=PROJECT,
        spec=SPEC,
        uids=(UID,),
        trainers=frozenset({trainer.identity.public_key}),
        round_seconds=3600,
    )
    core = AggregatorCore(
        replace(base, **settings),  # type: ignore[arg-type]
        folder / "agg",
        initial={UID: build_expert(SPEC, seed=1)},
    )
    if banned:
        core.ban_contributor(volunteer.identity.public_key)  # a project ban, honoured
    store = None
    if weights:
        store = ChunkStore(folder / "agg-chunks")
        WeightsService.of(aggregator, store)
    service = AggregatorService(aggregator, core, store=store)
    if service.auditor is not None:
        service.auditor.rng = random.Random(0)
    await nursery.start(service.run)
    backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
    server = await nursery.start(
        ExpertServer(
            volunteer, {UID: backend}, ServerConfig(project=PROJECT, require_receipts=True)
        ).run
    )
    sender = await nursery.start(
        ContributionSender(
            volunteer,
            {UID: backend},
            [aggregator.peer_id],
            sender_config,
            sums_hook=None if attack is None else Attack(attack),
        ).run
    )
    caller = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
    refs = [ExpertServerRef(volunteer.peer_id, backend.sha256)]
    return Rig(core, service, backend, sender, caller, refs, volunteer, server)


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(20):
        while not condition():
            await trio.sleep(0.05)


@pytest.mark.parametrize("attack", [None, "drift"])
async def test_an_aggregator_audits_contributions_and_catches_a_cheater(tmp_path, attack):
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(
            nursery,
            swarm.peers,
            tmp_path,
            SenderConfig(project=PROJECT, every_samples=8, every_seconds=0.5, kept_bytes=2**20),
            attack=attack,
            optimizer="sgd",
            learning_rate=0.5,
            round_samples=8,
            contribution_audit_rate=1.0,
        )
        core, auditor, sender = rig.core, rig.service.auditor, rig.sender
        assert auditor is not None
        findings: list[ContributionFinding] = []
        auditor.listeners.append(findings.append)
        for _ in range(3):
            await rig.backward()
        # the auditor counts a reveal when it arrives, the sender once the reply is back
        await until(lambda: auditor.stats.passed + auditor.stats.failed >= 1)
        await until(lambda: sender.stats.revealed >= 1)
        assert sender.stats.audited >= 1
        if attack is None:
            await until(lambda: core.versions[UID] >= 1)
            assert auditor.stats.failed == 0
            assert not findings
        else:
            assert auditor.stats.passed == 0
            (finding, *_) = findings
            assert finding.contributor == str(rig.volunteer.peer_id)
            assert finding.verdict.excess > 1
            # nothing of the cheater's reached a round
            assert core.versions[UID] == 0
            assert not core.pending[UID]
            weights = build_expert(SPEC, seed=1)
            assert check_contribution_evidence(finding.evidence, SPEC, weights) is None
        audits = rig.service.statistics().audits
        assert audits is not None
        assert audits.drawn >= 1
        nursery.cancel_scope.cancel()
    core.close()


async def test_a_contribution_that_cannot_be_revealed_is_discarded_without_blame(tmp_path):
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(  # the sender keeps nothing: nothing can be revealed
            nursery,
            swarm.peers,
            tmp_path,
            SenderConfig(project=PROJECT, every_samples=4, every_seconds=0.5),
            round_samples=4,
            contribution_audit_rate=1.0,
        )
        core, auditor = rig.core, rig.service.auditor
        assert auditor is not None
        await rig.backward()
        # the auditor counts the answer when it arrives, the sender once the reply is back
        await until(lambda: auditor.stats.unrevealed >= 1)
        await until(lambda: rig.sender.stats.unrevealable >= 1)
        assert rig.sender.stats.unrevealable == 1
        assert auditor.stats.failed == 0
        assert not auditor.findings
        assert not core.pending[UID]
        assert core.versions[UID] == 0
        # no strike either: the volunteer's next contributions are taken as ever
        assert core.stats.contributors[rig.volunteer.identity.public_key.hex()].rejected == {}
        nursery.cancel_scope.cancel()
    core.close()


async def test_a_banned_volunteer_stops_sending_and_drops_what_it_computes(tmp_path):
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        rig = await start_rig(
            nursery,
            swarm.peers,
            tmp_path,
            SenderConfig(project=PROJECT, every_samples=4, every_seconds=0.2, kept_bytes=2**20),
            banned=True,
            round_samples=1000,
        )
        sender = rig.sender
        await rig.backward()
        await until(lambda: sender.banned)
        assert sender.stats.refused == {"banned_by_project": 1}
        # what it computes from now on is dropped, not sent (nor kept)
        await rig.backward()
        await until(lambda: rig.backend.accumulator.samples == 0)
        assert sender.stats.sent == 1
        assert sender.kept_budget is not None
        assert sender.kept_budget.used == 0
        nursery.cancel_scope.cancel()
    rig.core.close()
