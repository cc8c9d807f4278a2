"""Answer audits: the bound of an honest answer (core/experts/tolerance.py) holds for
honest answers computed other ways and in every codec, and cheats of each kind pass it;
the auditor draws, recomputes, excludes a cheater once and counts what it could not
check."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import trio
from torch import nn

from core.demo.cheats import ANSWER_CHEATS
from core.experts import activations
from core.experts.answers import AnswerDraft
from core.experts.registry import ExpertSpec, build_expert
from core.experts.tolerance import excess
from core.moe.answer_checks import (
    QUORUM_EXCLUSION_S,
    Answer,
    Evidence,
    EvidenceError,
    Finding,
    audit,
    by_quorum,
    check_evidence,
    recompute,
)
from core.moe.audit import AnswerAuditor
from core.protocol.answers import NONE, AnswerStatement, parts_digest
from core.protocol.contributions import tensor_digest
from net import Identity

SPEC = ExpertSpec("ffn", hidden=64, inner=256)
CODECS = ["raw", "f16", "bf16", "q8", "q4", "q4z", "q3"]
HONEST_ID = Identity.from_seed(b"h" * 32)
CHEATER_ID = Identity.from_seed(b"c" * 32)
HONEST, CHEATER = HONEST_ID.peer_id, CHEATER_ID.peer_id


def expert(seed: int = 1) -> nn.Module:
    return build_expert(SPEC, seed=seed).requires_grad_(False)


def answer(kind, claimed, x, g=None, *, codec="raw", server=HONEST, version=0) -> Answer:
    return Answer(kind, "ffn.0.0", server, version, x, g, claimed, codec)


def signed(kind, answer_tensor, x, g=None, *, codec="raw", by=HONEST_ID, version=0) -> Answer:
    """An answer as a server sends it (encoded, with its signed statement) and as the
    trainer hands it to its auditor."""
    parts = tuple(activations.encode(answer_tensor, codec))
    statement = AnswerStatement.sign(
        by,
        project="p",
        uid="ffn.0.0",
        version=version,
        kind=kind,
        codec=codec,
        inputs_sha256=tensor_digest([x]),
        grads_sha256=NONE if g is None else tensor_digest([g]),
        answer_sha256=parts_digest(parts),
    )
    claimed = activations.decode(parts, codec, width=x.shape[-1], dtype=x.dtype)
    evidence = Evidence(statement, x, g, parts)
    return Answer(kind, "ffn.0.0", by.peer_id, version, x, g, claimed, codec, evidence)


def forward_row_by_row(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Another GEMM path: one row at a time (matrix-vector kernels round differently)."""
    with torch.no_grad():
        return torch.cat([module(x[i : i + 1]) for i in range(x.shape[0])])


