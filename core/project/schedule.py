"""Learning-rate schedules, weight decay and gradient clipping: pure policy, no torch.

A schedule multiplies a peak rate (the manifest's ``training.learning_rate``) by a
factor that depends only on the step, so whoever steps (a trainer, counting its steps;
an aggregator, counting an expert's versions) recomputes the rate from the step alone:
nothing of it is saved with an optimizer's state, and a restart or a replay steps as
before.

Steps count from 0 (the first optimizer step; at an aggregator, the step from version 0
to version 1). Every kind warms up linearly over the first ``warmup`` steps, at
``(step + 1) / (warmup + 1)`` of the peak (never 0: the first step moves), reaching the
peak at step ``warmup``. Then:

- ``constant``: the peak, for ever (``total``, ``decay_fraction`` and ``min_ratio`` are
  unused);
- ``cosine``: half a cosine from the peak at step ``warmup`` down to ``min_ratio`` x the
  peak at step ``total`` (Loshchilov & Hutter, SGDR; the decay of Chinchilla and most
  LLM runs);
- ``wsd`` (warmup-stable-decay: Hu et al., MiniCPM, 2024; Hägele et al., 2024): the peak
  until the last ``decay_fraction`` of ``total`` steps, then a *linear* decay down to
  ``min_ratio`` x the peak at step ``total``. Linear, not MiniCPM's exponential or
  Hägele's "1 - sqrt": it is the simplest and what Hägele et al. compare against; the
  three differ little at a decay of 10-20% of the run. Should the warmup reach into the
  decay, the decay starts where the warmup ends.

From step ``total`` on, ``cosine`` and ``wsd`` stay at ``min_ratio`` x the peak (a run
that goes on goes on slowly, never at a rate that climbs back).

``weight_decay`` and ``clip_norm`` travel with the schedule; how they apply is the
stepper's (core/aggregator/rounds.py for the experts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

ScheduleKind = Literal["constant", "cosine", "wsd"]
SCHEDULE_KINDS: tuple[ScheduleKind, ...] = get_args(ScheduleKind)


def rate_factor(
    step: int,
    kind: ScheduleKind,
    warmup: int,
    total: int,
    decay_fraction: float,
    min_ratio: float,
) -> float:
    """The multiple of the peak rate at ``step`` (0-based), in (0, 1]: see the module's
    docstring. Raises ValueError for a negative step or arguments out of range."""
    if step < 0:
        raise ValueError(f"step {step}: steps count from 0")
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"schedule kind {kind!r}: one of {', '.join(SCHEDULE_KINDS)}")
    if warmup < 0 or total < 1:
        raise ValueError(f"warmup ({warmup}) must be >= 0 and total ({total}) >= 1")
    if not 0 < decay_fraction <= 1 or not 0 <= min_ratio <= 1:
        raise ValueError(
            f"decay_fraction ({decay_fraction}) must be in (0, 1] and min_ratio "
            f"({min_ratio}) in [0, 1]"
        )
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    if step >= total:
        return min_ratio
    if kind == "cosine":
        # warmup <= step < total: the span is positive
        progress = (step - warmup) / (total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    start = max(float(warmup), total - decay_fraction * total)
    if step < start:
        return 1.0
    # start <= step < total: the span is positive
    return 1 - (1 - min_ratio) * (step - start) / (total - start)


@dataclass(frozen=True)
class Schedule:
    """A schedule with its weight decay and clipping, as the stepper takes it (the
    manifest's ``[training.schedule]`` and ``[training.expert_schedule]`` make one:
    core/project/manifest.py). The defaults change nothing: a constant rate, no decay,
    no clipping."""

    kind: ScheduleKind = "constant"
    #: steps of linear warmup
    warmup: int = 0
    #: the step at which cosine and wsd have decayed to ``min_ratio`` of the peak
    total: int = 10_000
    #: wsd: the last share of ``total`` over which the rate decays (linearly)
    decay_fraction: float = 0.2
    #: the final rate, as a share of the peak
    min_ratio: float = 0.1
    #: the optimizer's weight decay (adamw: decoupled; adam and sgd: an L2 term added
    #: to the gradient, torch's ``weight_decay`` argument)
    weight_decay: float = 0.0
    #: the gradient's norm is clipped to this before each step (0: never clipped)
    clip_norm: float = 0.0

    def __post_init__(self) -> None:
        rate_factor(0, self.kind, self.warmup, self.total, self.decay_fraction, self.min_ratio)
        if self.weight_decay < 0 or self.clip_norm < 0:
            raise ValueError(
                f"weight_decay ({self.weight_decay}) and clip_norm ({self.clip_norm}) must be >= 0"
            )

    def factor(self, step: int) -> float:
        """The multiple of the peak rate at ``step`` (:func:`rate_factor`)."""
        return rate_factor(
            step, self.kind, self.warmup, self.total, self.decay_fraction, self.min_ratio
        )

    def rate(self, peak: float, step: int) -> float:
        """The learning rate at ``step`` for a peak rate of ``peak``."""
        return peak * self.factor(step)
