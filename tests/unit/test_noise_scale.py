"""The online gradient noise scale (core/trainer/noise_scale.py) on gradients drawn with
a known mean and per-sample variance: ``B_simple = tr(S) / |G|^2`` is known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from core.trainer import noise_scale
from core.trainer.noise_scale import NoiseScale, gradient_sample


@pytest.mark.parametrize(
    ("batch", "per_sample_variance", "expected"),
    [
        # d = 2,000 coordinates, |G|^2 = 1: B_simple = variance x d
        (16, 0.0025, 5.0),
        (16, 0.025, 50.0),
        (64, 0.025, 50.0),
        (8, 0.25, 500.0),
    ],
)
def test_the_estimate_finds_the_noise_scale_of_known_gradients(
    batch: int, per_sample_variance: float, expected: float
) -> None:
    generator = torch.Generator().manual_seed(0)
    d = 2000
    mean = torch.randn(d, generator=generator)
    mean /= mean.norm()  # |G|^2 = 1
    estimate = NoiseScale(batch, decay=0.995)
    for _ in range(4000):  # 2,000 pairs, averaged over ~200
        noise = torch.randn(d, generator=generator) * math.sqrt(per_sample_variance / batch)
        estimate.add(mean + noise)
    assert estimate.sequences == pytest.approx(expected, rel=0.2)


def test_no_estimate_before_a_pair_nor_from_pure_noise() -> None:
    estimate = NoiseScale(16)
    assert estimate.sequences is None
    estimate.add(torch.ones(10))
    assert estimate.sequences is None  # one batch: no pair yet
    estimate.add(torch.ones(10))
    assert estimate.sequences == 0.0  # the same gradient twice: no noise
    flat = NoiseScale(16)
    flat.add(torch.tensor([1.0, -1.0]))
    flat.add(torch.tensor([-1.0, 1.0]))  # opposite: their mean is 0, |G|^2 <= 0
    assert flat.sequences is None


def test_the_sample_keeps_a_strided_share_and_scales_it(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = [torch.arange(10.0), None, torch.arange(6.0).view(2, 3)]
    whole = gradient_sample(grads, 16)
    assert torch.equal(whole, torch.cat([torch.arange(10.0), torch.arange(6.0)]))
    monkeypatch.setattr(noise_scale, "MAX_COORDINATES", 8)  # stride 2
    half = gradient_sample(grads, 16)
    kept = torch.tensor([0.0, 2, 4, 6, 8, 0, 2, 4])
    assert torch.allclose(half, kept * math.sqrt(2))
    assert gradient_sample([None], 0).numel() == 0
