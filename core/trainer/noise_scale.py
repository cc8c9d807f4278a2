"""The gradient noise scale, estimated online from the batches a trainer already makes.

The critical batch (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training") is about the simple noise scale ``B_simple = tr(S) / |G|^2``: the gradient's
variance per sample over its squared mean. Below it, samples trained together cost
little in steps; far above it, they are wasted. Batches carried through the swarm at
once are, for this purpose, one batch: so the trainer's concurrency should follow it.

Their appendix A.1 estimates both terms from gradients at two batch sizes. Here a pair of
consecutive batches gives them: ``|g_B|^2`` (the mean of the two batches' squared norms,
batch ``B``) and ``|g_2B|^2`` (their mean gradient's, batch ``2B``). Then

    |G|^2 ~ (2B |g_2B|^2 - B |g_B|^2) / (2B - B)    tr(S) ~ (|g_B|^2 - |g_2B|^2) / (1/B - 1/2B)

both unbiased, each averaged exponentially (their ratio of averages, as the paper
advises: the ratio of one pair is very noisy). Two batches are a step apart, so the
estimate carries a small bias from the step between them.

Only the trainer-side parameters are seen (the experts' gradients stay with the
volunteers); a fixed, evenly strided subset of at most ``MAX_COORDINATES`` of them keeps
the memory bounded for a large trunk (sums over coordinates scale by the share kept).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

#: coordinates of the trainer-side gradient kept per batch (at most)
MAX_COORDINATES = 1 << 20


def gradient_sample(grads: Iterable[torch.Tensor | None], total: int) -> torch.Tensor:
    """Every ``stride``-th coordinate of the flattened gradients (``total`` coordinates
    in all; None: a parameter without a gradient, read as zeros), as float32 on the CPU,
    scaled so that its squared norm estimates the whole gradient's."""
    stride = max(1, math.ceil(total / MAX_COORDINATES))
    parts = []
    for g in grads:
        if g is None:
            continue
        parts.append(g.detach().reshape(-1)[::stride].float().cpu())
    if not parts:
        return torch.zeros(0)
    return torch.cat(parts) * math.sqrt(stride)


@dataclass
class NoiseScale:
    """``add`` each batch's gradient sample (batch ``batch`` sequences), in order;
    ``sequences``: the estimated simple noise scale, in sequences (None until a pair
    of batches gave a positive ``|G|^2``)."""

    batch: int
    #: the exponential averages' decay per pair of batches
    decay: float = 0.9
    _previous: torch.Tensor | None = field(default=None, repr=False)
    _mean_square: float = 0.0  # |G|^2's average
    _trace: float = 0.0  # tr(S)'s average
    _pairs: int = 0  # the ratio of the averages needs no debiasing: both share it

    def add(self, sample: torch.Tensor) -> None:
        if self._previous is None or self._previous.shape != sample.shape:
            self._previous = sample
            return
        small = 0.5 * (float(self._previous.square().sum()) + float(sample.square().sum()))
        big = float((0.5 * (self._previous + sample)).square().sum())
        self._previous = None  # pairs do not overlap: each estimate is of its own batches
        mean_square = 2 * big - small  # (2B |g_2B|^2 - B |g_B|^2) / (2B - B)
        trace = 2 * self.batch * (small - big)  # (|g_B|^2 - |g_2B|^2) / (1/B - 1/2B)
        self._mean_square = self.decay * self._mean_square + (1 - self.decay) * mean_square
        self._trace = self.decay * self._trace + (1 - self.decay) * trace
        self._pairs += 1

    @property
    def pairs(self) -> int:
        """Pairs of batches the estimate has seen."""
        return self._pairs

    @property
    def sequences(self) -> float | None:
        if self._pairs == 0 or self._mean_square <= 0.0:
            return None
        return max(0.0, self._trace / self._mean_square)
