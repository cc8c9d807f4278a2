"""benchmarks/time_to_loss.py: where a loss curve reaches a target."""

import sys
from pathlib import Path
from typing import Any

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


def test_two_trainers_evaluations_make_one_curve_of_the_swarms_samples():
    from swarm_scaling import swarm_curve

    evaluations = [  # (trainer, its step, loss, seconds)
        (0, 0, 5.0, 1.0),
        (1, 0, 5.2, 1.1),
        (0, 10, 3.0, 50.0),
        (1, 10, float("nan"), 51.0),  # the swarm could not answer: not a point
        (0, 20, 2.6, 90.0),
        (1, 20, 2.8, 91.0),
        (0, 20, 2.4, 120.0),  # the final evaluation, after the experts' round
        (1, 20, 2.6, 121.0),
    ]
    curve = swarm_curve(evaluations, trainers=2, batch_size=16)
    assert [s for s, _ in curve] == [0, 640]
    assert [loss for _, loss in curve] == pytest.approx([5.1, 2.5])


def test_the_summary_takes_each_sizes_best_line_at_100_ms():
    from swarm_scaling import time_to_loss_summary

    def line(v: int, e: float | None, guard: float | None, ms: float = 100.0) -> dict[str, Any]:
        return {
            "volunteers": v,
            "delay_ms": ms,
            "scaling_efficiency": e,
            "same_concurrency_efficiency": guard,
            "target_loss": 2.5,
            "target_samples": 1600,
        }

    lines = [line(4, 0.7, 0.95), line(4, 0.6, 0.99), line(32, 0.4, 0.9), line(32, 0.9, 0.1, 0)]
    out = time_to_loss_summary(lines)
    assert out["scaling_efficiency_4v"] == 0.7
    assert out["scaling_efficiency_32v"] == 0.4
    assert "scaling_efficiency_16v" not in out
    assert out["time_to_loss_speedup_32v_vs_4v"] == pytest.approx(8 * 0.4 / 0.7, abs=0.01)
    assert out["same_concurrency_efficiency_min"] == 0.9  # of the 100 ms lines
    # a line that never reached L* leaves the figures it decides unknown
    out = time_to_loss_summary([line(4, None, None), line(32, 0.4, 0.9)])
    assert out["time_to_loss_speedup_32v_vs_4v"] is None
    assert out["same_concurrency_efficiency_min"] is None
