"""What an expert is, as data: the ``ExpertSpec`` a manifest states and a peer receives
(plain fields, validated here), and the names it may use. No torch: the manifest, and
the light commands that read one (``owner status``, ``owner page``, ``moehome credit``),
import this without it; core/experts/registry.py builds the modules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch

#: the kinds core/experts/registry.py builds
EXPERT_KINDS: Final = ("ffn", "swiglu")
#: the dtypes an expert may hold, with their bytes per value
DTYPE_BYTES: Final[Mapping[str, int]] = {"float32": 4, "float16": 2, "bfloat16": 2}
#: the activations registry.ACTIVATIONS builds
ACTIVATION_NAMES: Final = ("gelu", "relu", "silu")
MAX_HIDDEN: Final = 65536
#: the most blocks one expert may stack (``ExpertSpec.blocks``)
MAX_BLOCKS: Final = 64


class SpecError(ValueError):
    """An expert spec is invalid; the message names the field."""


@dataclass(frozen=True)
class ExpertSpec:
    kind: str  # one of EXPERT_KINDS
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
        if self.kind not in EXPERT_KINDS:
            raise SpecError(f"kind: {self.kind!r} is not one of {sorted(EXPERT_KINDS)}")
        if not isinstance(self.hidden, int) or not 1 <= self.hidden <= MAX_HIDDEN:
            raise SpecError(f"hidden: must be an integer in 1..{MAX_HIDDEN}, got {self.hidden!r}")
        if not isinstance(self.inner, int) or not 0 <= self.inner <= 8 * MAX_HIDDEN:
            raise SpecError(f"inner: must be an integer in 0..{8 * MAX_HIDDEN}, got {self.inner!r}")
        if self.activation not in ACTIVATION_NAMES:
            raise SpecError(
                f"activation: {self.activation!r} is not one of {sorted(ACTIVATION_NAMES)}"
            )
        if self.dtype not in DTYPE_BYTES:
            raise SpecError(f"dtype: {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
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
        # imported here: this module is the manifest's, which the light commands (owner
        # status, credit) read without torch; whoever asks for a torch dtype has torch
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

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
            f32 = 4 / DTYPE_BYTES[self.dtype]  # one float32 in values of the input's dtype
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


def seed_for(seed: int, uid: str) -> int:
    """The initial-weights seed of one expert (a project's ``[weights] seed`` and the
    expert's uid): stable, and distinct per uid. Here, without torch or the network:
    the publisher, the trainer and the model's family all start experts from it."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{uid}".encode()).digest()[:4], "big")