def forward_in_float64(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A volunteer computing at higher precision and rounding the result."""
    wide = build_expert(SPEC).double()
    wide.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    with torch.no_grad():
        return wide(x.double()).float()


HONEST_FORWARDS = {
    "same": lambda m, x: recompute(m, answer("forward", None, x), torch.float32),
    "row by row": forward_row_by_row,
    "float64": forward_in_float64,
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("how", sorted(HONEST_FORWARDS))
def test_honest_forward_answers_pass_in_every_codec(codec, how):
    torch.manual_seed(0)
    module = expert()
    for _ in range(20):
        x = torch.randn(16, 64) * random.choice([0.1, 1.0, 30.0])
        honest = HONEST_FORWARDS[how](module, x)
        claimed = activations.roundtrip(honest, codec)
        assert audit(module, answer("forward", claimed, x, codec=codec), torch.float32) <= 1


@pytest.mark.parametrize("codec", CODECS)
def test_honest_backward_answers_pass_through_a_kept_graph_or_recomputed(codec):
    torch.manual_seed(1)
    module = expert()
    for _ in range(20):
        x = torch.randn(8, 64)
        g = torch.randn(8, 64) * 1e-3
        # a kept graph: the server's forward pass with grad, its backward later
        xk = x.clone().requires_grad_(True)
        with torch.enable_grad():
            module(xk).backward(g)
        assert xk.grad is not None
        claimed = activations.roundtrip(xk.grad, codec)
        assert audit(module, answer("backward", claimed, x, g, codec=codec), torch.float32) <= 1


def older(module: nn.Module) -> nn.Module:
    """The weights one optimizer step before: every parameter moved by ~1e-3."""
    torch.manual_seed(5)
    before = expert()
    before.load_state_dict(
        {k: v - 1e-3 * torch.randn_like(v).sign() for k, v in module.state_dict().items()}
    )
    return before


def half_the_inner_units(m: Any, x: torch.Tensor) -> torch.Tensor:
    """A cheaper model: half the feed-forward units, doubled to keep the scale."""
    kept = (torch.arange(SPEC.inner_dim) < SPEC.inner_dim // 2).float() * 2
    out: torch.Tensor = x + m.fc2(m.act(m.fc1(m.norm(x))) * kept)
    return out


def forward_of(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return recompute(module, answer("forward", None, x), torch.float32)


Cheat = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
CHEATS: dict[str, Cheat] = {
    "scaled x1.02": lambda m, x, y: y * 1.02,
    "noised 3% of rms": lambda m, x, y: y + 0.03 * y.std() * torch.randn_like(y),
    "older version": lambda m, x, y: forward_of(older(m), x),
    "lazy: inputs back": lambda m, x, y: x.clone(),
    "lazy: half the inner units": lambda m, x, y: half_the_inner_units(m, x),
    "another expert's answer": lambda m, x, y: forward_of(expert(seed=2), x),
    "sign flip": lambda m, x, y: -y,
}


@pytest.mark.parametrize("codec", ["raw", "bf16", "q8", "q4z"])
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_kind_of_cheat_fails_its_audit(codec, cheat):
    torch.manual_seed(2)
    module = expert()
    for _ in range(5):
        x = torch.randn(16, 64)
        with torch.no_grad():
            honest = module(x)
            wrong = CHEATS[cheat](module, x, honest)
        claimed = activations.roundtrip(wrong, codec)
        assert audit(module, answer("forward", claimed, x, codec=codec), torch.float32) > 1


@pytest.mark.parametrize(
    ("claimed", "expected", "want"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 3), 0.0),  # an all-zero row allows exactly zero
        (torch.full((2, 3), 1e-9), torch.zeros(2, 3), math.inf),
        (torch.zeros(2, 4), torch.zeros(2, 3), math.inf),  # another shape
        (torch.tensor([[1.0, float("nan")]]), torch.ones(1, 2), math.inf),
        (torch.empty(0, 3), torch.empty(0, 3), 0.0),
    ],
)
def test_edge_cases_of_the_bound(claimed, expected, want):
    got = excess(claimed, expected, "raw", torch.float32)
    assert got == want or (math.isinf(want) and got > 1e6)


class Versions:
    """VersionWeights from a dict: (uid, version) -> module."""

    def __init__(self, modules: dict[tuple[str, int], nn.Module]) -> None:
        self.modules = modules

    async def module(self, uid: str, version: int) -> nn.Module | None:
        return self.modules.get((uid, version))


async def test_the_auditor_excludes_a_cheater_once_and_counts_what_it_cannot_check():
    module = expert()
    found: list[Finding] = []
    auditor = AnswerAuditor(
        Versions({("ffn.0.0", 3): module}), torch.float32, rate=1.0, on_mismatch=found.append
    )
    x = torch.randn(4, 64)
    with torch.no_grad():
        y = module(x)
    for _ in range(3):
        assert auditor.draw()
        auditor.submit(signed("forward", y, x, version=3))
        auditor.submit(signed("forward", y * 1.1, x, by=CHEATER_ID, version=3))
        auditor.submit(signed("forward", y, x, version=2))  # weights not at hand
    auditor.close()
    await auditor.run()  # audits what was queued, then returns
    s = auditor.stats
    assert (s.drawn, s.passed, s.failed, s.unverifiable) == (9, 3, 1, 3)
    assert s.dropped == 2  # the cheater's later answers: it is excluded already
    assert s.excluded == [str(CHEATER)]
    assert auditor.is_excluded(CHEATER)
    assert not auditor.is_excluded(HONEST)
    assert [f.answer.server for f in found] == [CHEATER]
    assert found[0].excess > 1
    assert s.worst_passed == 0  # the honest answers were computed exactly as recomputed


def test_the_draws_follow_the_rate():
    auditor = AnswerAuditor(
        Versions({}), torch.float32, rate=0.05, on_mismatch=print, rng=random.Random(7)
    )
    draws = sum(auditor.draw() for _ in range(20000))
    assert 800 < draws < 1200  # 1000 expected; 4.5 standard deviations either side
    with pytest.raises(ValueError, match="audit rate"):
        AnswerAuditor(Versions({}), torch.float32, rate=1.5, on_mismatch=print)


async def test_a_full_queue_drops_draws_instead_of_waiting():
    auditor = AnswerAuditor(Versions({}), torch.float32, rate=1.0, on_mismatch=print, queue=2)
    x = torch.zeros(1, 64)
    for _ in range(5):
        auditor.submit(answer("forward", x, x))  # no task drains the queue
    assert (auditor.stats.drawn, auditor.stats.dropped) == (5, 3)


@pytest.mark.parametrize(
    ("n", "share", "want"), [(16, 0.25, 4), (4, 0.25, 1), (1, 0.25, 1), (5, 1.0, 5)]
)
def test_a_share_of_an_answers_rows_is_audited(n, share, want):
    auditor = AnswerAuditor(
        Versions({}), torch.float32, rate=1.0, row_share=share, rng=random.Random(3)
    )
    rows = auditor.rows(n)
    assert len(rows) == want
    assert rows == sorted(set(rows))
    assert all(0 <= r < n for r in rows)
    with pytest.raises(ValueError, match="share of rows"):
        AnswerAuditor(Versions({}), torch.float32, rate=1.0, row_share=0.0)


@pytest.mark.parametrize("codec", CODECS)
def test_rows_are_encoded_on_their_own_so_an_auditor_can_check_a_few(codec):
    torch.manual_seed(4)
    x = torch.randn(16, 100) * torch.logspace(-3, 3, 16).unsqueeze(1)
    rows = [1, 7, 15]
    assert torch.equal(activations.roundtrip(x, codec)[rows], activations.roundtrip(x[rows], codec))


async def test_a_cheaters_signed_answer_is_evidence_anyone_can_check():
    module = expert()
    x, g = torch.randn(4, 64), torch.randn(4, 64) * 1e-2
    with torch.no_grad():
        y = module(x)
    auditor = AnswerAuditor(Versions({("ffn.0.0", 0): module}), torch.float32, rate=1.0)
    auditor.submit(signed("forward", y * 1.05, x, codec="q4z", by=CHEATER_ID))
    auditor.close()
    await auditor.run()
    (finding,) = auditor.findings
    evidence = finding.answer.evidence
    assert evidence is not None
    # a third party with the published weights: the volunteer signed a wrong answer
    assert check_evidence(evidence, expert(), torch.float32) > 1
    # an honest answer's evidence clears it, forward and backward
    honest = signed("forward", y, x, codec="q4z").evidence
    assert honest is not None
    assert check_evidence(honest, expert(), torch.float32) <= 1
    xk = x.clone().requires_grad_(True)
    module(xk).backward(g)
    back = signed("backward", xk.grad, x, g, codec="q8").evidence
    assert back is not None
    assert check_evidence(back, expert(), torch.float32) <= 1
    # evidence that is not what the volunteer signed proves nothing
    tampered = Evidence(evidence.statement, evidence.inputs + 1, None, evidence.parts)
    with pytest.raises(EvidenceError, match="inputs"):
        check_evidence(tampered, expert(), torch.float32)
    forged = Evidence(
        AnswerStatement(**{**evidence.statement.__dict__, "version": 7}),
        evidence.inputs,
        None,
        evidence.parts,
    )
    with pytest.raises(EvidenceError, match="signature"):
        check_evidence(forged, expert(), torch.float32)


async def test_an_answer_without_a_matching_statement_fails_its_audit_at_once():
    module = expert()
    x = torch.randn(2, 64)
    with torch.no_grad():
        y = module(x)
    auditor = AnswerAuditor(Versions({("ffn.0.0", 0): module}), torch.float32, rate=1.0)
    auditor.submit(answer("forward", y, x, server=CHEATER))  # right, but unsigned
    auditor.close()
    await auditor.run()
    assert auditor.stats.failed == 1
    assert auditor.stats.excluded == [str(CHEATER)]


@pytest.mark.parametrize("name", sorted(ANSWER_CHEATS))
def test_the_demos_answer_cheats_fail_their_audits(name):
    torch.manual_seed(6)
    module = expert()
    x = torch.randn(8, 64)
    with torch.no_grad():
        y = module(x)
    cheat = ANSWER_CHEATS[name]
    sent = cheat(AnswerDraft("forward", y, x, older(module)))
    assert sent.shape == y.shape
    assert torch.isfinite(sent).all()  # plausible: nothing a NaN check would catch
    claimed = activations.roundtrip(sent, "q4z")
    assert audit(module, answer("forward", claimed, x, codec="q4z"), torch.float32) > 1
    # the stale cheat answers honestly while it has no older weights
    if name == "stale-answers":
        assert torch.equal(cheat(AnswerDraft("forward", y, x, None)), y)


@pytest.mark.parametrize(
    ("first", "second", "agree", "verdict"),
    [
        (0.5, None, False, 0.5),  # the first other server reproduces it: passes
        (0.5, 30.0, True, 0.5),  # (no second is asked then; a second changes nothing)
        (30.0, 0.7, False, 0.7),  # the second reproduces it: two of three agree
        (30.0, 20.0, True, 20.0),  # two agreeing servers put it past the bound: fails
        (30.0, 20.0, False, None),  # three different answers: nothing settled
        (30.0, None, False, None),  # one server against the answer: its word alone
    ],
)
def test_a_quorum_of_other_servers_settles_an_answer_only_when_it_can(
    first, second, agree, verdict
):
    assert by_quorum(first, second, agree) == verdict


async def test_a_quorums_exclusion_lapses_and_the_weights_exclusion_does_not(autojump_clock):
    """Other servers' verdict (a quorum of free identities) leaves a server out for
    QUORUM_EXCLUSION_S; the published weights' verdict for good."""
    module = expert()
    x = torch.randn(4, 64)
    with torch.no_grad():
        y = module(x)

    async def convicted_by_two(answer: Answer, asked: set[Any]) -> tuple[Any, torch.Tensor]:
        return (f"sybil-{len(asked)}", y * 1.1)  # two servers that agree, not with it

    auditor = AnswerAuditor(
        Versions({("ffn.0.0", 1): module}), torch.float32, rate=1.0, on_mismatch=print
    )
    auditor.second_opinion = convicted_by_two
    for answer in [
        signed("forward", y, x, version=0),  # no weights of version 0: put to others
        signed("forward", y * 1.1, x, by=CHEATER_ID, version=1),
    ]:
        over = await auditor.check(answer)
        assert over is not None
        assert over > 1
    by_quorum, by_weights = auditor.findings
    assert (by_quorum.by_quorum, by_weights.by_quorum) == (True, False)
    assert by_weights.exclusion_seconds == math.inf
    assert auditor.is_excluded(HONEST)
    assert auditor.is_excluded(CHEATER)
    await trio.sleep(QUORUM_EXCLUSION_S + 1)
    assert not auditor.is_excluded(HONEST)
    assert auditor.is_excluded(CHEATER)
