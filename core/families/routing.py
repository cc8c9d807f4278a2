"""Routing shared by the model families: the grid gate, Mixtral's top-k weighting, the
beam search's choice, and the router's load-balancing loss.

The grid gate scores each dimension of a layer's grid on its own and an expert's score
is the sum over its coordinates: with the gate's rows ``W_d`` of dimension ``d``,
expert ``(c_1, .., c_n)`` scores ``sum_d W_d[c_d] . x``. That is a linear router over all
``prod(grid)`` experts, whose row of the expert is ``sum_d W_d[c_d]`` (``full_router``),
the experts in the grid's order (``Grid``'s iteration: row-major). A 1-D grid ``[E]`` is
the family's plain router. No bias: a family's router has none.

Mixtral weighs the chosen experts with ``softmax(all logits)``, its top k, renormalized:
that is the softmax over the chosen experts' logits alone, which is what moehome's
mixtures compute (core/moe/mixture.py), so the two agree whenever they choose the same
experts. With every expert alive, the beam search over an additive grid score chooses
exactly the top k (a prefix outside the best k at some level has k better prefixes, and
each of them completed as the candidate is would beat it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from core.experts.uid import Grid
from core.moe.beams import beam_search


class GridGate(nn.Module):
    """Per-dimension gating scores of a grid: ``proj`` maps [tokens, hidden] to the
    ``sum(shape)`` scores, dimension after dimension (as moehome's mixtures name it)."""

    def __init__(self, hidden: int, shape: Sequence[int]) -> None:
        super().__init__()
        if not shape or any(n < 1 for n in shape):
            raise ValueError(f"a grid needs sizes of at least 1, got {list(shape)}")
        self.shape = tuple(int(n) for n in shape)
        self.proj = nn.Linear(hidden, sum(self.shape), bias=False)

    @property
    def experts(self) -> int:
        return math.prod(self.shape)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [tokens, hidden] -> each dimension's scores [tokens, shape[d]]."""
        return list(self.proj(x).split(list(self.shape), dim=-1))

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, hidden] -> every expert's score [tokens, prod(shape)]."""
        return full_scores(self(x))

    def router_weight(self) -> torch.Tensor:
        """The linear router over all experts: [prod(shape), hidden]."""
        return full_router(self.proj.weight, self.shape)


def full_scores(per_dim: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-dimension scores [..., n_d] -> every expert's sum [..., prod(n)], row-major."""
    total = per_dim[0]
    for scores in per_dim[1:]:
        total = (total.unsqueeze(-1) + scores.unsqueeze(-2)).flatten(-2)
    return total


def full_router(weight: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A grid gate's rows [sum(shape), hidden] -> the router over all experts
    [prod(shape), hidden]: row ``e`` is the sum of its coordinates' rows."""
    if weight.shape[0] != sum(shape):
        raise ValueError(f"a gate of {weight.shape[0]} rows cannot score a grid {list(shape)}")
    blocks = torch.split(weight, list(shape), dim=0)  # each [n_d, hidden]
    return full_scores([b.transpose(0, 1) for b in blocks]).transpose(0, 1).contiguous()


def route_top_k(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's routing: softmax over all experts (in float32), the k most probable,
    their probabilities renormalized to sum to one -> (weights [tokens, k] float32,
    experts [tokens, k]), best first."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top, chosen = torch.topk(probs, k, dim=-1)
    return top / top.sum(dim=-1, keepdim=True), chosen


def chosen_weights(router_logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """moehome's weighting: the softmax over the chosen experts' scores alone
    [tokens, k] (equal to ``route_top_k``'s weights for the same experts)."""
    return torch.softmax(router_logits.float().gather(1, chosen), dim=1)


def beam_search_top_k(per_dim: Sequence[torch.Tensor], grid: Grid, k: int) -> torch.Tensor:
    """The experts moehome's beam search chooses with every expert alive, as indices in
    the grid's order [tokens, k], best first (as the trainer runs it: core/moe/beams.py)."""
    if tuple(p.shape[-1] for p in per_dim) != grid.shape:
        raise ValueError(f"scores of {[p.shape[-1] for p in per_dim]} for a grid {grid.shape}")
    return beam_search([p.detach() for p in per_dim], k).experts


def load_balancing_loss(
    router_logits: Sequence[torch.Tensor],
    k: int,
    *,
    chosen: Sequence[torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, as Mixtral computes it
    (``transformers``' ``load_balancing_loss_func``): ``E * sum_e f_e * P_e`` over all
    layers' tokens, where ``f_e`` is the share of top-k choices (k per token, so the
    ``f_e`` sum to k) that went to expert ``e`` and ``P_e`` its mean router probability.
    ``router_logits``: each layer's [tokens, E]; ``chosen``: each layer's experts
    actually chosen [tokens, k] (the swarm's, where some were dead; by default the
    top k); ``attention_mask`` [batch, seq] (tokens = batch * seq) leaves padding out."""
    if not router_logits:
        raise ValueError("no layer's router logits")
    experts = router_logits[0].shape[-1]
    device = router_logits[0].device
    counts = torch.zeros(experts, device=device)
    probs_sum = torch.zeros(experts, device=device)
    rows = torch.zeros((), device=device)
    for i, logits in enumerate(router_logits):
        probs = torch.softmax(logits.float(), dim=-1)
        picked = chosen[i] if chosen is not None else torch.topk(probs, k, dim=-1).indices
        mask = (
            torch.ones(probs.shape[0], device=device)
            if attention_mask is None
            else attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
        )
        counts = counts.scatter_add(0, picked.reshape(-1), mask.repeat_interleave(picked.shape[-1]))
        probs_sum = probs_sum + (probs * mask.unsqueeze(-1)).sum(dim=0)
        rows = rows + mask.sum()
    return experts * torch.sum((counts / rows) * (probs_sum / rows))
