"""How one uid's rounds go at an aggregator: when a round is due, how many distinct
contributors it needs, how the contributors' mean gradients become one step, and with
which optimizer. An expert's rounds are robust (volunteers are strangers); the trainers'
trunk has rules of its own (core/aggregator/trunk.py). The engine (core.py) holds one
rule per uid and never asks which kind it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from core.aggregator.robust import ExpertRoundState, RobustSettings, influence, robust_round
from core.checkpoints import make_optimizer


class RoundRule(Protocol):
    @property
    def min_contributors(self) -> int:
        """Distinct contributors a version needs (0: any number)."""
        ...

    @property
    def audited(self) -> bool:
        """Whether its contributions may be drawn for audits (and recent versions
        kept for them)."""
        ...

    def optimizer(self, module: nn.Module) -> torch.optim.Optimizer: ...

    def due(self, senders: int, samples: int, waited: float) -> bool:
        """Whether a round with ``samples`` from ``senders`` distinct contributors,
        ``waited`` seconds after it began, is to run now."""
        ...

    def combine(
        self,
        means: dict[str, torch.Tensor],
        state: ExpertRoundState,
        version: int,
        sibling_scale: float | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(the step's gradient, each contributor's kept share) from each contributor's
        mean gradient (flat); ``state``: the uid's robust state across rounds."""
        ...


@dataclass(frozen=True)
class ExpertRounds:
    """An expert's rounds: never from fewer than ``min_contributors`` voices; due at
    ``round_samples`` or ``round_seconds``; a robust aggregate (core/aggregator/robust.py)
    seeded by the version, so a replay after a crash steps the same."""

    min_contributors: int
    round_samples: int
    round_seconds: float
    optimizer_name: str
    learning_rate: float
    robust: RobustSettings
    audited: bool = True

    def optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(self.optimizer_name, module, self.learning_rate)

    def due(self, senders: int, samples: int, waited: float) -> bool:
        if senders < self.min_contributors:
            return False  # a version is never set by fewer voices than the manifest says
        return samples >= self.round_samples or waited >= self.round_seconds

    def combine(
        self,
        means: dict[str, torch.Tensor],
        state: ExpertRoundState,
        version: int,
        sibling_scale: float | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        generator = torch.Generator().manual_seed(version)
        aggregate = robust_round(state, means, self.robust, generator, sibling_scale)
        momenta = state.momenta or {}
        kept = influence(
            {who: momenta.get(who, g) for who, g in means.items()}, aggregate, self.robust
        )
        return aggregate, kept
