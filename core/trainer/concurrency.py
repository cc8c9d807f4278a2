"""How many batches a trainer carries at once, from the gradient noise scale.

Batches carried at once are, for the optimizer, one batch of their sum: past the
critical batch (about the noise scale, core/trainer/noise_scale.py) more of them cost
samples to the same loss, below it they cost almost none. The critical batch grows as the
loss falls (McCandlish et al. 2018; GPT-3's batch ramp), so a trainer starts with one
batch and carries more as the estimate grows, up to its limit. The estimate also falls
back after an early high (16 volunteers, stop 53: it passed 48 sequences early, the
ramp reached 3 batches of 16, and it read 28 at the end: 1.7 times over, for the rest
of the run), so the ramp comes down too, but only once even one batch fewer than it
carries would not fit: between the two thresholds (up at ``n + 1`` batches' worth, down
below ``n - 1``) it stays, so that a noisy estimate does not make the pipeline flap.
Every trainer of the project carries as many, so they count together.
"""

from __future__ import annotations

#: pairs of batches the estimate must have seen before it widens anything
MIN_PAIRS = 4


def batches_in_flight(
    noise_scale: float | None,
    pairs: int,
    batch_size: int,
    trainers: int,
    current: int,
    most: int,
) -> int:
    """The batches to carry now: as many as fit, all ``trainers`` together, within the
    noise scale (in sequences), at least 1, at most ``most``; fewer than ``current``
    only when ``current - 1`` batches would not fit either (one fewer, then)."""
    current = max(1, min(current, most))
    if noise_scale is None or pairs < MIN_PAIRS:
        return current
    fit = int(noise_scale // (batch_size * max(1, trainers)))
    if fit > current:
        return min(most, fit)
    if fit < current - 1:
        return current - 1
    return current
