"""The aggregator engine: durable acceptance, rounds, exactly-once after a crash, bans."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.robust import RobustSettings
from core.aggregator.store import StateFile
from core.aggregator.verify import Rejected
from core.contributing.codecs import codec
from core.experts.registry import ExpertSpec
from core.project.schedule import Schedule
from core.protocol.contributions import Contribution, ParamSpec, Receipt
from net import Identity
from tests.clocks import ManualClock

SPEC = ExpertSpec("ffn", hidden=4, inner=8)
TRAINER = Identity.from_seed(b"t" * 32)
UID = "ffn0.0.0"


_open: list[AggregatorCore] = []


@pytest.fixture(autouse=True)
def _close_cores():
    yield
    while _open:
        _open.pop().close()


def make_core(*args, **kwargs) -> AggregatorCore:
    core = AggregatorCore(*args, **kwargs)
    _open.append(core)
    return core


def settings(**changes: object) -> AggregatorSettings:
    base = AggregatorSettings(
        project="p1",
        spec=SPEC,
        uids=(UID,),
        trainers=frozenset({TRAINER.public_key}),
        optimizer="sgd",
        learning_rate=0.1,
        round_samples=10_000,
        round_seconds=3600.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def contribution(
    core: AggregatorCore,
    who: Identity,
    scale: float = 1.0,
    version: int = 0,
    uid: str = UID,
    *,
    samples: int = 4,
    signer: Identity = TRAINER,
    project: str = "p1",
    timestamp: int | None = None,
):
    """``who``'s gradient sums, every value ``scale``, behind one receipt of ``signer``
    for ``samples``."""
    module = core.modules[uid]
    c = codec("fp32")
    grads = {n: torch.full((p.numel(),), scale) for n, p in module.named_parameters()}
    parts = [part for n in grads for part in c.encode(grads[n])]
    receipts = [Receipt.sign(signer, project, uid, version, [], [], samples)]
    msg = Contribution.create(
        who,
        project=project,
        uid=uid,
        base_version=version,
        codec="fp32",
        params=[ParamSpec(n, p.numel()) for n, p in module.named_parameters()],
        receipts=receipts,
        parts=parts,
        timestamp=timestamp,
    )
    return msg, parts


def weights(core: AggregatorCore) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in core.modules[UID].state_dict().items()}


def test_accepted_contributions_survive_a_crash_and_are_applied_once(tmp_path):
    core = make_core(settings(), tmp_path)
    volunteers = [Identity.generate() for _ in range(3)]
    sent = [contribution(core, v, scale=i + 1) for i, v in enumerate(volunteers)]
    for msg, parts in sent:
        core.submit(msg, parts)
    core.close()  # like kill -9: the journal file is closed, nothing else happens

    core = make_core(settings(), tmp_path)
    assert core.versions[UID] == 0
    assert len(core.pending[UID]) == 3
    with pytest.raises(Rejected, match="replay"):
        core.submit(*sent[0])  # the retry of an accepted contribution is not counted twice
    before = weights(core)
    assert core.run_round(UID) == 1
    after = weights(core)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    core.close()

    core = make_core(settings(), tmp_path)
    assert core.versions[UID] == 1
    assert not core.pending[UID]
    for k, v in weights(core).items():
        assert torch.equal(v, after[k])


@pytest.mark.parametrize("dies", ["before_its_file", "between_its_file_and_the_journal"])
def test_a_crash_during_a_round_applies_it_exactly_once(tmp_path, monkeypatch, dies):
    """Killed after the optimizer step, before the expert's file is replaced: the round
    runs again from the journal. Killed after the file, before the journal's round
    record: the file's own list of the nonces it applied keeps them out of a replay."""
    volunteers = [Identity.from_seed(bytes([i]) * 32) for i in range(3)]

    def fill(core: AggregatorCore) -> None:
        for i, v in enumerate(volunteers):
            core.submit(*contribution(core, v, scale=i + 1))

    reference = make_core(settings(), tmp_path / "ref")
    fill(reference)
    reference.run_round(UID)
    expected = weights(reference)

    core = make_core(settings(), tmp_path / "crash")
    fill(core)

    def die(*_args: object) -> None:
        raise SystemExit("killed")

    if dies == "before_its_file":
        monkeypatch.setattr(core.files, "save", die)
    else:
        monkeypatch.setattr(core._journal, "append", die)
    with pytest.raises(SystemExit):
        core.run_round(UID)
    core.close()
    monkeypatch.undo()

    core = make_core(settings(), tmp_path / "crash")
    if dies == "before_its_file":
        assert core.versions[UID] == 0
        assert len(core.pending[UID]) == 3
        core.run_round(UID)
    else:
        assert core.versions[UID] == 1
        assert not core.pending[UID]
    for k, v in weights(core).items():
        torch.testing.assert_close(v, expected[k])


