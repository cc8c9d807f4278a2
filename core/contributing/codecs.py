"""Gradient codecs for contributions: fp32, fp16 and 8-bit blockwise, with error feedback
kept on the volunteer (what a codec drops this time is added to the next gradient).

A codec turns one tensor into parts (plain tensors that travel as raw bytes) and back.
Decoding checks every part's dtype and size against the declared shape first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import torch

BLOCK: Final = 1024
_FP16_MAX: Final = 65504.0


class CodecError(ValueError):
    pass


class Codec(Protocol):
    name: str

    def encode(self, t: torch.Tensor) -> list[torch.Tensor]: ...

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor: ...

    def encoded_bytes(self, numel: int) -> int:
        """Bytes of the parts of a tensor of ``numel`` values (known before any arrive)."""
        ...

    def rounding_bound(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        """Per value, the most encoding can have moved a value that decodes as ``parts``
        do (half a step of the value's grid): what an audit allows for the codec, and
        what bounds the residual error feedback carries to the next gradient."""
        ...


def _expect(parts: Sequence[torch.Tensor], specs: list[tuple[torch.dtype, int]]) -> None:
    if len(parts) != len(specs):
        raise CodecError(f"expected {len(specs)} parts, got {len(parts)}")
    for part, (dtype, numel) in zip(parts, specs, strict=True):
        if part.dtype != dtype or part.numel() != numel:
            raise CodecError(f"part {part.dtype}[{part.numel()}] should be {dtype}[{numel}]")


class Float32Codec:
    name = "fp32"

    def encode(self, t: torch.Tensor) -> list[torch.Tensor]:
        return [t.detach().reshape(-1).to(torch.float32).contiguous()]

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        _expect(parts, [(torch.float32, numel)])
        return parts[0].reshape(-1)

    def encoded_bytes(self, numel: int) -> int:
        return 4 * numel

    def rounding_bound(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        _expect(parts, [(torch.float32, numel)])
        return torch.zeros(numel)


class Float16Codec:
    name = "fp16"

    def encode(self, t: torch.Tensor) -> list[torch.Tensor]:
        flat = t.detach().reshape(-1).to(torch.float32).clamp(-_FP16_MAX, _FP16_MAX)
        return [flat.to(torch.float16).contiguous()]

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        _expect(parts, [(torch.float16, numel)])
        return parts[0].reshape(-1).to(torch.float32)

    def encoded_bytes(self, numel: int) -> int:
        return 2 * numel

    def rounding_bound(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        # half the spacing above the decoded value's magnitude: a value rounded to it came
        # from within half the spacing below (<= the spacing above) or above it
        decoded = self.decode(parts, numel).abs().clamp_min(2.0**-14)
        _, exponent = torch.frexp(decoded)  # decoded = m x 2^exponent, m in [0.5, 1)
        return torch.ldexp(torch.full_like(decoded, 2.0**-12), exponent)  # 2^(exponent-11) / 2


class Int8BlockwiseCodec:
    """Blocks of 1024 values: int8 codes and one float32 scale (the block's absmax/127)."""

    name = "int8_block"

    def encode(self, t: torch.Tensor) -> list[torch.Tensor]:
        flat = t.detach().reshape(-1).to(torch.float32)
        pad = (-flat.numel()) % BLOCK
        blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
        scales = blocks.abs().amax(dim=1).clamp_min(1e-30) / 127.0
        codes = torch.round(blocks / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return [codes.reshape(-1)[: flat.numel()].contiguous(), scales.contiguous()]

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        nblocks = -(-numel // BLOCK)
        _expect(parts, [(torch.int8, numel), (torch.float32, nblocks)])
        codes, scales = parts
        pad = nblocks * BLOCK - numel
        blocks = torch.nn.functional.pad(codes.to(torch.float32), (0, pad)).reshape(-1, BLOCK)
        return (blocks * scales[:, None]).reshape(-1)[:numel]

    def encoded_bytes(self, numel: int) -> int:
        return numel + 4 * -(-numel // BLOCK)

    def rounding_bound(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        # the step taken from the block's largest code, not its scale alone: an honest
        # block's largest magnitude is the top code (127), so a scale inflated above
        # what the values need buys no room (its codes come out small)
        nblocks = -(-numel // BLOCK)
        _expect(parts, [(torch.int8, numel), (torch.float32, nblocks)])
        codes, scales = parts
        pad = nblocks * BLOCK - numel
        top = torch.nn.functional.pad(codes.to(torch.float32).abs(), (0, pad))
        top = top.reshape(-1, BLOCK).amax(dim=1)
        return (top * scales.abs() / (2 * 127.0)).repeat_interleave(BLOCK)[:numel]


CODECS: Final[dict[str, Codec]] = {
    c.name: c for c in (Float32Codec(), Float16Codec(), Int8BlockwiseCodec())
}


def codec(name: str) -> Codec:
    try:
        return CODECS[name]
    except KeyError:
        raise CodecError(f"unknown codec {name!r}; known: {sorted(CODECS)}") from None


@dataclass
class ErrorFeedback:
    """Per-parameter residuals: what compression lost, to be sent with the next gradient."""

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)

    def compress(self, name: str, grad: torch.Tensor, chosen: Codec) -> list[torch.Tensor]:
        flat = grad.detach().reshape(-1).to(torch.float32)
        residual = self.residuals.get(name)
        target = flat + residual if residual is not None else flat
        parts = chosen.encode(target)
        self.residuals[name] = target - chosen.decode(parts, target.numel())
        return parts
