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
        # down only when one batch fewer would not fit either, one batch at a time: the
        # estimate is noisy (16 volunteers, stop 53: 3 batches of 16 over an estimate
        # of 28 sequences)
        (28.4, ENOUGH, 16, 1, 3, 4, 2),
        (28.4, ENOUGH, 16, 1, 2, 4, 2),  # 2 fit at 32: kept (up again at 48)
        (47.9, ENOUGH, 16, 1, 2, 4, 2),
        (48.0, ENOUGH, 16, 1, 2, 4, 3),
        (32.0, ENOUGH, 16, 1, 3, 4, 3),  # between the thresholds: as it is
        (31.9, ENOUGH, 16, 1, 3, 4, 2),
        (10.0, ENOUGH, 16, 1, 4, 4, 3),  # far below: still one at a time
        (10.0, ENOUGH, 16, 1, 2, 4, 1),  # down to one
        (20.0, ENOUGH, 16, 1, 2, 4, 2),  # one fits: two kept
        (40.0, ENOUGH, 16, 1, 3, 2, 2),  # never past the limit
        (10.0, MIN_PAIRS - 1, 16, 1, 3, 4, 3),  # too few pairs: no move either way
        (40.0, ENOUGH, 16, 2, 3, 4, 2),  # two trainers: 40 < (3 - 1) x 2 x 16
        (0.0, ENOUGH, 16, 1, 0, 4, 1),  # at least one
    ],
)
def test_batches_follow_the_noise_scale_up_and_down_with_a_band_between(
    noise_scale: float | None,
    pairs: int,
    batch: int,
    trainers: int,
    current: int,
    most: int,
    expected: int,
) -> None:
    assert batches_in_flight(noise_scale, pairs, batch, trainers, current, most) == expected
