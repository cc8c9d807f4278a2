"""Compact forms of an aggregator's state at rest, and the rounding that keeps them
unbiased. Pure functions of tensors.

- **Stochastic rounding** to bfloat16: a float32 value goes up or down to its two
  bfloat16 neighbours with probabilities that make the expectation the value itself. A
  running average kept in 16 bits by rounding to nearest stops moving once an update is
  smaller than half a step (Adam's second moment at beta2 = 0.999 moves by 0.1% a step,
  a quarter of bfloat16's step): rounded at random it keeps moving, on average exactly.
- **Q8 blocks**: int8 codes and a float32 scale per block of ``BLOCK`` values (the
  block's largest magnitude / 127), codes rounded at random: 1.02 bytes a value, unbiased.
  Each contributor's centered-clip momentum is kept so (core/aggregator/rounds.py).

Every random draw comes from a generator the caller seeds (by the round's version), so
replaying a round after a crash rounds the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 256


def round_stochastic(
    x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """``x`` in ``dtype`` (float32: as it is; bfloat16: a uniform draw added to the low
    16 bits before they are cut off, bfloat16 being float32's top 16 bits)."""
    x = x.detach().to(torch.float32)
    if dtype == torch.float32:
        return x.clone()
    if dtype != torch.bfloat16:
        raise ValueError(f"no stochastic rounding to {dtype}")
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=generator)
    cut = torch.bitwise_and(bits + noise, -(1 << 16)).view(torch.float32)
    # infinities and NaN as they are (a draw could carry into the exponent's bits)
    return torch.where(torch.isfinite(x), cut, x).to(torch.bfloat16)


def state_dtype(project: torch.dtype) -> torch.dtype:
    """The dtype an aggregator keeps running averages of a project's experts in:
    bfloat16 for a 16-bit project (float16's range would flush a small gradient's square
    to zero), float32 for a float32 one."""
    return torch.float32 if project == torch.float32 else torch.bfloat16


@dataclass(frozen=True)
class Q8:
    """A float32 vector of ``numel`` values as int8 ``codes`` and per-block ``scales``."""

    codes: torch.Tensor
    scales: torch.Tensor
    numel: int

    @classmethod
    def encode(cls, x: torch.Tensor, generator: torch.Generator) -> Q8:
        flat = x.detach().reshape(-1).to(torch.float32)
        n = flat.numel()
        pad = (-n) % BLOCK
        blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
        scales = blocks.abs().amax(dim=1).clamp_min(1e-30) / 127.0
        scaled = blocks / scales[:, None]
        draw = torch.rand(scaled.shape, generator=generator)
        codes = torch.floor(scaled + draw).clamp(-127, 127).to(torch.int8)
        return cls(codes.reshape(-1)[:n].clone(), scales, n)

    def decode(self) -> torch.Tensor:
        pad = self.scales.numel() * BLOCK - self.numel
        codes = torch.nn.functional.pad(self.codes.to(torch.float32), (0, pad))
        return (codes.reshape(-1, BLOCK) * self.scales[:, None]).reshape(-1)[: self.numel]

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scales.numel()
