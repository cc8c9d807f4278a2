"""Adam and AdamW with their moments kept in a compact dtype: what an aggregator steps
each expert with. The step itself is computed in float32, as torch's Adam computes it;
only the moments at rest are bfloat16 for a 16-bit project, rounded at random
(core/aggregator/compact.py) so that the second moment keeps moving. With float32
moments it is torch's Adam (tests/unit/test_aggregator_memory.py compares them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from core.aggregator.compact import round_stochastic


class CompactAdam(torch.optim.Optimizer):
    """``decoupled``: AdamW's weight decay (the weights shrink by lr x decay); else
    Adam's L2 term added to the gradient. ``generator`` draws the moments' rounding:
    whoever steps reseeds it (by the version) so that a replayed step rounds the same."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = False,
        moments: torch.dtype = torch.float32,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.decoupled = decoupled
        self.moments = moments
        self.generator = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("CompactAdam takes no closure")
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            eps, decay = group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state: dict[str, Any] = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.moments)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.moments)
                grad = p.grad.to(torch.float32)
                if decay and self.decoupled:
                    p.mul_(1 - lr * decay)
                elif decay:
                    grad = grad.add(p, alpha=decay)
                exp_avg = state["exp_avg"].to(torch.float32).lerp_(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].to(torch.float32)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["step"] = step = int(state["step"]) + 1
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
                state["exp_avg"] = round_stochastic(exp_avg, self.moments, self.generator)
                state["exp_avg_sq"] = round_stochastic(exp_avg_sq, self.moments, self.generator)
        return None
