"""Expert module types built into the program, configured by data only.

Nothing that runs is ever received from the network: a peer receives an ``ExpertSpec``
(plain fields, validated here) and builds one of the types below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

import torch
from torch import nn

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
MAX_HIDDEN: Final = 65536
#: the most blocks one expert may stack (``ExpertSpec.blocks``)
MAX_BLOCKS: Final = 64
#: the RMS norms' epsilon before each residual block of a thick ``swiglu`` expert
RMS_EPS: Final = 1e-5


class SpecError(ValueError):
    """An expert spec is invalid; the message names the field."""


@dataclass(frozen=True)
class ExpertSpec:
    kind: str  # a key of EXPERT_TYPES
    hidden: int
    inner: int = 0  # feed-forward width; 0 means 4 * hidden
    heads: int = 0  # reserved: must be 0 (kept so the wire dict and positional calls hold)
    activation: str = "gelu"  # swiglu: the gate's (silu makes it SwiGLU)
    dtype: str = "float32"
    #: blocks stacked in one expert (a thick expert): compute per byte on the wire grows
    #: with it; 1 is the plain expert of each kind, the only one Mixtral export takes
    blocks: int = 1

    def __post_init__(self) -> None:
        # isinstance first: a list or map from a peer is unhashable, `in` would raise
        for name in ("kind", "activation", "dtype"):
            if not isinstance(getattr(self, name), str):
                raise SpecError(
                    f"{name}: must be a string, got {type(getattr(self, name)).__name__}"
                )
        for name in ("hidden", "inner", "heads", "blocks"):
            if isinstance(getattr(self, name), bool):
                raise SpecError(f"{name}: must be an integer, got a boolean")
        if self.kind not in EXPERT_TYPES:
            raise SpecError(f"kind: {self.kind!r} is not one of {sorted(EXPERT_TYPES)}")
        if not isinstance(self.hidden, int) or not 1 <= self.hidden <= MAX_HIDDEN:
            raise SpecError(f"hidden: must be an integer in 1..{MAX_HIDDEN}, got {self.hidden!r}")
        if not isinstance(self.inner, int) or not 0 <= self.inner <= 8 * MAX_HIDDEN:
            raise SpecError(f"inner: must be an integer in 0..{8 * MAX_HIDDEN}, got {self.inner!r}")
        if self.activation not in ACTIVATIONS:
            raise SpecError(f"activation: {self.activation!r} is not one of {sorted(ACTIVATIONS)}")
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype: {self.dtype!r} is not one of {sorted(DTYPES)}")
        if not isinstance(self.heads, int) or self.heads != 0:
            raise SpecError(f"heads: reserved, must be 0, got {self.heads!r}")
        if not isinstance(self.blocks, int) or not 1 <= self.blocks <= MAX_BLOCKS:
            raise SpecError(f"blocks: must be an integer in 1..{MAX_BLOCKS}, got {self.blocks!r}")

    @property
    def inner_dim(self) -> int:
        return self.inner or 4 * self.hidden

    @property
    def input_ndim(self) -> int:
        """Dimensions of one batch: every built-in kind takes [batch, hidden]."""
        return 2

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def kept_widths(self) -> float:
        """What autograd keeps of one forward pass for the backward, roughly, in widths of
        the input per row (``hidden`` values of the input's dtype each; the kept-graph
        cache's estimate, core/experts/backend.py), so that it never undercounts.

        ffn, per block: the block's input, the norm's output and statistics (about 3 x
        hidden; the last block's output counted once more, as the cache holds it) and
        fc1's output, the activation's input and output (3 x inner).
        swiglu: the input and output (2 x hidden) and per block w1 h, w3 h, act(w1 h) and
        their product (4 x inner); each residual block after the first also the RMS
        norm's input and normalized input (2 x hidden, in float32: torch's norm computes
        a 16-bit input in float32), its statistic (one float32 per row) and its output
        (1 x hidden)."""
        ratio = self.inner_dim / self.hidden
        if self.kind == "swiglu":
            f32 = 4 / self.torch_dtype.itemsize  # one float32 in values of the input's dtype
            residual = 1 + 2 * f32 + f32 / self.hidden
            return 2 + residual * (self.blocks - 1) + 4 * ratio * self.blocks
        return 1 + (3 + 3 * ratio) * self.blocks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExpertSpec:
        if not isinstance(data, Mapping):
            raise SpecError("an expert spec must be a table of fields")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpecError(f"{sorted(unknown)[0]}: unknown field of an expert spec")
        if "kind" not in data or "hidden" not in data:
            raise SpecError("kind and hidden: both are required")
        return cls(**data)  # no ``blocks`` (a peer's older dict): one block


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


#: one block builds each kind's plain module (its parameter names and initial weights for
#: a seed are those of every project published before ``blocks`` existed)
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
