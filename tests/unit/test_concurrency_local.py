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
