"""benchmarks/time_to_loss.py: where a loss curve reaches a target."""

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from time_to_loss import (
    Curve,
    efficiency,
    loss_at,
    mean_curve,
    samples_to,
    samples_to_smoothed,
)

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


def log_curve(crossing: float, target: float = 2.0) -> list[tuple[float, float]]:
    """Evaluations every 200 samples of a loss falling 0.5 nats per e-fold of samples,
    at ``target`` after ``crossing`` samples."""
    return [(s, target - 0.5 * math.log(s / crossing)) for s in range(200, 4001, 200)]


@pytest.mark.parametrize(
    ("curve", "target", "expected"),
    [
        # on a line in log samples the smoothed crossing is the line's (the first
        # crossing, linear between two evaluations, is a little later)
        (log_curve(1500), 2.0, 1500.0),
        (log_curve(1000), 2.0, 1000.0),
        # a line that barely falls reaches L* far away: kept within 1.25x the first crossing
        ([(800, 2.06), (900, 2.05), (1000, 1.99), (1100, 2.04), (1200, 2.03)], 2.0, 1229.17),
        ([(0, 5.0), (100, 1.0)], 2.0, 75.0),  # fewer than 3 near it: the first crossing
        ([(0, 5.0), (100, 4.0)], 2.0, None),  # never reached: not extrapolated
        ([(0, 1.0), (100, 0.5)], 2.0, 0.0),  # reached at the start
        # near the crossing the curve rises (noise): no line, the first crossing
        ([(800, 2.2), (900, 1.95), (1000, 2.1), (1100, 2.3)], 2.0, 880.0),
    ],
)
def test_the_smoothed_crossing_fits_a_line_near_the_first(curve, target, expected):
    got = samples_to_smoothed(curve, target)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=1e-3)
    first = samples_to(curve, target)
    if first and first > 0 and got is not None:  # within the window's factor of it
        assert first / 1.25 <= got <= first * 1.25 + 1e-9


def test_a_dip_crosses_first_and_moves_the_smoothed_crossing_less():
    # one evaluation 0.05 nats low at 1,400 on a curve that reaches L* at 1,500
    curve = [(s, loss - (0.05 if s == 1400 else 0)) for s, loss in log_curve(1500)]
    first, smoothed = samples_to(curve, 2.0), samples_to_smoothed(curve, 2.0)
    assert first is not None
    assert smoothed is not None
    assert first < 1400  # the dip
    assert abs(smoothed - 1500) < 0.5 * abs(first - 1500)


def test_the_summary_averages_a_recipes_runs_and_takes_each_sizes_best():
    from swarm_scaling import local_key, time_to_loss_summary

    def line(
        v: int, crossing: float, local: float, in_flight: int = 1, ms: float = 100.0
    ) -> dict[str, Any]:
        return {
            "volunteers": v,
            "delay_ms": ms,
            "speed": 0.125,
            "trainers": 1,
            "in_flight": in_flight,
            "optimizer": "muon",
            "learning_rate": 0.01,
            "utilization": 0.8,
            "curve": log_curve(crossing),
            "target_loss": 2.0,
            "target_samples": 1000,
            # the figures by the first crossing, as a run printed them
            "scaling_efficiency": round(0.8 * 1000 / crossing, 3),
            "same_concurrency_efficiency": 0.5,
            "local_same_concurrency_curve": log_curve(local),
        }

    lines = [
        line(4, 1000, 1000),  # E 0.8, guard 1
        line(4, 2000, 1600),  # the same recipe again: E 0.4, guard 0.8
        line(4, 1400, 1400, in_flight=2),  # E 0.571: below the first recipe's mean 0.6
        line(32, 2000, 1800, in_flight=3),  # E 0.4, guard 0.9
        line(32, 1000, 1000, ms=0.0),  # not at 100 ms: left out
    ]
    out = time_to_loss_summary(lines)
    assert out["scaling_efficiency_4v"] == pytest.approx(0.6)
    assert out["runs_4v"] == 2
    assert out["scaling_efficiency_32v"] == pytest.approx(0.4)
    assert "scaling_efficiency_16v" not in out
    assert out["time_to_loss_speedup_32v_vs_4v"] == pytest.approx(8 * 0.4 / 0.6, abs=0.01)
    assert out["same_concurrency_efficiency_min"] == pytest.approx(0.9)  # 4v: (1 + 0.8) / 2
    # the 4v recipe at 2 in flight, not the one the efficiency is of: its guard counts
    # only among every recipe's
    assert out["same_concurrency_efficiency_min_all"] == pytest.approx(0.9)
    worse = [*lines, line(4, 1400, 700, in_flight=2)]  # its guard now 0.5 (twice: 0.75)
    out = time_to_loss_summary(worse)
    assert out["same_concurrency_efficiency_min"] == pytest.approx(0.9)
    assert out["same_concurrency_efficiency_min_all"] == pytest.approx(0.75, abs=0.005)
    assert out["first_crossing"]["same_concurrency_efficiency_min"] == 0.5
    # a line without its local curve takes the one of its concurrency given apart
    bare = {k: v for k, v in line(32, 2000, 1, in_flight=3).items() if "local" not in k}
    out = time_to_loss_summary([bare], {local_key(1, 3, "muon", 0.01): log_curve(1000)})
    assert out["same_concurrency_efficiency_min"] == pytest.approx(0.5)
    # unknown when a run never reached L* or its local emulation is missing
    never = {**line(4, 1000, 1000), "curve": [(200, 9.0), (400, 8.0)]}
    out = time_to_loss_summary([never, bare])
    assert out["scaling_efficiency_4v"] is None
    assert out["time_to_loss_speedup_32v_vs_4v"] is None
    assert out["same_concurrency_efficiency_min"] is None


