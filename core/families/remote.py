"""A family's sparse block whose experts are volunteers' servers: the family's grid gate
(bias-free, exportable as Mixtral's router) scores every token, and moehome's remote
mixture finds the chosen experts by beam search, calls them, and mixes their answers by
the softmax over the chosen scores (Mixtral's weighting: tests/unit/test_families_mixtral)."""

from __future__ import annotations

import torch
from torch import nn

from core.families.routing import GridGate, full_scores
from core.moe.mixture import RemoteMixtureOfExperts


class RemoteSparseBlock(nn.Module):
    """``(output [batch, seq, hidden], router_logits [batch * seq, experts])`` from the
    normed hidden states, each token routed on its own. Only the gate's weights are
    this module's (``gate.proj.weight``, as in ``LocalGridMixture``): the experts'
    live on the volunteers' nodes."""

    def __init__(self, gate: GridGate, mixture: RemoteMixtureOfExperts) -> None:
        super().__init__()
        if tuple(mixture.grid.shape) != gate.shape:
            raise ValueError(f"gate {list(gate.shape)} and grid {list(mixture.grid.shape)}")
        if mixture.proj is not None:
            raise ValueError("the remote mixture must take its scores from the family's gate")
        self.gate = gate
        self._mixture = [mixture]  # not a submodule: it holds no weights of the model

    @property
    def mixture(self) -> RemoteMixtureOfExperts:
        return self._mixture[0]

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        per_dim = self.gate(x)
        out = self.mixture.mix(x, per_dim)
        return out.view_as(hidden_states), full_scores(per_dim)
