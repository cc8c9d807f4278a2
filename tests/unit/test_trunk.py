"""The trunk shared by a project's trainers (core/trainer/trunk.py) and the aggregator's
side of it (core/aggregator/core.py): changes in, the mean out, rebasing."""

from __future__ import annotations

import pytest
import torch

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.trunk import TrunkSettings
from core.aggregator.verify import Rejected
from core.experts.registry import ExpertSpec
from core.experts.uid import Grid
from core.project.manifest import ExpertSection, ModelSection
from core.protocol.contributions import TRUNK_UID
from core.trainer.model import build_model
from core.trainer.trunk import TrunkSync, build_trunk, change, rebase, snapshot
from net import Identity
from tests.unit.test_aggregator_core import contribution

MODEL = ModelSection(
    hidden=16,
    context=8,
    mixture_layers=2,
    grid=[2, 2],
    k_best=2,
    expert=ExpertSection(hidden=16, inner=32),
)
TRAINERS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(2)]


def test_the_trunk_is_the_trainers_model_without_its_experts():
    class Mixture(torch.nn.Module):  # a mixture as the trainer builds it: gating + experts
        def __init__(self, grid: Grid) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(MODEL.hidden, sum(grid.shape))

    trainer = build_model(MODEL, lambda _i, grid: Mixture(grid), seed=7)
    trunk = build_trunk(MODEL, seed=7)
    mine, theirs = snapshot(trainer), snapshot(trunk)
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[n], theirs[n]) for n in mine)
    assert not torch.equal(snapshot(build_trunk(MODEL, seed=8))["head.weight"], mine["head.weight"])


def test_rebasing_keeps_what_the_copy_learned_since_it_sent():
    anchor = {"w": torch.tensor([1.0, 1.0])}
    sent = {"w": torch.tensor([0.0, 2.0])}
    assert torch.equal(change(anchor, sent)["w"], torch.tensor([1.0, -1.0]))
    later = {"w": torch.tensor([0.5, 2.0])}  # trained on after sending
    new = {"w": torch.tensor([10.0, 10.0])}
    assert torch.equal(rebase(later, sent, new)["w"], torch.tensor([10.5, 10.0]))


def _w(*values: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values)}


@pytest.mark.parametrize(
    ("events", "version", "may"),
    [
        # nothing sent: any newer version (another trainer's round) may be taken
        ([], 1, True),
        ([], 0, False),
        # sent, not yet accepted: no version can include the change
        (["send"], 1, False),
        # accepted while version 3 was current: only a later version includes it
        (["send", ("accepted", 3)], 3, False),
        (["send", ("accepted", 3)], 4, True),
        # refused: the change stays in the copy, any newer version may be taken
        (["send", "refused"], 1, True),
    ],
)
def test_a_trainer_rebases_only_onto_a_version_that_includes_its_change(events, version, may):
    sync = TrunkSync(sync_every=1, anchor=_w(0.0))
    for event in events:
        if event == "send":
            sync.stepped(16)
            sync.take(_w(1.0))
        elif event == "refused":
            sync.refused()
        else:
            sync.accepted(event[1])
    assert sync.may_rebase(version) is may


def test_a_trainer_sends_every_sync_every_steps_and_a_refusal_goes_with_the_next():
    sync = TrunkSync(sync_every=3, anchor=_w(0.0))
    for _ in range(2):
        sync.stepped(16)
    assert not sync.due()
    sync.stepped(16)
    assert sync.due()
    delta, base, samples = sync.take(_w(-1.0))
    assert (torch.equal(delta["w"], torch.tensor([1.0])), base, samples) == (True, 0, 48)
    assert not sync.due()  # one change in flight at a time
    sync.refused()  # tried again at the next sync, not at once (a refusal may last)
    for _ in range(2):
        sync.stepped(16)
    assert not sync.due()
    sync.stepped(16)
    assert sync.due()
    assert sync.take(_w(-2.0))[2] == 96  # the refused samples count again
    sync.accepted(0)
    rebase_from = sync.took(_w(5.0), 1)
    assert torch.equal(rebase_from["w"], torch.tensor([-2.0]))  # the copy as sent
    assert torch.equal(rebase(_w(-2.5), rebase_from, _w(5.0))["w"], torch.tensor([4.5]))
    assert (sync.version, torch.equal(sync.anchor["w"], torch.tensor([5.0]))) == (1, True)
    with pytest.raises(ValueError, match="cannot be rebased"):
        sync.took(_w(6.0), 1)
    assert torch.equal(sync.took(_w(7.0), 2)["w"], torch.tensor([5.0]))  # nothing sent


# ---------------------------------------------------------------- the aggregator's side


def _core(tmp_path, momentum: float = 0.0) -> AggregatorCore:
    settings = AggregatorSettings(
        project="p1",
        spec=ExpertSpec("ffn", hidden=MODEL.hidden, inner=32),
        uids=(TRUNK_UID,),
        trainers=frozenset(t.public_key for t in TRAINERS),
        trunk=TrunkSettings(outer_learning_rate=0.5, outer_momentum=momentum, round_seconds=3600),
    )
    return AggregatorCore(settings, tmp_path, initial={TRUNK_UID: build_trunk(MODEL, seed=0)})


