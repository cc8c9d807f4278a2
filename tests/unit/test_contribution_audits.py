"""Contribution audits (core/aggregator/audit.py, docs/decisions/010): contributions built
by the real volunteer path (backend, kept tensors, error feedback, sender) pass their
audit in every codec, however their requests were batched; every gradient cheat fails;
tampered reveals fail; a residual is bounded by the contribution it came from; evidence
convinces a third party."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import trio

from core.aggregator.audit import (
    ContributionEvidence,
    Verdict,
    audit,
    check_contribution_evidence,
)
from core.aggregator.auditor import ContributionAuditor, _kind
from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.verify import check_payload
from core.contributing.codecs import CODECS
from core.contributing.reveal import Reveal, RevealError
from core.contributing.sender import ContributionSender, SenderConfig, _Kept
from core.demo.attacks import Attack
from core.experts.backend import ExpertBackend
from core.experts.kept import KeptBudget
from core.experts.registry import ExpertSpec, build_expert
from core.experts.uid import ExpertUID
from core.protocol.contributions import Contribution, Receipt
from net import Identity

SPEC = ExpertSpec("ffn", hidden=16, inner=32)
SPEC_SWIGLU = ExpertSpec("swiglu", hidden=16, inner=32, activation="silu")
UID = "ffn0.0.0"
PROJECT = "0123456789abcdef0123456789abcdef"
TRAINER = Identity.from_seed(b"t" * 32)
VOLUNTEER = Identity.from_seed(b"v" * 32)


class Volunteer:
    """One expert served and contributed through the real code: backward passes into the
    accumulator (tensors kept), contributions built by the sender (error feedback)."""

    def __init__(
        self,
        codec: str = "fp16",
        attack: str | None = None,
        spec: ExpertSpec = SPEC,
        budget: int = 2**30,
        seed: int = 0,
    ) -> None:
        self.spec = spec
        self.backend = ExpertBackend(ExpertUID.parse(UID), spec, build_expert(spec, seed=1))
        peer: Any = SimpleNamespace(identity=VOLUNTEER)
        self.sender = ContributionSender(
            peer,
            {UID: self.backend},
            [TRAINER.peer_id],
            SenderConfig(project=PROJECT, codec=codec, kept_bytes=budget),
            sums_hook=None if attack is None else Attack(attack),
        )
        self.generator = torch.Generator().manual_seed(seed)

    def inputs(self, rows: int) -> torch.Tensor:
        return torch.randn((rows, self.spec.hidden), generator=self.generator)

    def serve(self, batches: list[list[int]]) -> None:
        """Backward passes: each batch runs its requests (rows each) together, as the
        server's pool batches them."""
        for batch in batches:
            xs = [self.inputs(rows) for rows in batch]
            gs = [torch.randn(x.shape, generator=self.generator) for x in xs]
            receipts = [
                Receipt.sign(TRAINER, PROJECT, UID, self.backend.version, [x], [g], x.shape[0])
                for x, g in zip(xs, gs, strict=True)
            ]
            self.backend.backward(torch.cat(xs), torch.cat(gs), receipts=receipts)

    def contribute(self) -> tuple[Contribution, list[torch.Tensor], _Kept]:
        ((module, accumulator),) = self.backend.accumulators()
        built = self.sender._build(UID, self.backend, module, accumulator)
        assert built is not None
        return built


def judge(
    contribution: Contribution, parts: list[torch.Tensor], kept: _Kept, *, carried: bool = True
) -> Verdict:
    assert kept.reveal is not None
    module = build_expert(contribution_spec(contribution), seed=1)
    return audit(
        contribution_spec(contribution),
        module,
        contribution,
        parts,
        kept.reveal,
        carried_accepted=carried,
    )


def contribution_spec(contribution: Contribution) -> ExpertSpec:
    return SPEC_SWIGLU if any(p.name.startswith("w1") for p in contribution.params) else SPEC


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_honest_contributions_pass_in_every_codec_however_batched(codec: str) -> None:
    volunteer = Volunteer(codec)
    worst = 0.0
    plans = [[[3]], [[2, 5], [1]], [[4], [4], [4, 4, 1]], [[7, 1, 2]], [[1]] * 6, [[16], [3]]]
    for i, plan in enumerate(plans):
        volunteer.serve(plan)
        contribution, parts, kept = volunteer.contribute()
        assert bool(contribution.carried) == (i > 0)  # the residual of the previous one
        verdict = judge(contribution, parts, kept)
        assert verdict.outcome == "passed", verdict
        worst = max(worst, verdict.excess)
    assert worst <= 1.0