def test_summarize_where_keeps_one_recipes_runs(tmp_path):
    import argparse

    from swarm_scaling import recipe_condition, summarize

    def line(v: int, crossing: float, expert_rate: float | None) -> dict[str, Any]:
        out = {
            "benchmark": "swarm_scaling",
            "volunteers": v,
            "delay_ms": 100.0,
            "speed": 0.125,
            "trainers": 1,
            "in_flight": 3,
            "optimizer": "muon",
            "learning_rate": 0.01,
            "utilization": 1.0,
            "utilization_full": 1.0,
            "samples_per_s": v / 8,
            "loss_ratio": 1.0,
            "activation_bytes_ratio": 0.15,
            "curve": log_curve(crossing),
            "target_loss": 2.0,
            "target_samples": 1000,
            "scaling_efficiency": round(1000 / crossing, 3),
            "same_concurrency_efficiency": 1.0,
            "local_same_concurrency_curve": log_curve(1000),
        }
        if expert_rate is not None:
            out["expert_learning_rate"] = expert_rate
        return out

    # the demo's rate (3e-3, not written: RECIPE's default) did better at 4 volunteers
    lines = [line(4, 1000, None), line(4, 2000, 1.5e-3), line(32, 1250, 1.5e-3)]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert summarize([runs])["scaling_efficiency_4v"] == pytest.approx(1.0, abs=0.01)
    tuned = summarize([runs], [recipe_condition("expert_learning_rate=1.5e-3")])
    assert tuned["scaling_efficiency_4v"] == pytest.approx(0.5, abs=0.01)
    assert tuned["scaling_efficiency_32v"] == pytest.approx(0.8, abs=0.01)
    demo_rate = summarize([runs], [recipe_condition("expert_learning_rate=0.003")])
    assert demo_rate["scaling_efficiency_4v"] == pytest.approx(1.0, abs=0.01)
    assert "scaling_efficiency_32v" not in demo_rate
    both = [recipe_condition("volunteers=32"), recipe_condition("ramp=false")]
    assert "scaling_efficiency_4v" not in summarize([runs], both)
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        recipe_condition("learning_rat=0.01")


