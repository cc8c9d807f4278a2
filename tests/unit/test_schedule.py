"""Learning-rate schedules (core/project/schedule.py) and their manifest sections."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from core.project.manifest import ManifestError, load_manifest, parse_manifest
from core.project.schedule import SCHEDULE_KINDS, Schedule, ScheduleKind, rate_factor
from core.project.template import write_template

# (kind, warmup, total, decay_fraction, min_ratio): {step: factor}
TABLE: list[tuple[tuple[ScheduleKind, int, int, float, float], dict[int, float]]] = [
    (("constant", 0, 100, 0.2, 0.1), {0: 1.0, 1: 1.0, 100: 1.0, 10**9: 1.0}),
    # warmup: (step + 1) / (warmup + 1), the peak at step == warmup
    (("constant", 3, 100, 0.2, 0.1), {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0, 4: 1.0, 10**6: 1.0}),
    (
        ("cosine", 0, 100, 0.2, 0.1),
        {
            0: 1.0,
            25: 0.1 + 0.45 * (1 + math.cos(math.pi / 4)),
            50: 0.55,
            99: 0.1 + 0.45 * (1 + math.cos(math.pi * 0.99)),
            100: 0.1,
            10**6: 0.1,
        },
    ),
    (("cosine", 10, 110, 0.2, 0.0), {0: 1 / 11, 9: 10 / 11, 10: 1.0, 60: 0.5, 110: 0.0}),
    # wsd: the peak, then linear over the last 20% (steps 80..100) down to min_ratio
    (
        ("wsd", 0, 100, 0.2, 0.1),
        {0: 1.0, 79: 1.0, 80: 1.0, 90: 0.55, 99: 1 - 0.9 * 19 / 20, 100: 0.1, 1000: 0.1},
    ),
    (("wsd", 4, 100, 1.0, 0.0), {0: 0.2, 3: 0.8, 4: 1.0, 52: 0.5, 100: 0.0}),
    # a warmup that reaches into the decay: the decay starts where the warmup ends
    (("wsd", 90, 100, 0.2, 0.0), {89: 90 / 91, 90: 1.0, 95: 0.5, 100: 0.0}),
    (("wsd", 0, 1, 1.0, 0.3), {0: 1.0, 1: 0.3}),
]


@pytest.mark.parametrize(("args", "expected"), TABLE)
def test_the_factor_at_chosen_steps(
    args: tuple[ScheduleKind, int, int, float, float], expected: dict[int, float]
) -> None:
    for step, factor in expected.items():
        assert rate_factor(step, *args) == pytest.approx(factor, abs=1e-12), step
        assert Schedule(*args).factor(step) == rate_factor(step, *args)


@pytest.mark.parametrize("kind", SCHEDULE_KINDS)
@pytest.mark.parametrize(
    ("warmup", "total", "decay_fraction", "min_ratio"),
    [(0, 50, 0.2, 0.1), (7, 50, 0.5, 0.0), (20, 50, 1.0, 0.5), (49, 50, 0.1, 1.0)],
)
def test_it_rises_through_the_warmup_then_never_rises_and_ends_at_min_ratio(
    kind: ScheduleKind, warmup: int, total: int, decay_fraction: float, min_ratio: float
) -> None:
    factors = [rate_factor(s, kind, warmup, total, decay_fraction, min_ratio) for s in range(80)]
    assert all(0 < f <= 1 for f in factors[:total])  # every step moves
    rising, after = factors[: warmup + 1], factors[warmup:]
    assert all(a < b for a, b in itertools.pairwise(rising))
    assert factors[warmup] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(after))
    end = 1.0 if kind == "constant" else min_ratio
    assert all(f == end for f in factors[total:])
    assert min(after) >= min_ratio


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, "constant", 0, 10, 0.2, 0.1), "count from 0"),
        ((0, "linear", 0, 10, 0.2, 0.1), "schedule kind 'linear'"),
        ((0, "cosine", -1, 10, 0.2, 0.1), r"warmup \(-1\)"),
        ((0, "cosine", 0, 0, 0.2, 0.1), r"total \(0\)"),
        ((0, "wsd", 0, 10, 0.0, 0.1), r"decay_fraction \(0.0\)"),
        ((0, "wsd", 0, 10, 1.5, 0.1), r"decay_fraction \(1.5\)"),
        ((0, "wsd", 0, 10, 0.2, -0.1), r"min_ratio \(-0.1\)"),
        ((0, "wsd", 0, 10, 0.2, 1.1), r"min_ratio \(1.1\)"),
    ],
)
def test_out_of_range_arguments_are_refused(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rate_factor(*args)


def test_a_schedule_scales_a_peak_rate_and_checks_itself() -> None:
    schedule = Schedule("cosine", warmup=1, total=3, min_ratio=0.0)
    assert [schedule.rate(0.5, s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.25, 0.0])
    assert Schedule() == Schedule("constant", 0, 10_000, 0.2, 0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        Schedule(weight_decay=-0.1)
    with pytest.raises(ValueError, match="clip_norm"):
        Schedule(clip_norm=-1.0)
    with pytest.raises(ValueError, match="warmup"):
        Schedule(warmup=-1)


# ------------------------------------------------------------------ the manifest


def manifest(**training: object) -> dict[str, Any]:
    model = {
        "hidden": 32,
        "context": 16,
        "mixture_layers": 1,
        "grid": [2, 2],
        "k_best": 2,
        "expert": {"kind": "ffn", "hidden": 32, "inner": 64},
    }
    return {"project": {"name": "t"}, "model": model, "training": training}


def test_the_defaults_keep_a_constant_rate_and_the_trainer_s_clipping() -> None:
    training = parse_manifest(manifest()).training
    assert training.schedule.schedule() == Schedule(clip_norm=1.0)
    assert training.expert_schedule.schedule() == Schedule()
    chosen = {"kind": "wsd", "warmup": 100, "total": 5000, "decay_fraction": 0.1}
    section = parse_manifest(manifest(expert_schedule=chosen)).training.expert_schedule
    assert section.schedule() == Schedule("wsd", 100, 5000, 0.1)


@pytest.mark.parametrize(
    ("section", "value", "problem"),
    [
        ("schedule", {"warmup": -1}, "training.schedule.warmup:"),
        ("schedule", {"kind": "linear"}, "training.schedule.kind:"),
        ("schedule", {"total": 0}, "training.schedule.total:"),
        ("schedule", {"clip_norm": -1.0}, "training.schedule.clip_norm:"),
        ("schedule", {"warmup": 1.5}, "training.schedule.warmup:"),
        ("expert_schedule", {"decay_fraction": 0.0}, "training.expert_schedule.decay_fraction:"),
        ("expert_schedule", {"min_ratio": 2.0}, "training.expert_schedule.min_ratio:"),
        ("expert_schedule", {"weight_decay": -0.01}, "training.expert_schedule.weight_decay:"),
        ("expert_schedule", {"warmp": 10}, "training.expert_schedule.warmp: unknown field"),
        (
            "expert_schedule",
            {"kind": "cosine", "warmup": 100, "total": 100},
            "training.expert_schedule: warmup (100) must be less than total (100)",
        ),
    ],
)
def test_bad_values_are_refused_with_the_field_s_path(
    section: str, value: dict[str, object], problem: str
) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(manifest(**{section: value}))
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_a_constant_schedule_may_warm_up_past_total() -> None:
    value = {"warmup": 20_000, "total": 100}
    assert parse_manifest(manifest(schedule=value)).training.schedule.warmup == 20_000


def test_the_template_spells_out_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    write_template(path, "p")
    text = path.read_text()
    assert "[training.schedule]" in text
    assert "[training.expert_schedule]" in text
    training = load_manifest(path).training
    assert training.schedule == parse_manifest(manifest()).training.schedule
    assert training.expert_schedule == parse_manifest(manifest()).training.expert_schedule
