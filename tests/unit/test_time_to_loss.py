"""benchmarks/time_to_loss.py: where a loss curve reaches a target."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from time_to_loss import efficiency, loss_at, mean_curve, samples_to

CURVE = [(0, 5.0), (160, 3.0), (320, 2.5), (480, 2.6), (640, 2.0)]


@pytest.mark.parametrize(
    ("target", "samples"),
    [
        (5.0, 0.0),  # reached at the start
        (4.0, 80.0),  # halfway between the first two evaluations
        (3.0, 160.0),
        (2.75, 240.0),
        (2.5, 320.0),
        (2.3, 560.0),  # after the bump: halfway from 480 (2.6) to 640 (2.0)
        (2.0, 640.0),
        (1.9, None),  # never
    ],
)
def test_samples_to_the_first_crossing(target, samples):
    got = samples_to(CURVE, target)
    assert got == pytest.approx(samples) if samples is not None else got is None


@pytest.mark.parametrize(
    ("samples", "loss"), [(-5, 5.0), (0, 5.0), (80, 4.0), (400, 2.55), (640, 2.0), (999, 2.0)]
)
def test_loss_at(samples, loss):
    assert loss_at(CURVE, samples) == pytest.approx(loss)


def test_mean_curve_and_efficiency():
    assert mean_curve([[(0, 4.0), (10, 2.0)], [(0, 6.0), (10, 3.0)]]) == [(0, 5.0), (10, 2.5)]
    with pytest.raises(ValueError, match="different samples"):
        mean_curve([[(0, 4.0)], [(1, 4.0)]])
    assert samples_to([], 1.0) is None
    assert efficiency(1600, 3200) == 0.5
    assert efficiency(1600, None) is None
