"""Wrong answers: what a volunteer that cheats on its expert answers would send, so that
the demo and the tests can show answer audits (core/moe/audit.py) at work. Used only
when asked for (``moehome node --attack``, a hidden option), through the answer hook
the expert server offers (core/experts/answers.py); an honest node never alters an
answer.

Each cheat looks plausible: the right shape, finite, of the right magnitude.

- ``scaled-answers``: the answer times 1.05.
- ``noised-answers``: plus Gaussian noise of 5% of the answer's root mean square.
- ``lazy-answers``: no computation at all: a forward pass returns its inputs (the
  expert's residual path alone), a backward pass its output gradients.
- ``stale-answers``: forward passes computed with the weights before the current
  version (a volunteer that does not bother to swap new weights in), named as the
  current version; backward passes honest. Until the first new version, honest.
"""

from __future__ import annotations

from typing import Final

import torch

from core.experts.answers import AnswerDraft, AnswerHook

#: -> the answer sent
Cheat = AnswerHook

SCALE: Final = 1.05
NOISE: Final = 0.05


def scaled(a: AnswerDraft) -> torch.Tensor:
    return a.answer * SCALE


def noised(a: AnswerDraft) -> torch.Tensor:
    rms = a.answer.float().pow(2).mean().sqrt()
    return a.answer + (NOISE * rms * torch.randn_like(a.answer.float())).to(a.answer.dtype)


def lazy(a: AnswerDraft) -> torch.Tensor:
    return a.request.to(a.answer.dtype).clone()


def stale(a: AnswerDraft) -> torch.Tensor:
    if a.kind != "forward" or a.older is None:
        return a.answer
    with torch.no_grad():
        out: torch.Tensor = a.older(a.request.to(next(a.older.parameters()).device))
    return out.to(a.answer.device, a.answer.dtype)


ANSWER_CHEATS: Final[dict[str, Cheat]] = {
    "scaled-answers": scaled,
    "noised-answers": noised,
    "lazy-answers": lazy,
    "stale-answers": stale,
}