def _trunk_change(
    core: AggregatorCore, who: Identity, delta: float, samples: int, signer: Identity | None = None
):
    """A trainer's change ``delta`` per value, as sums over ``samples``, with a receipt of
    its own (or ``signer``'s)."""
    return contribution(
        core, who, delta * samples, uid=TRUNK_UID, samples=samples, signer=signer or who
    )


def test_when_training_ends_the_rest_is_sent_and_settled_once_a_version_holds_it():
    sync = TrunkSync(sync_every=3, anchor=_w(0.0))
    assert sync.settled()  # nothing trained
    sync.stepped(16)
    assert not sync.due()
    assert not sync.settled()  # one step not shared yet
    sync.finishing = True
    assert sync.due()  # the rest goes, whatever its steps
    sync.take(_w(-1.0))
    assert not sync.settled()  # sent, and no version holds it yet
    sync.accepted(0)
    sync.took(_w(3.0), 1)
    assert sync.settled()


def test_the_aggregator_applies_the_sum_of_the_trainers_changes_once_each_sent_one(tmp_path):
    core = _core(tmp_path)
    before = snapshot(core.modules[TRUNK_UID])
    core.submit(*_trunk_change(core, TRAINERS[0], delta=1.0, samples=100))
    assert not core.due(TRUNK_UID)  # the other trainer's change is awaited
    core.submit(*_trunk_change(core, TRAINERS[1], delta=4.0, samples=300))
    assert core.due(TRUNK_UID)
    assert core.run_round(TRUNK_UID) == 1
    after = snapshot(core.modules[TRUNK_UID])
    # each trainer's change whole (per-sample sums over its samples), summed: 5, times
    # the outer rate 0.5
    for name in before:
        assert torch.allclose(before[name] - after[name], torch.full_like(before[name], 2.5))
    core.close()


def test_only_the_projects_trainers_change_the_trunk(tmp_path):
    core = _core(tmp_path)
    volunteer = Identity.generate()
    with pytest.raises(Rejected, match="not_a_trainer"):
        core.submit(*_trunk_change(core, volunteer, delta=1.0, samples=10))
    # a trainer's receipt does not make a volunteer's change the trainer's
    with pytest.raises(Rejected, match="not_a_trainer"):
        core.submit(*_trunk_change(core, volunteer, delta=1.0, samples=10, signer=TRAINERS[0]))
    assert not core.pending[TRUNK_UID]
    core.close()


def test_the_trunk_and_its_outer_momentum_survive_a_restart(tmp_path):
    core = _core(tmp_path, momentum=0.9)
    for t in TRAINERS:
        core.submit(*_trunk_change(core, t, delta=1.0, samples=10))
    core.run_round(TRUNK_UID)
    core.submit(*_trunk_change(core, TRAINERS[0], delta=1.0, samples=10))  # pending
    weights = snapshot(core.modules[TRUNK_UID])
    core.close()
    again = _core(tmp_path, momentum=0.9)
    assert again.versions[TRUNK_UID] == 1
    assert len(again.pending[TRUNK_UID]) == 1
    restored = snapshot(again.modules[TRUNK_UID])
    assert all(torch.equal(weights[n], restored[n]) for n in weights)
    momentum = again.optimizers[TRUNK_UID].state_dict()["state"]
    assert momentum
    assert all("momentum_buffer" in s for s in momentum.values())
    again.close()


# ---------------------------------------------------------------- the trainer's side


def test_a_rebase_that_comes_mid_step_waits_for_the_steps_update():
    """One batch at a time computes on the master itself: a new version arriving while
    its autograd graph holds the weights is applied after the batch's update (changing
    them in place at once failed the backward pass: a two-trainer test's first run)."""
    from core.trainer.data import load_corpus
    from core.trainer.session import SessionSettings, TrainingSession

    corpus = load_corpus(max_bytes=50_000)
    new = {n: torch.full_like(p, 0.5) for n, p in snapshot(build_trunk(MODEL, seed=0)).items()}

    def session_of(rebase_mid_step: bool) -> tuple[TrainingSession, dict[str, torch.Tensor]]:
        holder: list[TrainingSession] = []
        base: dict[str, torch.Tensor] = {}

        class Mixture(torch.nn.Module):  # the sharing task's rebase lands mid-forward
            def __init__(self, grid: Grid) -> None:
                super().__init__()
                self.proj = torch.nn.Linear(MODEL.hidden, sum(grid.shape))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if rebase_mid_step and holder and not base:
                    base.update(holder[0].trunk_weights())
                    holder[0].rebase_trunk(base, new)
                return x + self.proj(x).sum(dim=-1, keepdim=True)

        model = build_model(MODEL, lambda _i, grid: Mixture(grid), seed=0)
        settings = SessionSettings(project="p", batch_size=2)
        holder.append(TrainingSession(model, corpus, settings))
        assert holder[0].train_step() is not None  # the backward pass went through
        return holder[0], base

    alone, _ = session_of(rebase_mid_step=False)
    rebased, base = session_of(rebase_mid_step=True)
    stepped, weights = alone.trunk_weights(), rebased.trunk_weights()
    for name in weights:  # the step's update first, then the rebase onto ``new``
        assert torch.allclose(weights[name], new[name] + stepped[name] - base[name], atol=1e-6)
