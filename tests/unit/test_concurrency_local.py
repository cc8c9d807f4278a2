"""benchmarks/concurrency_local.py: the emulation is deterministic (its figures compare
arrangements only if nothing but the arrangement changes them)."""

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from concurrency_local import Arrangement, train

from core.trainer.data import load_corpus


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


def test_the_other_trainers_steps_are_predicted_once_a_rebase_brought_them(corpus):
    plain = train(corpus, 12, Arrangement(2, 2), seed=1)
    predicted = train(corpus, 12, Arrangement(2, 2), seed=1, predict_others=True, others_ahead=2)
    slower = train(corpus, 12, Arrangement(2, 2), seed=1, others_staleness=1.0)
    assert len({plain, predicted, slower}) == 3