def test_honest_swiglu_contributions_pass() -> None:
    volunteer = Volunteer("int8_block", spec=SPEC_SWIGLU)
    for plan in ([[2, 3]], [[1], [4]], [[2, 2, 2]]):
        volunteer.serve(plan)
        verdict = judge(*volunteer.contribute())
        assert verdict.outcome == "passed", verdict


@pytest.mark.parametrize("attack", ["sign-flip", "alie", "copied", "drift"])
@pytest.mark.parametrize("codec", ["fp16", "int8_block"])
def test_every_gradient_cheat_fails(attack: str, codec: str) -> None:
    volunteer = Volunteer(codec, attack=attack)
    verdicts = []
    for plan in ([[4, 4]], [[8]], [[2, 6]], [[8]]):
        volunteer.serve(plan)
        verdicts.append(judge(*volunteer.contribute()))
    # copied sends its own first gradient honestly (there is nothing to copy yet)
    cheated = verdicts[1:] if attack == "copied" else verdicts
    assert all(v.outcome == "failed" for v in cheated), verdicts
    assert all(v.excess > 1 for v in cheated)


def test_a_scaled_gradient_fails() -> None:
    volunteer = Volunteer("fp16")
    volunteer.serve([[8]])
    contribution, parts, kept = volunteer.contribute()
    module = build_expert(SPEC, seed=1)
    assert kept.reveal is not None
    scaled = [p.float().mul(1.01).half() for p in parts]
    forged = _resigned(contribution, parts=scaled)
    verdict = audit(SPEC, module, forged, scaled, kept.reveal, carried_accepted=True)
    assert verdict.outcome == "failed"


def test_revealed_tensors_must_be_the_receipts() -> None:
    volunteer = Volunteer()
    volunteer.serve([[3, 2]])
    contribution, parts, kept = volunteer.contribute()
    assert kept.reveal is not None
    (x, g), second = kept.reveal.pairs
    other = x.clone()
    other[0, 0] += 1e-3
    tampered = replace(kept.reveal, pairs=((other, g), second))
    verdict = audit(
        SPEC, build_expert(SPEC, seed=1), contribution, parts, tampered, carried_accepted=True
    )
    assert (verdict.outcome, verdict.problem) == (
        "failed",
        "revealed inputs 0 are not the receipt's",
    )


def test_a_residual_is_bounded_by_the_contribution_it_came_from() -> None:
    volunteer = Volunteer("int8_block")
    volunteer.serve([[8]])
    volunteer.contribute()
    volunteer.serve([[8]])
    contribution, parts, kept = volunteer.contribute()
    assert kept.reveal is not None
    assert kept.reveal.residual is not None
    assert judge(contribution, parts, kept).outcome == "passed"
    # a cheater sends what it likes and "reveals" the difference as its residual
    names = [p.name for p in contribution.params]
    claimed = {n: torch.randn(p.numel) for n, p in zip(names, contribution.params, strict=True)}
    honest = {n: kept.reveal.residual[n] for n in names}
    smuggled = {n: honest[n] + claimed[n] * 0.5 for n in names}
    verdict = audit(
        SPEC,
        build_expert(SPEC, seed=1),
        contribution,
        parts,
        replace(kept.reveal, residual=smuggled),
        carried_accepted=True,
    )
    assert verdict.outcome == "failed"
    assert "residual" in verdict.problem
    # the carried contribution's parts cannot be swapped for a coarser grid's
    coarse = [p.clone() for p in kept.reveal.carried_parts]
    coarse[1] = coarse[1] * 100
    verdict = audit(
        SPEC,
        build_expert(SPEC, seed=1),
        contribution,
        parts,
        replace(kept.reveal, carried_parts=tuple(coarse)),
        carried_accepted=True,
    )
    assert (verdict.outcome, verdict.problem) == (
        "failed",
        "the carried contribution's parts are not its own",
    )
    # an unknown carried contribution cannot bound anything: unverifiable, no blame
    assert judge(contribution, parts, kept, carried=False).outcome == "unverifiable"


