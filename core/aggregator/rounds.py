"""How one uid's rounds go at an aggregator: when a round is due, how many distinct
contributors it needs, how the contributors' mean gradients become one step, and with
which optimizer, at which rate. An expert's rounds are robust (volunteers are strangers)
and follow the manifest's ``[training.expert_schedule]``; the trainers' trunk has rules
of its own (core/aggregator/trunk.py). The engine (core.py) holds one rule per uid and
never asks which kind it holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from core.aggregator.compact import Q8, round_stochastic
from core.aggregator.optimizer import CompactAdam
from core.aggregator.robust import (
    ExpertRoundState,
    RobustSettings,
    dense,
    influence,
    robust_round,
)
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
        samples: Mapping[str, int],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(the step's gradient, each contributor's kept share) from each contributor's
        mean gradient (flat) over its ``samples``; ``state``: the uid's robust state
        across rounds."""
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
    #: the dtype of what is kept between rounds (core/aggregator/compact.py
    #: ``state_dtype``): bfloat16 for a 16-bit project keeps Adam's moments in it and
    #: the robust rule's center, and each contributor's momentum as Q8 blocks, all
    #: rounded at random; float32 keeps everything exact
    state_dtype: torch.dtype = torch.float32

    def optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        if self.optimizer_name == "sgd":
            return make_optimizer("sgd", module, self.learning_rate, self.schedule.weight_decay)
        return CompactAdam(
            module.parameters(),
            self.learning_rate,
            weight_decay=self.schedule.weight_decay,
            decoupled=self.optimizer_name == "adamw",
            moments=self.state_dtype,
        )

    def prepare(
        self, optimizer: torch.optim.Optimizer, gradient: torch.Tensor, version: int
    ) -> torch.Tensor:
        rate = self.schedule.rate(self.learning_rate, version)
        for group in optimizer.param_groups:
            group["lr"] = rate
        if isinstance(optimizer, CompactAdam):  # its rounding drawn by the version
            optimizer.generator.manual_seed(version)
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
        samples: Mapping[str, int],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        generator = torch.Generator().manual_seed(version)
        aggregate = robust_round(state, means, self.robust, generator, sibling_scale, samples)
        momenta = state.momenta or {}
        kept = influence(
            {who: dense(momenta.get(who, g)) for who, g in means.items()}, aggregate, self.robust
        )
        if self.state_dtype != torch.float32:  # at rest, compact (after the last use)
            rounding = torch.Generator().manual_seed(version + (1 << 32))
            for who in means:
                if who in momenta:
                    momenta[who] = Q8.encode(dense(momenta[who]), rounding)
            assert state.previous is not None
            state.previous = round_stochastic(state.previous, self.state_dtype, rounding)
        return aggregate, kept
