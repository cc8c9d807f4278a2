"""Poisoned contributions: what a malicious volunteer would send, so that the demo and the
tests can show the aggregators' robust rules at work. Used only when asked for
(``moehome node --attack``, a hidden option); an honest node never poisons anything.

- ``sign-flip``: the gradient times -1000 (a crude, loud attack).
- ``alie`` ("A Little Is Enough", Baruch et al., NeurIPS 2019): mean - z x std,
  coordinate-wise, which hides inside the honest spread. The paper's colluding attackers
  know the honest mean and spread; a lone attacker estimates both from its own recent
  gradients, which is what this does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

import torch

ATTACKS: Final = ("sign-flip", "alie")
SIGN_FLIP_SCALE: Final = 1000.0
#: how far below the mean ALIE goes, in standard deviations. The paper's z_max for 5
#: workers and 1 attacker is 0.25; 1.0 is a stronger attack that still hides in the spread.
ALIE_Z: Final = 1.0
ALIE_HISTORY: Final = 8


def sign_flip(
    grads: dict[str, torch.Tensor], scale: float = SIGN_FLIP_SCALE
) -> dict[str, torch.Tensor]:
    return {name: g * -scale for name, g in grads.items()}


def alie(
    grads: dict[str, torch.Tensor], history: list[dict[str, torch.Tensor]], z: float = ALIE_Z
) -> dict[str, torch.Tensor]:
    """mean - z x std over ``history`` (per-sample gradients, this one included); with a
    single gradient, its magnitude stands in for the spread."""
    out = {}
    for name, g in grads.items():
        stack = torch.stack([h[name] for h in history]) if len(history) > 1 else g.unsqueeze(0)
        mean = stack.mean(dim=0)
        std = stack.std(dim=0) if stack.shape[0] > 1 else g.abs()
        out[name] = mean - z * std
    return out


@dataclass
class Attack:
    kind: str
    _history: dict[str, deque[dict[str, torch.Tensor]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"unknown attack {self.kind!r}; one of {', '.join(ATTACKS)}")

    def poison(
        self, uid: str, sums: dict[str, torch.Tensor], samples: int
    ) -> dict[str, torch.Tensor]:
        """Gradient sums over ``samples`` -> the poisoned sums to send instead."""
        if self.kind == "sign-flip":
            return sign_flip(sums)
        per_sample = {name: g / max(samples, 1) for name, g in sums.items()}
        history = self._history.setdefault(uid, deque(maxlen=ALIE_HISTORY))
        history.append(per_sample)
        poisoned = alie(per_sample, list(history))
        return {name: g * samples for name, g in poisoned.items()}
