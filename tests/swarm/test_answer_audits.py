"""Answer audits on real peers: a trainer recomputes answers from the weights the project
published (the owner's initial files, then versions an aggregator announces), passes an
honest volunteer's answers (signed, as every answer is) on every version it serves, and
excludes a volunteer whose answers are scaled by 5%, holding its signed claim as
evidence."""

from __future__ import annotations

import copy
import math
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.demo.cheats import ANSWER_CHEATS
from core.experts import activations
from core.experts.registry import build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.weights import save_weights, weights_hash
from core.moe.answer_checks import QUORUM_EXCLUSION_S, Answer, check_evidence
from core.moe.audit import AnswerAuditor
from core.moe.client import ExpertCaller, ExpertServerRef
from core.moe.published import PublishedWeights
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore, split_file
from core.project.joining import join_project
from core.project.keys import OwnerKey
from core.project.publish import Prepared, prepare, serve_project
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import REFEREE
from core.protocol.expert_methods import BACKWARD
from core.protocol.versions import version_key
from core.trainer.train import _accuse
from net import BadRequest
from net.codec import pack
from net.testing import open_swarm
from tests.swarm.test_project import small_manifest

UID = "ffn0.0.1"


async def announce(aggregator, store: ChunkStore, project: str, module, version: int) -> None:
    """What an aggregator does for a new version: its file's chunks served, and a record
    of it in the DHT."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.safetensors"
        save_weights(module, path, version=version)
        entry = split_file(path.read_bytes(), store)
    record = {
        "uid": UID,
        "version": version,
        "sha256": weights_hash(module),
        "file": [entry.sha256, entry.size, list(entry.chunks)],
    }
    await aggregator.dht.put(version_key(project, UID), pack(record), 600)


def q4z_project(tmp_path: Path) -> Prepared:
    """The test project with answers in q4z (quantized: the bound's hardest case), its
    experts in float32: the cheats below scale answers by 5%, which the float32 bound
    (2**-12) catches and bfloat16's (2**-4, decision 011) does not always."""
    edits = {'activations = "q8"': 'activations = "q4z"', 'dtype = "bfloat16"': 'dtype = "float32"'}
    return prepare(
        small_manifest(tmp_path, **edits),
        OwnerKey.generate(),
        (),
        tmp_path / "owner",
    )


async def serve_expert(
    nursery: trio.Nursery, peer, pid: str, cheat, data_dir: Path, trainers=frozenset()
) -> tuple[SignedManifest, ExpertServer]:
    """``peer`` joins the project and serves UID, cheating with ``cheat`` (None: honest);
    ``trainers``: the public keys it serves as the project's trainers."""
    signed, backends = await join_project(peer, pid, [UID], data_dir=data_dir)
    config = ServerConfig(project=pid, answer_hook=cheat, trainers=frozenset(trainers))
    return signed, await nursery.start(ExpertServer(peer, backends, config).run)


class RecordingBoard:
    """A ban board that keeps what it is asked to publish."""

    def __init__(self) -> None:
        self.accused: list[tuple[Any, ...]] = []

    def accuse(self, *args: Any) -> None:
        self.accused.append(args)


def auditing_by_opinions(
    tmp_path: Path, trainer, owner_peer, signed: SignedManifest, servers: list[Any]
) -> tuple[ExpertCaller, AnswerAuditor, list[ExpertServerRef], list[str]]:
    """A trainer's caller and its auditor (every answer drawn), with an audit budget
    smaller than one expert: no weights are fetched, each drawn answer is put to other
    servers among ``servers``. Returns with them the list of those servers' refs (a test
    may change it) and the peer ids that gave opinions, in order."""
    weights = PublishedWeights(
        trainer,
        signed,
        ChunkStore(tmp_path / "trainer-chunks"),
        aggregator_keys=[owner_peer.identity.public_key],
        max_bytes=1024,
    )
    assert weights.expert_bytes > 1024
    caller = ExpertCaller(
        trainer.rpc,
        codecs=signed.manifest.model.wire.codecs(),
        dtype=signed.manifest.model.expert_spec().torch_dtype,
    )
    refs = [ExpertServerRef(p.peer_id) for p in servers]
    opinions: list[str] = []

    async def second_opinion(answer, asked):
        got = await caller.opinion(answer, refs, asked)
        if got is not None:
            opinions.append(str(got[0]))
        return got

    dtype = signed.manifest.model.expert_spec().torch_dtype
    auditor = AnswerAuditor(weights, dtype, rate=1.0, second_opinion=second_opinion)
    caller.auditor = auditor
    return caller, auditor, refs, opinions


async def test_a_trainer_audits_answers_on_every_version_and_excludes_a_cheater(tmp_path):
    prepared = q4z_project(tmp_path)
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    async with (
        open_swarm(4, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner_peer, honest, cheater, trainer = (swarm.node(i) for i in range(4))
        service = await nursery.start(serve_project, owner_peer, prepared)
        # the owner's peer also plays the project's aggregator: its versions' chunks are
        # served from the same store
        agg_store = service.store
        servers = {}
        for peer, cheat in ((honest, None), (cheater, ANSWER_CHEATS["scaled-answers"])):
            signed, servers[peer] = await serve_expert(
                nursery, peer, pid, cheat, tmp_path / str(cheat)
            )
        weights = PublishedWeights(
            trainer,
            signed,
            ChunkStore(tmp_path / "trainer-chunks"),
            aggregator_keys=[owner_peer.identity.public_key],
            interval=0.2,
        )
        auditor = AnswerAuditor(weights, spec.torch_dtype, rate=1.0)
        await nursery.start(weights.watch)
        await nursery.start(auditor.run)
        caller = ExpertCaller(
            trainer.rpc,
            codecs=signed.manifest.model.wire.codecs(),
            dtype=signed.manifest.model.expert_spec().torch_dtype,
        )
        caller.auditor = auditor

        async def answers(peer, n: int = 4) -> None:
            ref = [ExpertServerRef(peer.peer_id)]
            for _ in range(n):
                x = torch.randn(8, spec.hidden)
                kept = await caller.forward(UID, ref, x, keep=True)
                await caller.backward(UID, ref, x, torch.randn(8, spec.hidden) * 1e-2, kept=kept)

        async def audited(n: int) -> None:
            with trio.fail_after(20):
                while auditor.stats.audited + auditor.stats.unverifiable < n:
                    await trio.sleep(0.05)

        # version 0: the owner's initial weights, fetched by their signed index
        await answers(honest)
        await audited(8)
        # versions 1 and 2, announced by the aggregator; the volunteer serves version 1
        # after version 2 is out: its record, seen by the trainer's watch, still fetches it
        honest_backend = servers[honest].backends[UID]
        newer = {}
        for version in (1, 2):
            module = build_expert(spec, seed=100 + version)
            newer[version] = module
            await announce(owner_peer, agg_store, pid, module, version)
            with trio.fail_after(10):  # the watch reads each record before the next is out
                while version not in weights.announced(UID):
                    await trio.sleep(0.05)
        replacement = build_expert(spec)
        replacement.load_state_dict(newer[1].state_dict())
        async with servers[honest].device:
            honest_backend.replace_weights(replacement, 1)
        await answers(honest)
        await audited(16)
        assert auditor.stats.failed == 0
        assert auditor.stats.unverifiable == 0
        assert auditor.stats.passed == 16
        assert 0 < auditor.stats.worst_passed <= 1
        # the cheater's first audited answer excludes it
        await answers(cheater, 1)
        with trio.fail_after(20):
            while not auditor.stats.excluded:
                await trio.sleep(0.05)
        assert auditor.stats.excluded == [str(cheater.peer_id)]
        finding = auditor.findings[0]
        assert finding.answer.server == cheater.peer_id
        assert finding.answer.version == 0
        assert finding.excess > 1
        # the cheater signed what it claimed: anyone with version 0's published weights
        # can recompute the whole answer and see it is wrong
        assert finding.answer.evidence is not None
        initial = await weights.module(UID, 0)
        assert initial is not None
        assert check_evidence(finding.answer.evidence, initial, spec.torch_dtype) > 1
        nursery.cancel_scope.cancel()


async def test_a_trainer_without_room_for_the_weights_asks_other_servers_instead(tmp_path):
    # the audits' memory budget holds less than one expert: the trainer never fetches
    # weights, and puts each drawn forward answer to other servers of its expert. One
    # honest server reproduces an honest answer; two honest servers, agreeing with each
    # other, convict the cheater; a cheater's word against one honest server settles
    # nothing.
    prepared = q4z_project(tmp_path)
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    async with (
        open_swarm(5, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner_peer, honest_a, honest_b, cheater, trainer = (swarm.node(i) for i in range(5))
        await nursery.start(serve_project, owner_peer, prepared)
        cheats = {honest_a: None, honest_b: None, cheater: ANSWER_CHEATS["scaled-answers"]}
        for i, (peer, cheat) in enumerate(cheats.items()):
            signed, _ = await serve_expert(nursery, peer, pid, cheat, tmp_path / f"v{i}")
        caller, auditor, refs, opinions = auditing_by_opinions(
            tmp_path, trainer, owner_peer, signed, list(cheats)
        )

        async def forward(peer) -> None:
            await caller.forward(UID, [ExpertServerRef(peer.peer_id)], torch.randn(8, spec.hidden))

        # honest answers: honest_b reproduces each (asked first, or after the cheater)
        for _ in range(4):
            await forward(honest_a)
            answer = await auditor._receive.receive()
            over = await auditor.check(answer)
            assert over is not None
            assert over <= 1
            assert opinions[-1] == str(honest_b.peer_id)
        assert auditor.stats.passed == 4
        assert auditor.stats.by_quorum == 4
        assert auditor.stats.unverifiable == 0
        # honest_a's answers were never put to honest_a itself
        assert str(honest_a.peer_id) not in opinions
        # the cheater's answer: both honest servers disagree with it, and agree: excluded
        await forward(cheater)
        answer = await auditor._receive.receive()
        over = await auditor.check(answer)
        assert over is not None
        assert over > 1
        assert auditor.stats.excluded == [str(cheater.peer_id)]
        assert opinions[-2:] in (
            [str(honest_a.peer_id), str(honest_b.peer_id)],
            [str(honest_b.peer_id), str(honest_a.peer_id)],
        )
        # with the cheater as the only other server, an honest answer is not convicted
        # on its word: the cheater disagrees, no second server is left, inconclusive
        refs[:] = [ExpertServerRef(honest_a.peer_id), ExpertServerRef(cheater.peer_id)]
        await forward(honest_a)
        answer = await auditor._receive.receive()
        assert await auditor.check(answer) is None
        assert auditor.stats.unverifiable == 1
        assert auditor.stats.excluded == [str(cheater.peer_id)]
        nursery.cancel_scope.cancel()


async def test_backward_answers_without_the_weights_are_recomputed_by_other_servers(tmp_path):
    # as above for backward answers: another server is asked for the input gradients
    # alone (a recomputation: nothing reaches its accumulator, so the audit earns it no
    # contribution), two honest servers convict a cheater, and only the project's
    # trainers may ask for a recomputation
    prepared = q4z_project(tmp_path)
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    async with (
        open_swarm(6, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner_peer, honest_a, honest_b, cheater, trainer, stranger = (
            swarm.node(i) for i in range(6)
        )
        await nursery.start(serve_project, owner_peer, prepared)
        cheats = {honest_a: None, honest_b: None, cheater: ANSWER_CHEATS["scaled-answers"]}
        servers = {}
        for i, (peer, cheat) in enumerate(cheats.items()):
            signed, servers[peer] = await serve_expert(
                nursery, peer, pid, cheat, tmp_path / f"v{i}", [trainer.identity.public_key]
            )
        caller, auditor, _, opinions = auditing_by_opinions(
            tmp_path, trainer, owner_peer, signed, list(cheats)
        )

        def samples(peer) -> int:
            return servers[peer].backends[UID].accumulator.samples

        async def backward(peer) -> Answer:
            x, grad = torch.randn(8, spec.hidden), torch.randn(8, spec.hidden)
            await caller.backward(UID, [ExpertServerRef(peer.peer_id)], x, grad)
            answer = await auditor._receive.receive()
            assert answer.kind == "backward"
            return answer

        # an honest answer: honest_b reproduces it, and accumulates nothing for it
        for _ in range(3):
            answer = await backward(honest_a)
            over = await auditor.check(answer)
            assert over is not None
            assert over <= 1
            assert opinions[-1] == str(honest_b.peer_id)
        assert auditor.stats.passed == 3
        assert auditor.stats.by_quorum == 3
        assert samples(honest_a) == 3 * 8  # its own backward passes, contributed
        assert samples(honest_b) == 0
        # the cheater's scaled input gradients: both honest servers disagree, and agree
        answer = await backward(cheater)
        over = await auditor.check(answer)
        assert over is not None
        assert over > 1
        assert auditor.stats.excluded == [str(cheater.peer_id)]
        assert sorted(opinions[-2:]) == sorted([str(honest_a.peer_id), str(honest_b.peer_id)])
        assert samples(honest_a) == 3 * 8
        assert samples(honest_b) == 0
        # a stranger cannot ask for a recomputation (work that earns the volunteer nothing)
        x = torch.randn(2, spec.hidden)
        wires = [*activations.encode(x, "raw"), *activations.encode(x, "raw")]
        with pytest.raises(BadRequest, match="only the project's trainers"):
            await stranger.rpc.call(
                honest_a.peer_id, BACKWARD, {"uid": UID, "recompute": True}, wires, timeout=30
            )
        nursery.cancel_scope.cancel()


async def test_two_agreeing_sybils_never_get_an_honest_server_banned(tmp_path):
    """Issue 35, finding 3: servers are free identities; two running the same cheat
    convicted every honest volunteer by quorum, with a 24-hour project-wide ban. A
    quorum's verdict now excludes locally, for a while, and bans nobody."""
    prepared = q4z_project(tmp_path)
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    async with (
        open_swarm(5, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner_peer, honest, sybil_a, sybil_b, trainer = (swarm.node(i) for i in range(5))
        await nursery.start(serve_project, owner_peer, prepared)
        scaled = ANSWER_CHEATS["scaled-answers"]
        cheats = {honest: None, sybil_a: scaled, sybil_b: scaled}
        for i, (peer, cheat) in enumerate(cheats.items()):
            signed, _ = await serve_expert(nursery, peer, pid, cheat, tmp_path / f"v{i}")
        caller, auditor, _, opinions = auditing_by_opinions(
            tmp_path, trainer, owner_peer, signed, list(cheats)
        )
        await caller.forward(UID, [ExpertServerRef(honest.peer_id)], torch.randn(8, spec.hidden))
        over = await auditor.check(await auditor._receive.receive())
        assert over is not None
        assert over > 1  # the Sybils agree with each other, not with the honest answer
        assert sorted(opinions) == sorted([str(sybil_a.peer_id), str(sybil_b.peer_id)])
        (finding,) = auditor.findings
        assert finding.by_quorum
        assert auditor.is_excluded(honest.peer_id)  # here, for a while
        assert finding.exclusion_seconds == QUORUM_EXCLUSION_S
        board = RecordingBoard()
        _accuse(board, finding)  # type: ignore[arg-type]
        assert board.accused == []  # no ban in the project
        nursery.cancel_scope.cancel()


async def test_a_dispute_goes_to_the_aggregator_that_holds_the_weights(tmp_path):
    """Issue 35, finding 3, beyond a lapsing exclusion: where two servers agree against
    an answer, the expert's aggregator (which holds the weights of its versions)
    recomputes the rows. A cheat it confirms is convicted by the weights (a finding
    for a ban, for good); an honest answer two Sybils framed is cleared, and the
    Sybils are the ones excluded."""
    prepared = q4z_project(tmp_path)
    pid = prepared.signed.project_id
    spec = prepared.signed.manifest.model.expert_spec()
    async with (
        open_swarm(6, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner_peer, honest_a, honest_b, sybil_a, sybil_b, trainer = (
            swarm.node(i) for i in range(6)
        )
        await nursery.start(serve_project, owner_peer, prepared)
        scaled = ANSWER_CHEATS["scaled-answers"]
        cheats = {honest_a: None, honest_b: None, sybil_a: scaled, sybil_b: scaled}
        servers = {}
        for i, (peer, cheat) in enumerate(cheats.items()):
            signed, servers[peer] = await serve_expert(
                nursery, peer, pid, cheat, tmp_path / f"v{i}"
            )
        settings = AggregatorSettings(
            project=pid, spec=spec, uids=(UID,), trainers=frozenset({trainer.identity.public_key})
        )
        initial = {UID: copy.deepcopy(servers[honest_a].backends[UID].module)}
        core = AggregatorCore(settings, tmp_path / "aggregator", initial=initial)
        aggregator = await nursery.start(AggregatorService(owner_peer, core).run)
        caller, auditor, refs, opinions = auditing_by_opinions(
            tmp_path, trainer, owner_peer, signed, [honest_a, honest_b]
        )
        auditor.referee = partial(caller.referee, aggregator=owner_peer.peer_id)
        excluded: list[tuple[Any, float]] = []
        auditor.exclusion_listeners.append(lambda peer, seconds: excluded.append((peer, seconds)))
        x = torch.randn(8, spec.hidden)

        # a cheat that two honest servers dispute: the weights confirm it
        await caller.forward(UID, [ExpertServerRef(sybil_a.peer_id)], x)
        over = await auditor.check(await auditor._receive.receive())
        assert over is not None
        assert over > 1
        (finding,) = auditor.findings
        assert not finding.by_quorum  # checked against the weights: ban-worthy
        assert excluded == [(sybil_a.peer_id, math.inf)]
        assert aggregator.refereed == 1
        board = RecordingBoard()
        _accuse(board, finding)  # type: ignore[arg-type]
        assert len(board.accused) == 1

        # an honest answer the two Sybils frame: cleared, and the Sybils excluded
        refs[:] = [ExpertServerRef(sybil_a.peer_id), ExpertServerRef(sybil_b.peer_id)]
        await caller.forward(UID, [ExpertServerRef(honest_a.peer_id)], x)
        over = await auditor.check(await auditor._receive.receive())
        assert over is not None
        assert over <= 1
        assert opinions[-2:] in (
            [str(sybil_a.peer_id), str(sybil_b.peer_id)],
            [str(sybil_b.peer_id), str(sybil_a.peer_id)],
        )
        assert len(auditor.findings) == 1  # no new one
        assert not auditor.is_excluded(honest_a.peer_id)
        assert auditor.is_excluded(sybil_b.peer_id)
        assert excluded[1:] == [(sybil_b.peer_id, math.inf)]
        assert auditor.stats.refereed == 2

        # only the manifest's trainers may put work on the referee
        meta = {"uid": UID, "version": 0, "kind": "forward"}
        with pytest.raises(BadRequest, match="only the project's trainers"):
            await honest_b.rpc.call(
                owner_peer.peer_id, REFEREE, meta, activations.encode(x, "raw"), timeout=30
            )
        nursery.cancel_scope.cancel()