def test_rounds_start_on_samples_and_peers_that_keep_failing_are_banned(tmp_path):
    core = make_core(settings(round_samples=8, max_invalid=3), tmp_path)
    a, b = Identity.generate(), Identity.generate()
    core.submit(*contribution(core, a))
    assert not core.due(UID)
    core.submit(*contribution(core, b))
    assert core.due(UID)
    mallory = Identity.generate()
    for _ in range(3):
        msg, parts = contribution(core, mallory)
        with pytest.raises(Rejected, match="payload_mismatch"):
            core.submit(msg, [p * 2 for p in parts])
    with pytest.raises(Rejected, match="banned"):
        core.submit(*contribution(core, mallory))
    assert core.stats.rejected["payload_mismatch"] == 3
    assert core.stats.rejected["banned"] == 1
    assert core.stats.banned_peers == 1


def test_adam_state_survives_checkpoints(tmp_path):
    core = make_core(settings(optimizer="adam"), tmp_path)
    core.submit(*contribution(core, Identity.generate()))
    core.run_round(UID)
    core.submit(*contribution(core, Identity.generate(), version=1))
    core.close()
    core = make_core(settings(optimizer="adam"), tmp_path)
    state = core.optimizers[UID].state_dict()["state"]
    assert state
    assert all(int(s["step"]) == 1 for s in state.values())
    core.run_round(UID)
    assert core.versions[UID] == 2


def test_a_lone_contributor_on_a_new_expert_steps_no_further_than_its_siblings_inputs_lie(
    tmp_path,
):
    """One contributor alone on an expert has nothing to be compared with; its step is
    clipped to the scale the honest inputs of its sibling experts had, which survives a
    restart."""
    other = "ffn0.0.1"
    core = make_core(settings(uids=(UID, other)), tmp_path)
    for scale in (1.0, 1.5, 2.0):
        core.submit(*contribution(core, Identity.generate(), scale=scale))
    core.run_round(UID)
    sibling = core.robust[UID].scale
    assert sibling is not None
    assert 0 < sibling < 10
    core.close()

    core = make_core(settings(uids=(UID, other)), tmp_path)
    assert core.robust[UID].scale == sibling
    before = torch.cat([p.detach().reshape(-1).clone() for p in core.modules[other].parameters()])
    core.submit(*contribution(core, Identity.generate(), scale=1000.0, uid=other))
    core.run_round(other)
    after = torch.cat([p.detach().reshape(-1) for p in core.modules[other].parameters()])
    # sgd: the step is learning rate x the aggregate, and the aggregate is clipped
    assert float((after - before).norm()) <= 1.0001 * 0.1 * sibling


@pytest.mark.parametrize(
    ("minimum", "contributors", "due"),
    [
        (1, 1, True),
        (3, 1, False),  # a lone volunteer never sets a version
        (3, 2, False),  # nor one attacker facing one honest volunteer
        (3, 3, True),
        (3, 5, True),
    ],
)
def test_a_round_waits_for_enough_distinct_contributors(tmp_path, minimum, contributors, due):
    core = make_core(settings(round_samples=4, min_contributors=minimum), tmp_path)
    for i in range(contributors):
        who = Identity.from_seed(bytes([i + 1]) * 32)
        core.submit(*contribution(core, who))
        core.submit(*contribution(core, who))  # more of the same voice does not count
    assert core.due(UID) is due
    assert core.contributors_short(UID) == max(0, minimum - contributors)