def test_a_refused_contributions_residual_is_not_carried() -> None:
    volunteer = Volunteer("int8_block")
    volunteer.serve([[8]])
    first, _, _ = volunteer.contribute()
    volunteer.sender._forget_residual(UID, first)
    volunteer.serve([[8]])
    assert_carries_nothing(*volunteer.contribute())


def test_a_residual_older_than_the_carry_horizon_is_not_carried(monkeypatch) -> None:
    """The aggregator forgets a nonce an hour after its contribution was signed
    (core/aggregator/replay.py); a residual carried from one that old could not be
    audited, so the volunteer drops it (its weights are long gone too)."""
    import time

    from core.contributing import sender as sender_module
    from core.protocol.contributions import CARRY_HORIZON_S

    volunteer = Volunteer("int8_block")
    volunteer.serve([[8]])
    volunteer.contribute()
    volunteer.serve([[8]])
    recent, _, _ = volunteer.contribute()
    assert recent.carried != b""  # within the horizon: carried
    later = time.time() + CARRY_HORIZON_S + 1
    monkeypatch.setattr(sender_module, "time", SimpleNamespace(time=lambda: later))
    volunteer.serve([[8]])
    assert_carries_nothing(*volunteer.contribute())


def assert_carries_nothing(contribution: Contribution, parts: Any, kept: Any) -> None:
    """A contribution without a residual, which passes its audit all the same."""
    assert contribution.carried == b""
    assert kept.reveal is not None
    assert kept.reveal.residual is None
    assert judge(contribution, parts, kept, carried=False).outcome == "passed"


def test_inflated_int8_scales_buy_no_rounding_room() -> None:
    codec = CODECS["int8_block"]
    t = torch.randn(3000)
    codes, scales = codec.encode(t)
    honest = codec.rounding_bound([codes, scales], t.numel())
    # the same values with scales x100 and codes /100: mostly zeros, a coarse grid
    coarse = [torch.round(codes.float() / 100).to(torch.int8), scales * 100]
    assert torch.all(codec.rounding_bound(coarse, t.numel()) <= honest * 1.0001)
    assert float((t - codec.decode(coarse, t.numel())).abs().max()) > float(honest.max())


def test_nothing_is_revealable_beyond_the_kept_budget() -> None:
    volunteer = Volunteer(budget=2000)  # two 4-row requests fit (512 bytes each), not 16 rows
    volunteer.serve([[4], [4], [16]])
    budget = volunteer.sender.kept_budget
    assert budget is not None
    assert budget.refused == 1
    assert budget.used == 0
    _contribution, _, kept = volunteer.contribute()
    assert kept.reveal is None
    assert kept.nbytes == 0
    volunteer.serve([[4]])
    _, _, kept = volunteer.contribute()
    assert kept.reveal is not None
    assert budget.used == kept.nbytes > 0
    budget.give_back(kept.nbytes)
    assert budget.used == 0
    assert KeptBudget(10).take(11) is False


def test_a_reveal_round_trips_and_misfits_are_refused() -> None:
    volunteer = Volunteer("int8_block")
    for _ in range(2):
        volunteer.serve([[2, 3]])
        contribution, parts, kept = volunteer.contribute()
    assert kept.reveal is not None
    meta, tensors = kept.reveal.to_wire()
    back = Reveal.from_wire(meta, tensors, contribution, SPEC)
    verdict = audit(
        SPEC, build_expert(SPEC, seed=1), contribution, parts, back, carried_accepted=True
    )
    assert verdict.outcome == "passed"
    with pytest.raises(RevealError, match="expected"):
        Reveal.from_wire(meta, tensors[:-1], contribution, SPEC)
    with pytest.raises(RevealError, match="pairs"):
        Reveal.from_wire({**meta, "pairs": 1}, tensors, contribution, SPEC)
    wrong_rows = [tensors[0][:1], *tensors[1:]]
    with pytest.raises(RevealError, match="does not fit"):
        Reveal.from_wire(meta, wrong_rows, contribution, SPEC)
    wrong_dtype = [tensors[0].double(), *tensors[1:]]
    with pytest.raises(RevealError, match="does not fit"):
        Reveal.from_wire(meta, wrong_dtype, contribution, SPEC)
    with pytest.raises(RevealError, match="exactly when"):
        Reveal.from_wire(
            {k: v for k, v in meta.items() if k != "carried"}, tensors, contribution, SPEC
        )


