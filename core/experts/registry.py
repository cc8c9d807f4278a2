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

    def __post_init__(self) -> None:
        # isinstance first: a list or map from a peer is unhashable, `in` would raise
        for name in ("kind", "activation", "dtype"):
            if not isinstance(getattr(self, name), str):
                raise SpecError(
                    f"{name}: must be a string, got {type(getattr(self, name)).__name__}"
                )
        for name in ("hidden", "inner", "heads"):
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
        return cls(**data)


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


@dataclass(frozen=True)
class ExpertType:
    build: Callable[[ExpertSpec], nn.Module]


EXPERT_TYPES: Final[Mapping[str, ExpertType]] = {
    "ffn": ExpertType(FeedForwardExpert),
    "swiglu": ExpertType(SwiGLUExpert),
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
