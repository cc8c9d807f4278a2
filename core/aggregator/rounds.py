"""How one uid's rounds go at an aggregator: when a round is due, how many distinct
contributors it needs, how the contributors' mean gradients become one step, and with
which optimizer, at which rate. An expert's rounds are robust (volunteers are strangers)
and follow the manifest's ``[training.expert_schedule]``; the trainers' trunk has rules
of its own (core/aggregator/trunk.py). The engine (core.py) holds one rule per uid and
never asks which kind it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from core.aggregator.robust import ExpertRoundState, RobustSettings, influence, robust_round
from core.checkpoints import make_optimizer
from core.project.schedule import Schedule


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

    def prepare(
        self, optimizer: torch.optim.Optimizer, gradient: torch.Tensor, version: int
    ) -> torch.Tensor:
        """Ready ``optimizer`` for the step from ``version`` (its learning rate, set
        afresh each step: nothing of it is saved with the optimizer's state) and return
        ``gradient`` (``combine``'s, flat) as the step is to apply it."""
        ...

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
    seeded by the version, so a replay after a crash steps the same; stepped at
    ``learning_rate`` x the ``schedule``'s factor at the version, the aggregate clipped
    to the schedule's ``clip_norm`` (when > 0), with its ``weight_decay``."""

    min_contributors: int
    round_samples: int
    round_seconds: float
    optimizer_name: str
    learning_rate: float
    robust: RobustSettings
    audited: bool = True
    schedule: Schedule = field(default_factory=Schedule)

    def optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(
            self.optimizer_name, module, self.learning_rate, self.schedule.weight_decay
        )

    def prepare(
        self, optimizer: torch.optim.Optimizer, gradient: torch.Tensor, version: int
    ) -> torch.Tensor:
        rate = self.schedule.rate(self.learning_rate, version)
        for group in optimizer.param_groups:
            group["lr"] = rate
        clip = self.schedule.clip_norm
        if clip > 0:
            norm = float(torch.linalg.vector_norm(gradient))
            if norm > clip:  # as torch.nn.utils.clip_grad_norm_, over the whole expert
                gradient = gradient * (clip / norm)
        return gradient

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
