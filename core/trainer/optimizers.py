"""The trainer-side layers' optimizer: AdamW for every parameter, or Muon for the hidden
matrices with AdamW for the rest (``[training] trainer_optimizer``).

Muon (Jordan et al., 2024; torch.optim.Muon) orthogonalizes each matrix's momentum with
a few Newton-Schulz iterations. It is used the way its authors and Moonshot's "Muon is
Scalable for LLM Training" use it: on 2-D weights inside the network. Embeddings and the
output layer (they map tokens, not hidden features) and vectors (norms, biases) stay on
AdamW, and so do a reference run's local experts (the swarm's are the aggregators').
Its step is scaled as Moonshot's (``match_rms_adamw``): an update of the same RMS as
AdamW's, so one learning rate and weight decay serve both. Why: on the demo's model it
reached a lower loss than AdamW at the same samples, synchronous and with batches in
flight (docs/decisions/013-time-to-loss.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, get_args

import torch
from torch import nn

from core.checkpoints import load_optimizer_state, optimizer_state
from core.project.manifest import TrainerOptimizerKind

TRAINER_OPTIMIZERS: tuple[str, ...] = get_args(TrainerOptimizerKind)


def stale_rate(kind: TrainerOptimizerKind, rate: float, staleness: int) -> float:
    """The rate at which a gradient computed ``staleness`` updates ago is applied.

    AdamW: ``rate / (1 + staleness)`` (staleness-aware rate, Zhang et al. 2016). Muon: the
    full rate. Both beside the weight prediction (core/trainer/session.py), measured with
    benchmarks/concurrency_local.py on the demo's Mixtral model (200 steps of 16, seeds
    1-3; validation loss, the one-at-a-time reference 1.958 on Muon, 2.101 on AdamW):
    Muon at 1e-2 with 3 in flight 2.278 divided, 2.177 at ``rate / sqrt(1 + k)``, 2.119
    at the full rate (2 in flight: 2.139 against 2.002; 6: 2.437 against 2.393); AdamW
    at 3e-3 with 3 in flight 2.346 divided, 2.346 at the square root, 2.652 at the full
    rate. (Muon's step has a set size, whatever the gradient's: the prediction keeps
    the three in flight apart, and shrinking each step only slows the weights.)"""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0")
    return rate if kind == "muon" else rate / (1 + staleness)


def vocabulary_parameters(model: nn.Module) -> set[int]:
    """Ids of the parameters that map tokens: every embedding's and the output layer's
    (``get_output_embeddings()`` of a Hugging Face model, else the module named
    ``lm_head`` or ``head``)."""
    out: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            out.update(id(p) for p in module.parameters())
    output: Any = None
    get_output = getattr(model, "get_output_embeddings", None)
    if callable(get_output):
        output = get_output()
    for name in ("lm_head", "head"):  # this project's families
        if output is None:
            output = getattr(model, name, None)
    if isinstance(output, nn.Module):
        out.update(id(p) for p in output.parameters())
    return out


def local_mixtures(model: nn.Module) -> list[nn.Module]:
    """The local mixtures of a reference run (each says so with ``stands_for_volunteers``;
    its ``experts`` stand for the volunteers'), in order."""
    return [m for m in model.modules() if getattr(m, "stands_for_volunteers", False)]


def local_expert_parameters(model: nn.Module) -> set[int]:
    """Ids of the experts' parameters of local mixtures: they stand for the volunteers'
    experts, which the aggregators train with the manifest's ``[training] optimizer``,
    so Muon does not take them."""
    out: set[int] = set()
    for mixture in local_mixtures(model):
        experts = mixture.experts
        assert isinstance(experts, nn.Module)
        out.update(id(p) for p in experts.parameters())
    return out


def muon_split(
    model: nn.Module, among: Iterable[nn.Parameter] | None = None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the hidden matrices, for Muon; every other trainable parameter, for AdamW), of
    ``among`` (default: all of ``model``'s)."""
    kept = vocabulary_parameters(model) | local_expert_parameters(model)
    matrices: list[nn.Parameter] = []
    rest: list[nn.Parameter] = []
    for p in model.parameters() if among is None else among:
        if not p.requires_grad:
            continue
        if p.ndim == 2 and id(p) not in kept:
            matrices.append(p)
        else:
            rest.append(p)
    return matrices, rest


class TrainerOptimizer:
    """One optimizer or two, stepped as one: the session sets every group's rate, steps,
    zeroes, saves and loads them together."""

    def __init__(
        self,
        model: nn.Module,
        kind: TrainerOptimizerKind,
        lr: float,
        weight_decay: float = 0.0,
        among: Iterable[nn.Parameter] | None = None,
        local_expert_rate: float | None = None,
    ) -> None:
        """``among``: the parameters to train (default: all of ``model``'s).
        ``local_expert_rate``: a reference run's local experts on their own Adam at this
        fixed rate, as the aggregators train the volunteers' (the manifest's rate), out
        of the groups whose rate the trainer's schedule sets."""
        among = list(model.parameters() if among is None else among)
        if kind not in TRAINER_OPTIMIZERS:
            raise ValueError(f"trainer optimizer {kind!r}: one of {', '.join(TRAINER_OPTIMIZERS)}")
        self.kind = kind
        #: (checkpoint prefix, optimizer)
        self.parts: list[tuple[str, torch.optim.Optimizer]] = []
        #: the local experts' own (not scheduled by the trainer)
        self.experts: torch.optim.Optimizer | None = None
        if local_expert_rate is not None:
            local = local_expert_parameters(model)
            experts = [p for p in among if id(p) in local and p.requires_grad]
            among = [p for p in among if id(p) not in local]
            if experts:
                self.experts = torch.optim.Adam(experts, lr=local_expert_rate)
        if kind == "muon":
            matrices, rest = muon_split(model, among)
            if matrices:
                self.parts.append(
                    (
                        "mu",
                        torch.optim.Muon(
                            matrices,
                            lr=lr,
                            weight_decay=weight_decay,
                            adjust_lr_fn="match_rms_adamw",
                        ),
                    )
                )
            params = rest
        else:
            params = [p for p in among if p.requires_grad]
        # AdamW: with no weight decay, Adam's very steps
        self.parts.insert(0, ("o", torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)))
        if self.experts is not None:
            self.parts.append(("ex", self.experts))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The groups whose rate the trainer's schedule sets (not the local experts')."""
        return [
            group for _, opt in self.parts if opt is not self.experts for group in opt.param_groups
        ]

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return (opt for _, opt in self.parts)

    def step(self) -> None:
        for _, opt in self.parts:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)

    def state(self, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The state as tensors (into ``tensors``) and plain values (returned): AdamW's
        under ``o/`` as before there was a choice, Muon's under ``mu/``."""
        meta: dict[str, Any] = {"kind": self.kind}
        for prefix, opt in self.parts:
            meta[prefix] = optimizer_state(opt, prefix, tensors)
        return meta

    def load(self, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bool:
        """Loads what :meth:`state` saved; False (nothing loaded: the moments start
        afresh) when it was saved by the other kind. A checkpoint of before the choice
        holds AdamW's state alone (``scalars`` at the top)."""
        if "scalars" in meta:
            meta = {"kind": "adamw", "o": meta}
        if meta.get("kind") != self.kind:
            return False
        for prefix, opt in self.parts:
            load_optimizer_state(opt, meta[prefix], prefix, tensors)
        return True
