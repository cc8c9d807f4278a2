"""Time to the same loss (issue 41): where a loss curve first reaches a target, and the
figures built on it. Pure functions, shared by benchmarks/swarm_scaling.py and tested in
tests/benchmarks/test_time_to_loss.py.

A curve is [(samples trained, validation loss)], its evaluations in order. The target L*
is the synchronous one-process reference's loss after ``target_samples``; a run's sample
efficiency is ``target_samples`` over the samples it needed to reach L*, and its scaling
efficiency is that times its utilization (samples per second over the capacity).
``samples_to`` is a curve's first crossing of L*; ``samples_to_smoothed`` a line fitted
through the evaluations around it, less moved by one evaluation's noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

Curve = Sequence[tuple[float, float]]


def samples_to(curve: Curve, target: float) -> float | None:
    """The samples at which ``curve`` first reaches ``target`` (linear between two
    evaluations); None when it never does."""
    if not curve:
        return None
    if curve[0][1] <= target:
        return float(curve[0][0])
    for (s0, l0), (s1, l1) in pairwise(curve):
        if l1 <= target:
            return s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    return None


def samples_to_smoothed(
    curve: Curve, target: float, spread: float = 1.25, least: int = 3
) -> float | None:
    """Where a line through the evaluations near the first crossing (loss against the
    log of the samples; those within a factor ``spread`` of it) reaches ``target``,
    kept within that factor. One evaluation's noise (a run's curve wobbles by 0.03 nats
    where it falls 0.02 per 160 samples) moves the first crossing by hundreds of
    samples, and earlier rather than later: a dip crosses first. The first crossing
    itself with fewer than ``least`` evaluations near it or a line that does not fall;
    None when the curve never reaches ``target`` (the line does not extrapolate past a
    curve that stopped short)."""
    crossing = samples_to(curve, target)
    if crossing is None or crossing <= 0:
        return crossing
    low, high = crossing / spread, crossing * spread
    near = [(math.log(s), loss) for s, loss in curve if s > 0 and low <= s <= high]
    if len(near) < least:
        return crossing
    mx = sum(x for x, _ in near) / len(near)
    my = sum(y for _, y in near) / len(near)
    slope = sum((x - mx) * (y - my) for x, y in near) / sum((x - mx) ** 2 for x, _ in near)
    if slope >= 0:
        return crossing
    return min(high, max(low, math.exp(mx + (target - my) / slope)))


def loss_at(curve: Curve, samples: float) -> float:
    """The loss at ``samples`` (linear between two evaluations; the ends held)."""
    if not curve:
        raise ValueError("an empty curve")
    if samples <= curve[0][0]:
        return float(curve[0][1])
    for (s0, l0), (s1, l1) in pairwise(curve):
        if samples <= s1:
            return l0 + (l1 - l0) * (samples - s0) / (s1 - s0)
    return float(curve[-1][1])


def mean_curve(curves: Sequence[Curve]) -> list[tuple[float, float]]:
    """The mean of curves evaluated at the same samples (seeds of one run)."""
    if not curves:
        raise ValueError("no curves")
    points = [[s for s, _ in c] for c in curves]
    if any(p != points[0] for p in points):
        raise ValueError("the curves were evaluated at different samples")
    return [(s, sum(c[i][1] for c in curves) / len(curves)) for i, s in enumerate(points[0])]


def efficiency(target_samples: float, samples: float | None) -> float | None:
    """``target_samples`` over ``samples`` (None: the target was not reached)."""
    return None if samples is None else target_samples / samples
