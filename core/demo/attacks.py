"""Poisoned contributions: what a malicious volunteer would send, so that the demo and the
tests can show the aggregators' robust rules at work. Used only when asked for
(``moehome node --attack``, a hidden option), through the sender's hook on gradient sums
(core/contributing/sender.py ``SumsHook``); an honest node never poisons anything.

- ``sign-flip``: the gradient times -1000 (a crude, loud attack).
- ``alie`` ("A Little Is Enough", Baruch et al., NeurIPS 2019): mean - z x std,
  coordinate-wise, which hides inside the honest spread. The paper's colluding attackers
  know the honest mean and spread; a lone attacker estimates both from its own recent
  gradients, which is what this does.
- ``copied``: a gradient computed by someone else, on other data (a volunteer that
  serves answers but sends a gradient it did not compute: here, its own previous one,
  scaled to this one's samples, which is statistically an honest stranger's).
- ``drift``: the honest gradient plus a constant direction of a tenth of its norm: the
  patient attacker's push toward a chosen model, small enough to pass for honest noise.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import torch

ATTACKS: Final = ("sign-flip", "alie", "copied", "drift")
SIGN_FLIP_SCALE: Final = 1000.0
#: how far below the mean ALIE goes, in standard deviations. The paper's z_max for 5
#: workers and 1 attacker is 0.25; 1.0 is a stronger attack that still hides in the spread.
ALIE_Z: Final = 1.0
ALIE_HISTORY: Final = 8
#: the drift's norm, relative to the honest gradient's
DRIFT: Final = 0.1


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


def drift(
    grads: dict[str, torch.Tensor], *, seed: int, size: float = DRIFT
) -> dict[str, torch.Tensor]:
    """``grads`` plus a fixed direction (the same every time for one ``seed``) of
    ``size`` times their norm."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, g in grads.items():
        direction = torch.randn(g.shape, generator=generator)
        out[name] = g + direction / direction.norm() * g.norm() * size
    return out


@dataclass
class Attack:
    kind: str
    _history: dict[str, deque[dict[str, torch.Tensor]]] = field(default_factory=dict)
    #: per expert, the previous gradient per sample (what ``copied`` sends)
    _previous: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def _copied(
        self, uid: str, sums: dict[str, torch.Tensor], samples: int
    ) -> dict[str, torch.Tensor]:
        previous = self._previous.get(uid)
        self._previous[uid] = {name: g / max(samples, 1) for name, g in sums.items()}
        if previous is None:
            return sums  # nothing to copy yet
        return {name: g * samples for name, g in previous.items()}

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"unknown attack {self.kind!r}; one of {', '.join(ATTACKS)}")

    def __call__(
        self, uid: str, sums: dict[str, torch.Tensor], samples: int
    ) -> dict[str, torch.Tensor]:
        """Gradient sums over ``samples`` -> the poisoned sums to send instead."""
        if self.kind == "sign-flip":
            return sign_flip(sums)
        if self.kind == "copied":
            return self._copied(uid, sums, samples)
        if self.kind == "drift":
            return drift(sums, seed=zlib.crc32(uid.encode()))
        per_sample = {name: g / max(samples, 1) for name, g in sums.items()}
        history = self._history.setdefault(uid, deque(maxlen=ALIE_HISTORY))
        history.append(per_sample)
        poisoned = alie(per_sample, list(history))
        return {name: g * samples for name, g in poisoned.items()}