def test_a_thin_round_keeps_a_bounded_amount_and_lets_in_who_it_lacks(tmp_path):
    core = make_core(settings(round_samples=8, min_contributors=2), tmp_path)
    alone = Identity.from_seed(b"a" * 32)
    for _ in range(8):  # THIN_ROUND_ROUNDS (4) rounds of 8 samples, 4 at a time
        core.submit(*contribution(core, alone))
    with pytest.raises(Rejected, match="waiting_for_contributors"):
        core.submit(*contribution(core, alone))
    assert core.stats.contributors[alone.public_key.hex()].rejected == {
        "waiting_for_contributors": 1
    }
    assert core.stats.banned_peers == 0
    for _ in range(10):  # never an offence: it may keep trying without being banned
        with pytest.raises(Rejected, match="waiting_for_contributors"):
            core.submit(*contribution(core, alone))
    other = Identity.from_seed(b"b" * 32)
    core.submit(*contribution(core, other))  # the voice the round lacks gets in
    assert core.due(UID)
    assert core.run_round(UID) == 1
    core.submit(*contribution(core, alone))  # and the next round has room again


def _accept_held(core: AggregatorCore, msg: Contribution, parts: list[torch.Tensor]) -> None:
    core.accept(msg, parts, 0.0 + msg.timestamp, held=True)


def test_contributions_held_for_an_audit_join_no_round_until_released(tmp_path):
    core = make_core(settings(round_samples=8, contribution_audit_rate=0.5), tmp_path)
    volunteers = [Identity.generate() for _ in range(3)]
    sent = [contribution(core, v, scale=i + 1) for i, v in enumerate(volunteers)]
    core.submit(*sent[0])
    _accept_held(core, *sent[1])
    _accept_held(core, *sent[2])
    assert core.pending_samples(UID) == 4
    assert not core.due(UID)
    assert [p.nonce for p in core.held()] == [sent[1][0].nonce, sent[2][0].nonce]
    core.close()  # kill -9 while two audits wait

    core = make_core(settings(round_samples=8, contribution_audit_rate=0.5), tmp_path)
    held = core.held()  # still held after the restart: audited when revealed again
    assert [p.nonce for p in held] == [sent[1][0].nonce, sent[2][0].nonce]
    assert held[0].contribution == sent[1][0]
    assert held[0].parts is not None
    assert core.release(sent[1][0].nonce)
    assert core.discard(sent[2][0].nonce)
    assert not core.release(sent[2][0].nonce)  # settled once
    assert core.due(UID)
    before = weights(core)
    assert core.run_round(UID) == 1
    kept = core.weights_of(UID, 0)  # the replaced version's weights, for later audits
    assert kept is not None
    assert all(torch.equal(kept[k], v) for k, v in before.items())
    core.close()

    core = make_core(settings(round_samples=8, contribution_audit_rate=0.5), tmp_path)
    assert not core.pending[UID]
    assert not core.held()
    with pytest.raises(Rejected, match="replay"):
        core.submit(*sent[2])


def test_an_outcome_recorded_before_a_crash_holds_after_it(tmp_path):
    core = make_core(settings(contribution_audit_rate=0.5), tmp_path)
    volunteers = [Identity.generate() for _ in range(2)]
    sent = [contribution(core, v) for v in volunteers]
    for msg, parts in sent:
        _accept_held(core, msg, parts)
    core.release(sent[0][0].nonce)
    core.discard(sent[1][0].nonce)
    core.close()
    core = make_core(settings(contribution_audit_rate=0.5), tmp_path)
    assert [p.nonce for p in core.pending[UID]] == [sent[0][0].nonce]
    assert not core.held()


def test_a_lone_volunteer_outrun_by_versions_is_refused_but_never_banned(tmp_path):
    """With min_contributors = 1, an owner's only volunteer made versions faster than it
    pulled them, and 5 ``stale`` refusals banned it for 600 s (re-banned within 10 s
    of a restart). Stale, waiting and the like are the normal course: no strike."""
    core = make_core(settings(round_samples=4, staleness_bound=1, max_invalid=5), tmp_path)
    volunteer = Identity.generate()
    for _ in range(3):  # three versions from its own contributions
        core.submit(*contribution(core, volunteer, version=core.versions[UID]))
        core.run_round(UID)
    assert core.versions[UID] == 3
    for _ in range(3 * core.settings.max_invalid):
        with pytest.raises(Rejected, match="stale"):
            core.submit(*contribution(core, volunteer, version=0))
    assert core.stats.banned_peers == 0
    core.submit(*contribution(core, volunteer, version=3))  # up to date: taken at once
    assert core.stats.contributors[volunteer.public_key.hex()].rejected["stale"] == 15