def test_a_ramped_line_is_compared_with_a_local_emulation_that_ramps_too():
    from swarm_scaling import local_key, time_to_loss_summary

    ramped = {
        "volunteers": 16,
        "delay_ms": 100.0,
        "speed": 0.125,
        "trainers": 1,
        "in_flight": 2,
        "ramp": True,
        "optimizer": "muon",
        "learning_rate": 0.01,
        "utilization": 0.8,
        "curve": log_curve(2000),
        "target_loss": 2.0,
        "target_samples": 1000,
        "samples_to_target": 2000.0,
        "scaling_efficiency": 0.4,
        "same_concurrency_efficiency": 1.1,
        # a line before stop 58: its local emulation carried 2 batches from the start
        "local_same_concurrency_curve": log_curve(2200),
    }
    ramping: dict[str, Curve] = {local_key(1, 2, "muon", 0.01, ramp=True): log_curve(1800)}
    assert local_key(1, 2, "muon", 0.01, ramp=True) != local_key(1, 2, "muon", 0.01)
    # without a ramped emulation given apart, the line's own
    out = time_to_loss_summary([ramped])
    assert out["same_concurrency_efficiency_min"] == pytest.approx(1.1, abs=0.005)
    out = time_to_loss_summary([ramped], ramping)
    assert out["same_concurrency_efficiency_min"] == pytest.approx(0.9, abs=0.005)
    first = out["first_crossing"]["same_concurrency_efficiency_min"]
    assert first == pytest.approx(0.9, abs=0.01)
    # a line before stop 56 (no local curve of its own): the ramped one too
    bare = {k: v for k, v in ramped.items() if k != "local_same_concurrency_curve"}
    out = time_to_loss_summary([bare], ramping)
    assert out["same_concurrency_efficiency_min"] == pytest.approx(0.9, abs=0.005)
    assert out["first_crossing"]["same_concurrency_efficiency_min"] == pytest.approx(0.9, abs=0.01)
    # a line whose own emulation ramped keeps it; one that did not ramp is not touched
    for line in ({**ramped, "local_same_concurrency_ramp": True}, {**ramped, "ramp": False}):
        out = time_to_loss_summary([line], ramping)
        assert out["same_concurrency_efficiency_min"] == pytest.approx(1.1, abs=0.005)
        assert out["first_crossing"]["same_concurrency_efficiency_min"] == 1.1


@pytest.mark.parametrize(
    ("accounts", "figures"),
    [
        ([], (None, None, None)),
        ([{"lateness": []}], (None, None, None)),  # no round applied any yet
        (
            [
                {
                    "lateness": [3, 1],
                    "mean_versions_late": 0.25,
                    "mean_age_s": 40.0,
                    "mean_round_wait_s": 20.0,
                }
            ],
            (0.25, 40.0, 20.0),
        ),
        # two aggregators, weighted by the contributions each applied (4 and 1)
        (
            [
                {
                    "lateness": [3, 1],
                    "mean_versions_late": 0.25,
                    "mean_age_s": 40.0,
                    "mean_round_wait_s": 20.0,
                },
                {
                    "lateness": [0, 1],
                    "mean_versions_late": 1.0,
                    "mean_age_s": 90.0,
                    "mean_round_wait_s": 70.0,
                },
                {"unreachable": "timed out"},
            ],
            (0.4, 50.0, 30.0),
        ),
    ],
)
def test_the_line_carries_the_aggregators_lateness(accounts, figures):
    from swarm_scaling import expert_lateness

    got = expert_lateness(accounts)
    assert (got["expert_versions_late"], got["contribution_age_s"], got["round_wait_s"]) == figures


def test_the_reference_tunes_the_experts_rate_beside_the_trainers():
    from swarm_scaling import local_key, reference_target

    from core.demo import DemoOptions

    # two steps of one seed: the pairs tried, the best pair's loss taken
    target, line = reference_target(32, [1], [1e-2], "muon", 1, expert_rates=[1e-4, 3e-3])
    tried = line["losses_by_expert_learning_rate"]
    assert set(tried) == {"0.0001", "0.003"}
    assert target.expert_learning_rate == line["expert_learning_rate"]
    assert round(target.loss, 4) == min(tried.values())
    assert line["losses_by_learning_rate"] == {"0.01": round(target.loss, 4)}
    # the experts' rate moves the reference: a hundredth of a step less in 2 steps
    assert tried["0.0001"] != tried["0.003"]
    # without experts' rates, the demo's (the lines before stop 58), whose key is unchanged
    default, _ = reference_target(32, [1], [1e-2], "muon", 1)
    assert default.expert_learning_rate == DemoOptions.learning_rate
    assert default.loss == pytest.approx(tried["0.003"], abs=1e-4)
    assert local_key(1, 1, "muon", 0.01, expert_rate=DemoOptions.learning_rate) == "1x1:muon:0.01"
    assert local_key(1, 1, "muon", 0.01, expert_rate=1.5e-3) != "1x1:muon:0.01"
