"""How expert inputs, outputs and their gradients travel: activation codecs.

A trainer sends every token it routes to an expert, and gets as much back, in both
passes: with float32 a [1024 x 1024] batch is 4 MiB each way, 1.7 s on a 20 Mbit/s home
uplink. A codec turns such a tensor into parts (plain tensors that travel as raw bytes,
nothing pickled) and back:

- ``raw``: the tensor as it is (the expert's own dtype): what every request was before
  codecs, and what a request without a ``codecs`` field still means;
- ``f16``, ``bf16``: 16-bit floats (1/2). f16 keeps more digits and saturates at 65504;
  bf16 keeps float32's range (activation gradients are often below f16's smallest
  normal number, 6e-5);
- ``q8``, ``q4``, ``q3``: blockwise absmax quantization along the last dimension: blocks of
  64 values share one bfloat16 scale (the block's largest magnitude over the top level),
  every value is rounded to one of 2^bits - 1 levels symmetric around zero, and the codes
  are packed 8 values into ``bits`` bytes. Bytes per value: 1.03, 0.53, 0.41 (1/3.9,
  1/7.5, 1/9.8 of float32);
- ``q4z``: q4's codes deflated (zlib): the levels of a bell-shaped block are far from
  equally likely, so they take ~3.55 bits instead of 4 (with the scales ~0.12 of
  float32, depending on the values), q4's accuracy.

Encoding is deterministic: the same tensor always gives the same parts, so a trainer
can compute what a server saw (``roundtrip``) and sign receipts over it.

Decoding trusts nothing: the number of parts, their dtypes and shapes follow from the
codec and the width the receiver expects, and are checked before anything is computed;
scales must be finite and non-negative.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Final

import torch

from core.experts.codec_names import (
    ACTIVATION_CODECS,
    ActivationCodec,
    ActivationCodecError,
    WireCodecs,
    check_codec,
)
from core.experts.wire import from_wire, to_wire
from net import Tensor

__all__ = [
    "ACTIVATION_CODECS",
    "BLOCK",
    "ActivationCodec",
    "ActivationCodecError",
    "WireCodecs",
    "bits_of",
    "check_codec",
    "decode",
    "encode",
    "packed_width",
    "parts_per_tensor",
    "roundtrip",
    "wire_bytes",
]


#: values sharing one scale (along the last dimension)
BLOCK: Final = 64
#: values packed together: 8 codes of ``bits`` bits fill ``bits`` bytes exactly
_GROUP: Final = 8
_BITS: Final[dict[str, int]] = {"q8": 8, "q4": 4, "q3": 3, "q4z": 4}
#: zlib's level for q4z: codes of bell-shaped blocks deflate from 4 to ~3.55 bits
_DEFLATE_LEVEL: Final = 6
_FP16_MAX: Final = 65504.0


def bits_of(name: str) -> int:
    """Bits per value of a quantized codec (KeyError for the float codecs)."""
    return _BITS[name]


def parts_per_tensor(name: str) -> int:
    return 2 if name in _BITS else 1


def encode(t: torch.Tensor, name: str, *, stochastic: bool = False) -> list[Tensor]:
    """``t`` [*rows, width] as the codec's parts, ready for the wire. ``stochastic``
    (quantized codecs): round up or down at random, in proportion to the distance, so
    that the decoded value is right on average (for gradients: what is summed over many
    tokens must not be biased); otherwise to the nearest level, deterministically."""
    check_codec(name)
    t = t.detach()
    if name == "raw":
        return [to_wire(t)]
    if name == "f16":
        return [to_wire(t.float().clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16))]
    if name == "bf16":
        return [to_wire(t.to(torch.bfloat16))]
    if t.dim() < 1 or t.shape[-1] < 1:
        raise ActivationCodecError("a quantized tensor needs a last dimension of at least 1")
    codes, scales = _quantize(t, _BITS[name], stochastic)
    if name == "q4z":
        # scales first: a receiver reads the rows from the first part's shape
        packed = zlib.compress(codes.numpy().tobytes(), _DEFLATE_LEVEL)
        return [to_wire(scales), Tensor("uint8", (len(packed),), packed)]
    return [to_wire(codes), to_wire(scales)]


def decode(parts: Sequence[Tensor], name: str, *, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The tensor the parts of one ``encode`` stand for: as ``dtype`` (``raw``: as it
    came). A quantized tensor's last dimension is ``width`` (what the receiver expects:
    the expert's hidden size); the parts must fit it."""
    check_codec(name)
    if len(parts) != parts_per_tensor(name):
        raise ActivationCodecError(
            f"{name} sends {parts_per_tensor(name)} part(s) per tensor, got {len(parts)}"
        )
    if name in ("raw", "f16", "bf16"):
        (part,) = parts
        want = {"f16": "float16", "bf16": "bfloat16"}.get(name)
        if want is not None and part.dtype != want:
            raise ActivationCodecError(f"{name} parts are {want}, got {part.dtype}")
        # the shape travels as it is: the receiver checks it as it would any tensor
        t = from_wire(part)
        return t if name == "raw" else t.to(dtype)
    bits = _BITS[name]
    codes, scales = _inflated(parts, width) if name == "q4z" else parts
    if codes.dtype != "uint8" or scales.dtype != "bfloat16":
        raise ActivationCodecError(f"{name} parts are uint8 codes and bfloat16 scales")
    rows = codes.shape[:-1]
    if (
        not codes.shape
        or codes.shape[-1] != packed_width(width, bits)
        or scales.shape != (*rows, math.ceil(width / BLOCK))
    ):
        raise ActivationCodecError(
            f"{name} parts of a width-{width} tensor: codes {list(codes.shape)}, "
            f"scales {list(scales.shape)} do not fit"
        )
    s = from_wire(scales).float()
    if not (torch.isfinite(s).all() and (s >= 0).all()):
        raise ActivationCodecError("scales must be finite and non-negative")
    return _dequantize(from_wire(codes), s, bits, width).to(dtype)


