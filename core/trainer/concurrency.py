"""How many batches a trainer carries at once, from the gradient noise scale.

Batches carried at once are, for the optimizer, one batch of their sum: past the
critical batch (about the noise scale, core/trainer/noise_scale.py) more of them cost
samples to the same loss, below it they cost almost none. The critical batch grows as the
loss falls (McCandlish et al. 2018; GPT-3's batch ramp), so a trainer starts with one
batch and carries more as the estimate grows, up to its limit, never fewer (a noisy
estimate must not make the pipeline flap). Every trainer of the project carries as many,
so they count together.
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
    noise scale (in sequences), at least ``current`` and 1, at most ``most``."""
    if noise_scale is None or pairs < MIN_PAIRS:
        return max(1, min(current, most))
    fit = int(noise_scale // (batch_size * max(1, trainers)))
    return max(1, min(most, max(current, fit)))
