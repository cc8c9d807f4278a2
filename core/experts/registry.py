"""Expert module types built into the program, configured by data only.

Nothing that runs is ever received from the network: a peer receives an ``ExpertSpec``
(plain fields, validated by core/experts/spec.py) and builds one of the types below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import torch
from torch import nn

from core.experts.spec import (
    MAX_BLOCKS,
    MAX_HIDDEN,
    ExpertSpec,
    SpecError,
)

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "EXPERT_TYPES",
    "MAX_BLOCKS",
    "MAX_HIDDEN",
    "ExpertSpec",
    "SpecError",
    "build_expert",
    "parameter_count",
]

#: the dtypes and activations of core/experts/spec.py's names (tests/unit/test_expert_spec.py)
DTYPES: Final[Mapping[str, torch.dtype]] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
ACTIVATIONS: Final[Mapping[str, Callable[[], nn.Module]]] = {
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}
#: the RMS norms' epsilon before each residual block of a thick ``swiglu`` expert
RMS_EPS: Final = 1e-5


class FeedForwardExpert(nn.Module):
    """x + W2 act(W1 LayerNorm(x)), on [batch, hidden]."""

    def __init__(self, spec: ExpertSpec) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(spec.hidden)
        self.fc1 = nn.Linear(spec.hidden, spec.inner_dim)
        self.act = ACTIVATIONS[spec.activation]()
        self.fc2 = nn.Linear(spec.inner_dim, spec.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(self.act(self.fc1(self.norm(x))))
        return out


class SwiGLUExpert(nn.Module):
    """``w2(act(w1 x) * w3 x)`` on [batch, hidden]: no bias, no norm, no residual (the
    trainer's layer normalizes before and adds the residual after), with ``act`` silu
    for SwiGLU. One expert of a Mixtral-style sparse block, its parameters named as the
    family names them (``w1`` the gate, ``w3`` the up and ``w2`` the down projection, as
    ``nn.Linear`` weights [out, in]), so that an exported checkpoint maps them one to
    one: ``block_sparse_moe.experts.<e>.w1.weight`` and so on (core/families/export.py).
    Plain torch: a volunteer's node never needs the family's library."""

    def __init__(self, spec: ExpertSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.inner_dim, bias=False)
        self.w2 = nn.Linear(spec.inner_dim, spec.hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, spec.inner_dim, bias=False)
        self.act = ACTIVATIONS[spec.activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(self.act(self.w1(x)) * self.w3(x))
        return out


class ResidualSwiGLU(SwiGLUExpert):
    """``w2(act(w1 n) * w3 n)`` of ``n = RMSNorm(h)``: a block after the first of a thick
    ``swiglu`` expert, whose output is added to the expert's stream ``h``."""

    def __init__(self, spec: ExpertSpec) -> None:
        super().__init__(spec)
        self.norm = nn.RMSNorm(spec.hidden, eps=RMS_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.norm(x))


def _scale_outputs(projections: list[nn.Linear], blocks: int) -> None:
    """The output projections of a thick expert's blocks scaled by 1/sqrt(blocks) at init:
    the blocks' outputs add up, and the variance of a sum of ``blocks`` roughly
    independent outputs grows with their count; scaled, a thick expert starts with about
    the output of a one-block expert (the trainer's stream sees no jump with ``blocks``)
    and its own stream grows by no more than that across its blocks."""
    scale = blocks**-0.5
    with torch.no_grad():
        for proj in projections:
            proj.weight.mul_(scale)
            if proj.bias is not None:
                proj.bias.mul_(scale)


class ThickFeedForwardExpert(nn.Module):
    """``spec.blocks`` ``FeedForwardExpert`` blocks in sequence (each residual, with its own
    LayerNorm), named ``blocks.<i>.norm``, ``blocks.<i>.fc1`` ...; every block's fc2
    starts scaled by 1/sqrt(blocks) (``_scale_outputs``)."""

    def __init__(self, spec: ExpertSpec) -> None:
        super().__init__()
        blocks = [FeedForwardExpert(spec) for _ in range(spec.blocks)]
        _scale_outputs([block.fc2 for block in blocks], spec.blocks)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class ThickSwiGLUExpert(nn.Module):
    """``spec.blocks`` SwiGLU blocks, taking the place of one (no residual around it: the
    trainer's layer adds it). Block 0 is ``SwiGLUExpert`` on the input ``x`` (normed by
    the trainer); block ``i`` > 0 is ``ResidualSwiGLU`` on ``h = x + o``, ``o`` the sum of
    the outputs so far. The expert returns that sum, ``h_N - x``: the residual stream's
    change over its blocks. Named ``blocks.0.w1`` ..., ``blocks.<i>.norm`` for i > 0;
    every block's w2 starts scaled by 1/sqrt(blocks) (``_scale_outputs``)."""

    def __init__(self, spec: ExpertSpec) -> None:
        super().__init__()
        blocks = [SwiGLUExpert(spec)] + [ResidualSwiGLU(spec) for _ in range(spec.blocks - 1)]
        _scale_outputs([block.w2 for block in blocks], spec.blocks)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the sum of outputs kept on its own, not h_N - x: no cancellation in 16 bits
        out: torch.Tensor = self.blocks[0](x)
        for block in self.blocks[1:]:
            out = out + block(x + out)
        return out


def _feed_forward(spec: ExpertSpec) -> nn.Module:
    return FeedForwardExpert(spec) if spec.blocks == 1 else ThickFeedForwardExpert(spec)


def _swiglu(spec: ExpertSpec) -> nn.Module:
    return SwiGLUExpert(spec) if spec.blocks == 1 else ThickSwiGLUExpert(spec)


@dataclass(frozen=True)
class ExpertType:
    build: Callable[[ExpertSpec], nn.Module]


#: one for each of core/experts/spec.py's EXPERT_KINDS; one block builds each kind's
#: plain module (its parameter names and initial weights for a seed are those of every
#: project published before ``blocks`` existed)
EXPERT_TYPES: Final[Mapping[str, ExpertType]] = {
    "ffn": ExpertType(_feed_forward),
    "swiglu": ExpertType(_swiglu),
}


def build_expert(spec: ExpertSpec, *, seed: int | None = None) -> nn.Module:
    """A fresh expert of ``spec``; with ``seed``, its initial weights are deterministic."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = EXPERT_TYPES[spec.kind].build(spec)
    else:
        module = EXPERT_TYPES[spec.kind].build(spec)
    return module.to(spec.torch_dtype)


def parameter_count(spec: ExpertSpec) -> int:
    """Parameters of one expert of ``spec`` (built on the meta device: no memory used)."""
    with torch.device("meta"):
        module = build_expert(spec)
    return sum(p.numel() for p in module.parameters())