def _inflated(parts: Sequence[Tensor], width: int) -> tuple[Tensor, Tensor]:
    """q4z's (scales, deflated codes) -> q4's (codes, scales). The codes' size follows
    from the scales' rows and ``width``; inflating stops there (a deflate bomb costs
    nothing), and anything short of it, beyond it or after the stream's end is refused."""
    scales, deflated = parts
    if scales.dtype != "bfloat16" or not scales.shape or deflated.dtype != "uint8":
        raise ActivationCodecError("q4z parts are bfloat16 scales and uint8 deflated codes")
    rows = scales.shape[:-1]
    expected = math.prod(rows) * packed_width(width, 4)
    inflater = zlib.decompressobj()
    try:
        codes = inflater.decompress(bytes(deflated.data), expected)
    except zlib.error as exc:
        raise ActivationCodecError(f"q4z codes do not inflate: {exc}") from exc
    if (
        len(codes) != expected
        or not inflater.eof
        or inflater.unconsumed_tail
        or inflater.unused_data
    ):
        raise ActivationCodecError(
            f"q4z codes of a width-{width} tensor of {math.prod(rows)} rows are {expected} "
            "bytes; these are not"
        )
    return Tensor("uint8", (*rows, packed_width(width, 4)), codes), scales


def roundtrip(t: torch.Tensor, name: str, *, stochastic: bool = False) -> torch.Tensor:
    """What a receiver of ``encode(t, name)`` decodes, in ``t``'s dtype."""
    if name == "raw":
        return t.detach()
    parts = encode(t, name, stochastic=stochastic)
    return decode(parts, name, width=t.shape[-1], dtype=t.dtype)


def packed_width(width: int, bits: int) -> int:
    return math.ceil(width / _GROUP) * bits


def wire_bytes(parts: Sequence[Tensor]) -> int:
    return sum(p.nbytes for p in parts)


# ---------------------------------------------------------------- quantization


def _quantize(t: torch.Tensor, bits: int, stochastic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = t.shape[-1]
    rows = t.shape[:-1]
    levels = (1 << (bits - 1)) - 1  # q4: -7..7 around zero
    nblocks = math.ceil(width / BLOCK)
    flat = t.float().reshape(-1, width)
    blocks = torch.nn.functional.pad(flat, (0, nblocks * BLOCK - width)).view(-1, nblocks, BLOCK)
    # the scale that travels (bfloat16) is the one quantized with, so that the receiver
    # multiplies back by exactly what was divided by
    scales = (blocks.abs().amax(dim=-1) / levels).to(torch.bfloat16)
    divisor = scales.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    scaled = blocks / divisor
    # at random: up with a probability of the distance to the level below (unbiased)
    scaled = scaled.add_(torch.rand_like(scaled)).floor_() if stochastic else scaled.round_()
    codes = scaled.clamp_(-levels, levels).add_(levels)
    codes = codes.view(flat.shape[0], nblocks * BLOCK)[:, : packed_width(width, 8)]
    packed = _pack(codes.to(torch.int64), bits)
    return packed.view(*rows, packed_width(width, bits)), scales.view(*rows, nblocks)


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    levels = (1 << (bits - 1)) - 1
    rows = codes.shape[:-1]
    n, nblocks = math.prod(rows), scales.shape[-1]
    values = _unpack(codes.reshape(n, codes.shape[-1]), bits).float().sub_(levels)
    values = torch.nn.functional.pad(values, (0, nblocks * BLOCK - values.shape[-1]))
    out = values.view(n, nblocks, BLOCK) * scales.reshape(n, nblocks, 1)
    return out.view(n, nblocks * BLOCK)[:, :width].reshape(*rows, width)


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, 8g] codes of ``bits`` bits -> [n, g * bits] bytes (little-endian per group)."""
    if bits == 8:
        return codes.to(torch.uint8)
    groups = codes.view(codes.shape[0], codes.shape[1] // _GROUP, _GROUP)
    shifts = torch.arange(_GROUP, dtype=torch.int64) * bits
    words = (groups << shifts).sum(dim=-1, keepdim=True)  # at most 32 bits: no overflow
    byte_shifts = torch.arange(bits, dtype=torch.int64) * 8
    return (
        ((words >> byte_shifts) & 0xFF).to(torch.uint8).view(codes.shape[0], groups.shape[1] * bits)
    )


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return packed.to(torch.int64)
    groups = packed.to(torch.int64).view(packed.shape[0], packed.shape[1] // bits, bits)
    byte_shifts = torch.arange(bits, dtype=torch.int64) * 8
    words = (groups << byte_shifts).sum(dim=-1, keepdim=True)
    shifts = torch.arange(_GROUP, dtype=torch.int64) * bits
    return ((words >> shifts) & ((1 << bits) - 1)).view(packed.shape[0], groups.shape[1] * _GROUP)
