"""Wrong answers: what a volunteer that cheats on its expert answers would send, so that
the demo and the tests can show answer audits (core/moe/audit.py) at work. Used only
when asked for (``moehome node --attack``, a hidden option); an honest node never
alters an answer.

Each cheat looks plausible: the right shape, finite, of the right magnitude.

- ``scaled-answers``: the answer times 1.05.
- ``noised-answers``: plus Gaussian noise of 5% of the answer's root mean square.
- ``lazy-answers``: no computation at all: a forward pass returns its inputs (the
  expert's residual path alone), a backward pass its output gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch

#: (the honest answer, what the lazy cheat returns instead) -> the answer sent
Cheat = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SCALE: Final = 1.05
NOISE: Final = 0.05


def scaled(answer: torch.Tensor, lazy: torch.Tensor) -> torch.Tensor:
    return answer * SCALE


def noised(answer: torch.Tensor, lazy: torch.Tensor) -> torch.Tensor:
    rms = answer.float().pow(2).mean().sqrt()
    return answer + (NOISE * rms * torch.randn_like(answer.float())).to(answer.dtype)


def lazy(answer: torch.Tensor, lazy: torch.Tensor) -> torch.Tensor:
    return lazy.to(answer.dtype).clone()


ANSWER_CHEATS: Final[dict[str, Cheat]] = {
    "scaled-answers": scaled,
    "noised-answers": noised,
    "lazy-answers": lazy,
}