def test_a_round_is_stalled_only_after_a_round_s_time_without_enough_voices(tmp_path):
    """What the trainer and `owner status` report as "waiting for more volunteers": a
    round still filling up, or full but within its time, is not (an owner's healthy
    swarm was reported stuck)."""
    clock = ManualClock()
    core = make_core(
        settings(round_samples=8, min_contributors=2, round_seconds=60.0), tmp_path, clock=clock
    )
    first, second = Identity.generate(), Identity.generate()
    core.submit(*contribution(core, first, samples=4))
    assert core.contributors_short(UID) == 1
    assert not core.stalled(UID)  # filling up
    core.submit(*contribution(core, first, samples=4))
    assert not core.stalled(UID)  # enough samples, one voice, the other's may be coming
    assert not core.due(UID)
    clock.advance(61.0)  # a round's time later, still one voice
    assert core.stalled(UID)
    core.submit(*contribution(core, second, samples=4))
    assert not core.stalled(UID)
    assert core.due(UID)


def test_an_experts_rounds_keep_a_beat_a_volunteer_can_send_by(tmp_path):
    """A round begins where the one before ended (not at its first contribution), so
    that the time a reply says it closes in stays true for the rounds after; after a
    pause longer than a round, the first contribution begins one again."""
    clock = ManualClock()
    core = make_core(settings(round_seconds=60.0), tmp_path, clock=clock)
    volunteer = Identity.generate()
    assert core.closes_in(UID) is None  # no round open
    core.submit(*contribution(core, volunteer))
    assert core.closes_in(UID) == 60.0  # the first round: at its first contribution
    clock.advance(60.0)
    assert core.due(UID)
    core.run_round(UID)
    assert core.closes_in(UID) is None
    # the next contribution comes 20 s later: its round began at the last one's end
    clock.advance(20.0)
    core.submit(*contribution(core, volunteer, version=1))
    assert core.closes_in(UID) == 40.0
    clock.advance(39.0)
    assert not core.due(UID)
    clock.advance(1.0)
    assert core.due(UID)
    core.run_round(UID)
    # none for longer than a round: the round begins at the next contribution
    clock.advance(90.0)
    core.submit(*contribution(core, volunteer, version=2))
    assert core.closes_in(UID) == 60.0
    assert not core.due(UID)


def flat_weights(core: AggregatorCore) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in core.modules[UID].parameters()])


def test_an_expert_warms_up_over_its_first_versions_and_a_restart_keeps_the_rate(tmp_path):
    """sgd with the plain mean: each version's step is the learning rate at that version
    x the (same) gradient; the rate comes from the version, not from saved state."""
    schedule = Schedule("cosine", warmup=3, total=103, min_ratio=0.0)
    chosen = settings(robust=RobustSettings(rule="mean"), expert_schedule=schedule)
    core = make_core(chosen, tmp_path)
    steps = []
    for version in range(4):
        if version == 2:  # a restart in the middle of the warmup
            core.close()
            core = make_core(chosen, tmp_path)
        before = flat_weights(core)
        core.submit(*contribution(core, Identity.generate(), version=version))
        core.run_round(UID)
        steps.append(float((flat_weights(core) - before).norm()))
    assert steps[0] < steps[1] < steps[2] < steps[3]
    full = 0.1 * 0.25 * flat_weights(core).numel() ** 0.5  # the rate x the mean gradient
    assert steps == pytest.approx([full / 4, full / 2, full * 3 / 4, full], rel=1e-4)
    assert core.optimizers[UID].param_groups[0]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize(("weight_decay", "kept"), [(0.0, 1.0), (0.5, 1 - 0.1 * 0.5)])
def test_adamw_weight_decay_shrinks_weights_that_get_no_gradient(tmp_path, weight_decay, kept):
    chosen = settings(optimizer="adamw", expert_schedule=Schedule(weight_decay=weight_decay))
    core = make_core(chosen, tmp_path)
    before = flat_weights(core)
    core.submit(*contribution(core, Identity.generate(), scale=0.0))
    core.run_round(UID)
    torch.testing.assert_close(flat_weights(core), before * kept)


def test_an_expert_s_aggregated_gradient_is_clipped_to_clip_norm(tmp_path):
    chosen = settings(robust=RobustSettings(rule="mean"), expert_schedule=Schedule(clip_norm=0.01))
    core = make_core(chosen, tmp_path)
    before = flat_weights(core)
    core.submit(*contribution(core, Identity.generate(), scale=100.0))
    core.run_round(UID)
    # sgd: the step is the learning rate x the clipped gradient
    assert float((flat_weights(core) - before).norm()) == pytest.approx(0.1 * 0.01, rel=1e-4)


