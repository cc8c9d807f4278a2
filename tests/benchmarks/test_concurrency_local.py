"""benchmarks/concurrency_local.py: the emulation is deterministic (its figures compare
arrangements only if nothing but the arrangement changes them)."""

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from concurrency_local import Arrangement, curve, train

from core.trainer.concurrency import MIN_PAIRS
from core.trainer.data import Corpus, load_corpus


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_the_same_seed_trains_to_the_same_loss_and_the_arrangement_changes_it(corpus):
    first = train(corpus, 4, Arrangement(2, 2), seed=1)
    again = train(corpus, 4, Arrangement(2, 2), seed=1)
    assert math.isfinite(first)
    assert first == again
    assert train(corpus, 4, Arrangement(1, 1), seed=1) != first


def test_an_arrangement_is_trainers_and_batches_in_flight():
    assert Arrangement.parse("3:2") == Arrangement(3, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="from 1"):
        Arrangement.parse("0:2")


def test_an_expert_round_that_lands_after_the_run_leaves_the_experts_untrained(corpus):
    # experts stepping on 10-rounds-old gradients never step in 4 batches: as a rate of 0
    late = train(corpus, 4, Arrangement(1, 1), seed=1, expert_lag=10)
    assert late == train(corpus, 4, Arrangement(1, 1), seed=1, expert_rate_scale=0.0)
    assert late != train(corpus, 4, Arrangement(1, 1), seed=1)


def test_the_robust_rules_momentum_starts_at_the_first_round_then_holds_the_old_ones(corpus):
    # an aggregator's first round of a volunteer is its momentum whole (the rule starts
    # a momentum at its first input), so one batch steps alike; later rounds blend in
    def after(batches: int, momentum: float, beta1: float = 0.9) -> float:
        return train(
            corpus,
            batches,
            Arrangement(1, 1),
            seed=1,
            eval_batches=1,
            expert_momentum=momentum,
            expert_beta1=beta1,
        )

    assert after(1, 0.9) == after(1, 0.0)
    with_adams = after(3, 0.9)
    assert with_adams != after(3, 0.0)
    # Adam's own first moment is a separate knob: at 0 it steps on the momentum alone
    assert with_adams != after(3, 0.9, beta1=0.0)


def test_the_other_trainers_steps_are_predicted_once_a_rebase_brought_them(corpus):
    plain = train(corpus, 12, Arrangement(2, 2), seed=1)
    predicted = train(corpus, 12, Arrangement(2, 2), seed=1, predict_others=True, others_ahead=2)
    slower = train(corpus, 12, Arrangement(2, 2), seed=1, others_staleness=1.0)
    assert len({plain, predicted, slower}) == 3


def muon_curve(
    corpus: Corpus,
    steps: int,
    arrangement: Arrangement,
    ramp: bool = False,
    carried: list[tuple[int, int]] | None = None,
) -> list[tuple[int, float]]:
    return curve(
        corpus,
        steps,
        arrangement,
        seed=1,
        eval_every=4,
        optimizer="muon",
        learning_rate=1e-2,
        eval_batches=2,  # the evaluations are most of a short curve's time
        ramp=ramp,
        carried=carried,
    )


def test_a_ramp_carries_one_batch_until_the_noise_scale_makes_room_for_more(corpus):
    # the swarm's --ramp runs, emulated: the trainer's policy on its own estimate
    carried: list[tuple[int, int]] = []
    ramped = muon_curve(corpus, 12, Arrangement(1, 3), ramp=True, carried=carried)
    one_at_a_time = muon_curve(corpus, 12, Arrangement(1, 1))
    assert carried[0] == (0, 1)
    assert len(carried) >= 2, "the demo's noise scale passes 2 batches of 16 early"
    widened_at = carried[1][0]
    # not before the estimate has seen MIN_PAIRS pairs of batches (16 samples each)
    assert widened_at >= 2 * MIN_PAIRS * 16
    assert all(1 <= n <= 3 for _, n in carried)
    before = [point for point in ramped if point[0] <= widened_at]
    assert before == one_at_a_time[: len(before)]
    assert ramped[-1] != one_at_a_time[-1]


def test_a_ramp_up_to_one_batch_is_one_batch_at_a_time(corpus):
    ramped = muon_curve(corpus, 4, Arrangement(1, 1), ramp=True)
    assert ramped == muon_curve(corpus, 4, Arrangement(1, 1))