def test_evidence_convinces_a_third_party_and_tampering_shows() -> None:
    cheater = Volunteer("fp16", attack="drift")
    cheater.serve([[8]])
    contribution, parts, kept = cheater.contribute()
    assert kept.reveal is not None
    verdict = judge(contribution, parts, kept)
    evidence = ContributionEvidence(
        contribution.encode(), tuple(parts), kept.reveal, verdict.excess
    )
    weights = build_expert(SPEC, seed=1)
    assert check_contribution_evidence(evidence, SPEC, weights) is None
    honest = Volunteer("fp16")
    honest.serve([[8]])
    c, p, k = honest.contribute()
    assert k.reveal is not None
    cleared = check_contribution_evidence(
        ContributionEvidence(c.encode(), tuple(p), k.reveal, 0.0), SPEC, weights
    )
    assert cleared is not None
    assert cleared.startswith("the contribution passes")
    # someone else's parts under the cheater's signature
    swapped = check_contribution_evidence(replace(evidence, parts=tuple(p)), SPEC, weights)
    assert swapped == "the parts are not the contribution's"
    resigned = _resigned(contribution, parts, identity=Identity.from_seed(b"x" * 32))
    forged = replace(evidence, header=_with_contributor(resigned, contribution.contributor))
    assert check_contribution_evidence(forged, SPEC, weights) == (
        "the contribution is not signed by its contributor"
    )
    assert math.isfinite(verdict.excess)
    assert verdict.excess > 1


def _resigned(
    c: Contribution, parts: list[torch.Tensor], identity: Identity = VOLUNTEER
) -> Contribution:
    return Contribution.create(
        identity,
        project=c.project,
        uid=c.uid,
        base_version=c.base_version,
        codec=c.codec,
        params=c.params,
        receipts=c.receipts,
        parts=parts,
        nonce=c.nonce,
        timestamp=c.timestamp,
        carried=c.carried,
    )


def _with_contributor(c: Contribution, contributor: bytes) -> bytes:
    return replace(c, contributor=contributor).encode()


async def test_an_audit_waits_for_the_contribution_it_carries_to_arrive(tmp_path) -> None:
    # a volunteer delivers its contributions concurrently: the one carrying a residual
    # can be accepted (and audited) before the one it came from
    volunteer = Volunteer("int8_block")
    volunteer.serve([[4]])
    first, first_parts, _ = volunteer.contribute()
    volunteer.serve([[4]])
    second, second_parts, kept = volunteer.contribute()
    assert second.carried == first.nonce
    assert kept.reveal is not None
    settings = AggregatorSettings(
        project=PROJECT,
        spec=SPEC,
        uids=(UID,),
        trainers=frozenset({TRAINER.public_key}),
        contribution_audit_rate=1.0,
    )
    core = AggregatorCore(settings, tmp_path, initial={UID: build_expert(SPEC, seed=1)})
    auditor = ContributionAuditor(core, trio.CapacityLimiter(1), rate=1.0)
    check_payload(second, second_parts)
    core.accept(second, second_parts, second.timestamp, held=True)
    auditor.hold(second, second_parts)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(auditor._audit, auditor._held.pop(second.nonce), kept.reveal)
        with trio.fail_after(10):  # the audit waits for the carried contribution
            while first.nonce not in auditor._awaited:
                await trio.sleep(0.01)
        assert auditor.stats.passed + auditor.stats.unverifiable == 0
        check_payload(first, first_parts)
        core.accept(first, first_parts, first.timestamp)
        auditor.accepted(first.nonce)
    assert auditor.stats.passed == 1
    assert not core.held()
    assert core.pending_samples(UID) == 8
    core.close()


@pytest.mark.parametrize(
    ("problem", "kind"),
    [
        ("revealed inputs 12 are not the receipt's", "revealed inputs are not the receipt's"),
        ("the residual of fc1.weight exceeds its rounding", "the residual of exceeds its rounding"),
        (
            "its gradient is not what its receipts compute (3.9e+03x the bound)",
            "its gradient is not what its receipts compute",
        ),
    ],
)
def test_audit_problems_are_counted_by_kind_whatever_a_cheater_names(
    problem: str, kind: str
) -> None:
    # the aggregator's stats count problems by kind: a cheater cannot make them grow
    assert _kind(problem) == kind