def test_a_bfloat16_project_keeps_float32_masters_and_publishes_them_rounded(tmp_path):
    """Updates smaller than a bfloat16 step add up in the masters; what volunteers get
    (the file, its hash, the audit history) is the masters rounded."""
    from core.experts.registry import build_expert
    from core.experts.weights import weights_hash

    spec = ExpertSpec("swiglu", 4, 8, 0, "silu", "bfloat16")
    changes = {
        "spec": spec,
        "round_samples": 4,
        "learning_rate": 1e-4,
        "contribution_audit_rate": 0.5,
    }
    core = make_core(settings(**changes), tmp_path)
    assert all(p.dtype == torch.float32 for p in core.modules[UID].parameters())
    published = core.published_module(UID)
    assert all(p.dtype == torch.bfloat16 for p in published.parameters())
    assert core.weights_sha256(UID) == weights_hash(build_expert(spec, seed=0))
    for i in range(3):
        for v in range(3):
            core.submit(*contribution(core, Identity.from_seed(bytes([v + 1]) * 32), version=i))
        assert core.run_round(UID) == i + 1
    assert core.versions[UID] == 3
    masters = core.modules[UID].state_dict()
    start = build_expert(spec, seed=0).float().state_dict()
    # three small SGD steps: every master moved, though most moves are below half a
    # bfloat16 step (the rounded weights are those of the start)
    assert all(bool((masters[k] != start[k]).all()) for k in start)
    same = sum(
        int((masters[k].to(torch.bfloat16) == start[k].to(torch.bfloat16)).sum()) for k in start
    )
    assert same > 0.5 * sum(t.numel() for t in start.values())
    rounded = {k: v.to(torch.bfloat16) for k, v in masters.items()}
    assert all(torch.equal(core.published_state(UID)[k], rounded[k]) for k in rounded)
    old = core.weights_of(UID, 2)
    assert old is not None
    assert all(t.dtype == torch.bfloat16 for t in old.values())


def test_rounds_write_the_seen_contributions_only_before_the_journal_lets_them_go(tmp_path):
    """A round writes its statistics, not every contribution seen in the last hour: a
    restart remembers the journal's contributions again, applied ones included, so a kill
    after rounds loses neither a round's statistics nor the refusal of a copy. What leaves
    the journal is written first (seen.msgpack), and a state of the layout before it
    (the seen ones inside state.msgpack) is read and moved."""
    core = make_core(settings(round_samples=4), tmp_path)
    seen_writes: list[int] = []
    save = core._seen_file.save

    def counted(state: dict[str, Any]) -> int:
        seen_writes.append(1)
        return save(state)

    core._seen_file.save = counted  # type: ignore[method-assign]
    sent = []
    for i in range(3):
        sent.append(contribution(core, Identity.generate(), version=i))
        core.submit(*sent[-1])
        assert core.run_round(UID) == i + 1  # the version it made
    assert seen_writes == []  # the journal holds them all
    after = weights(core)
    core.close()  # like kill -9

    core = make_core(settings(round_samples=4), tmp_path)
    assert core.versions[UID] == 3
    assert not core.pending[UID]
    assert core.stats.rounds == 3
    assert all(torch.equal(v, after[k]) for k, v in weights(core).items())
    for msg, parts in sent:
        with pytest.raises(Rejected, match="replay"):
            core.submit(msg, parts)

    # a segment per record: settled ones go, and what they held is written first
    core._journal.segment_bytes = 1
    sent.append(contribution(core, Identity.generate(), version=3))
    core.submit(*sent[-1])
    core.run_round(UID)
    assert core._journal.segments() == [core._journal.current]
    core.close()
    written = StateFile(tmp_path / "seen.msgpack").load()
    assert written is not None
    assert len(written["seen"]["nonces"]) == len(sent)

    # the layout before seen.msgpack: the seen ones in the state itself
    state = StateFile(tmp_path / "state.msgpack").load()
    assert state is not None
    assert "seen" not in state
    StateFile(tmp_path / "state.msgpack").save({**state, "seen": written["seen"]})
    (tmp_path / "seen.msgpack").unlink()
    core = make_core(settings(round_samples=4), tmp_path)
    for msg, parts in sent:
        with pytest.raises(Rejected, match="replay"):
            core.submit(msg, parts)
    assert (tmp_path / "seen.msgpack").exists()  # moved
