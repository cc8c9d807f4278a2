"""The batches a trainer carries at once, from the noise scale (core/trainer/concurrency.py)."""

from __future__ import annotations

import pytest

from core.trainer.concurrency import MIN_PAIRS, batches_in_flight

ENOUGH = MIN_PAIRS


@pytest.mark.parametrize(
    ("noise_scale", "pairs", "batch", "trainers", "current", "most", "expected"),
    [
        (None, 0, 16, 1, 1, 4, 1),  # nothing known: one batch
        (200.0, MIN_PAIRS - 1, 16, 1, 1, 4, 1),  # too few pairs to act on
        (7.0, ENOUGH, 16, 1, 1, 4, 1),  # early training: below one batch
        (31.9, ENOUGH, 16, 1, 1, 4, 1),
        (32.0, ENOUGH, 16, 1, 1, 4, 2),  # two batches fit
        (60.0, ENOUGH, 16, 1, 2, 4, 3),
        (1000.0, ENOUGH, 16, 1, 2, 4, 4),  # at most the limit
        (60.0, ENOUGH, 16, 2, 1, 4, 1),  # two trainers share the critical batch
        (130.0, ENOUGH, 16, 2, 1, 4, 4),
        (10.0, ENOUGH, 16, 1, 3, 4, 3),  # never fewer: the estimate is noisy
        (10.0, ENOUGH, 16, 1, 3, 2, 2),  # ...but never past the limit
        (0.0, ENOUGH, 16, 1, 0, 4, 1),  # at least one
    ],
)
def test_batches_follow_the_noise_scale_up_and_never_down(
    noise_scale: float | None,
    pairs: int,
    batch: int,
    trainers: int,
    current: int,
    most: int,
    expected: int,
) -> None:
    assert batches_in_flight(noise_scale, pairs, batch, trainers, current, most) == expected
