"""The trainer's model of a ``mixtral`` project: ``transformers``' Mixtral layers
(core/families/mixtral.py) whose sparse blocks are the volunteers' experts
(core/families/remote.py), under ``MixtralForCausalLM``'s parameter names, so that the
trainer's weights are the family's checkpoint keys as they are (export, import, and the
trunk the trainers share).

The loss is Mixtral's: the next-token cross-entropy plus ``router_aux_loss`` times the
load-balancing loss of every layer's router (``transformers``' ``load_balancing_loss_func``,
core/families/routing.py); evaluations report the cross-entropy alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import MixtralConfig

from core.experts.uid import Grid
from core.families.config import mixtral_config
from core.families.mixtral import MixtralLanguageModel, build_model
from core.families.remote import RemoteSparseBlock
from core.families.routing import GridGate, load_balancing_loss
from core.moe.mixture import RemoteMixtureOfExperts
from core.project.manifest import ModelSection
from core.trainer.model import TrainerModel, language_model_loss

#: Builds the remote mixture of one layer (its finder and caller): (layer, grid) -> it.
RemoteFactory = Callable[[int, Grid], RemoteMixtureOfExperts]


class MixtralTrainerModel(MixtralLanguageModel, TrainerModel):
    """``MixtralLanguageModel`` with the trainer's objective."""

    def __init__(
        self, config: MixtralConfig, make_block: Callable[[int], nn.Module], *, context: int
    ) -> None:
        super().__init__(config, make_block)
        self.context = context

    def objective(
        self, tokens: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self(tokens)
        lm = language_model_loss(out.logits, targets)
        coef = float(self.config.router_aux_loss_coef)
        if coef == 0 or not self.config.output_router_logits:
            return lm, lm
        aux = load_balancing_loss(out.router_logits, int(self.config.num_experts_per_tok))
        return lm + coef * aux, lm

    def remote_mixtures(self) -> list[RemoteMixtureOfExperts]:
        return [b.mixture for b in self.blocks() if isinstance(b, RemoteSparseBlock)]


class GateOnly(nn.Module):
    """A layer's trainer-side part alone (the aggregator's copy of the shared trunk): its
    grid gate, named as in the remote block (``gate.proj.weight``). It never runs."""

    def __init__(self, gate: GridGate) -> None:
        super().__init__()
        self.gate = gate

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("the aggregator's trunk holds weights; it never runs")


def build_family_model(
    model: ModelSection,
    make_block: Callable[[int, Grid], nn.Module],
    *,
    seed: int,
    eos_token_id: int | None = None,
) -> MixtralTrainerModel:
    """The trainer's model of ``model`` (architecture ``mixtral``): every layer's block
    made by ``make_block(layer, grid)``; the trainer-side weights from ``seed``
    (``reset_trunk``: the same whatever the blocks are)."""
    config = mixtral_config(model, eos_token_id=eos_token_id)
    grids = model.grids()
    built = build_model(
        config,
        lambda layer: make_block(layer, grids[layer]),
        seed=seed,
        model_class=lambda c, blocks: MixtralTrainerModel(c, blocks, context=model.context),
    )
    assert isinstance(built, MixtralTrainerModel)
    return built


def remote_blocks(make_mixture: RemoteFactory, hidden: int) -> Callable[[int, Grid], nn.Module]:
    """Blocks whose experts are the volunteers': the family's gate and the remote mixture."""

    def block(layer: int, grid: Grid) -> nn.Module:
        return RemoteSparseBlock(GridGate(hidden, grid.shape), make_mixture(layer, grid))

    return block


def family_trunk(model: ModelSection, *, seed: int) -> MixtralTrainerModel:
    """The trainer-side layers alone, as every trainer starts them (the same names and
    values as ``build_family_model`` with remote blocks and the same seed)."""
    return build_family_model(
        model, lambda _layer, grid: GateOnly(GridGate(model.hidden, grid.shape)), seed=seed
    )
