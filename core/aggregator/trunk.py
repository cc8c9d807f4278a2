"""The trainers' shared layers at the aggregator that holds them (core/trainer/trunk.py
on the trainers' side): their changes are summed, each whole, and an outer SGD with
Nesterov momentum steps on the sum, once every trainer sent one or ``round_seconds``
after the first. The manifest's trainers are trusted (they sign every receipt): no
robust rule, no minimum of voices, no audits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from core.aggregator.robust import ExpertRoundState


@dataclass(frozen=True)
class TrunkSettings:
    outer_learning_rate: float = 1.0
    outer_momentum: float = 0.0
    round_seconds: float = 5.0


@dataclass(frozen=True)
class TrunkRounds:
    settings: TrunkSettings
    #: how many trainers the manifest lists (a round waits for each, or round_seconds)
    trainers: int
    min_contributors: int = 0
    audited: bool = False

    def optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        momentum = self.settings.outer_momentum
        return torch.optim.SGD(
            module.parameters(),
            lr=self.settings.outer_learning_rate,
            momentum=momentum,
            nesterov=momentum > 0,
        )

    def prepare(
        self, optimizer: torch.optim.Optimizer, gradient: torch.Tensor, version: int
    ) -> torch.Tensor:
        return gradient  # the outer SGD keeps its rate; the changes are applied whole

    def due(self, senders: int, samples: int, waited: float) -> bool:
        return senders >= self.trainers or waited >= self.settings.round_seconds

    def combine(
        self,
        means: dict[str, torch.Tensor],
        state: ExpertRoundState,
        version: int,
        sibling_scale: float | None,
        samples: Mapping[str, int],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # the sum of the trainers' changes, each whole, as steps of one run are. DiLoCo
        # averages its workers' changes, after hundreds of steps each; after a few,
        # averaging keeps one trainer's progress of several (measured:
        # core/trainer/trunk.py)
        return torch.stack(list(means.values())).sum(dim=0), dict.fromkeys(means, 1.0)
