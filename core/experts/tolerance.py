"""How far an honest answer may land from an auditor's recomputation of it.

An auditor recomputes an expert's answer (its outputs, or its input gradients) from the
weights of the version the answer names and the inputs the server decoded. An honest
server's answer differs from that recomputation for two reasons only, each bounded here:

- **Compute**: the same function in the same dtype on another device, kernel, thread
  count or batch size rounds differently. The bound is relative to the value and to its
  row's scale (a sum of many terms that cancels to ~0 keeps the rounding of its terms):
  ``COMPUTE_RTOL[dtype] * (|expected| + rms(row))``; measured honest differences sit 3-4
  orders of magnitude below it for float32 (benchmarks/audit.py).
- **Codec**: the answer travelled in the project's activation codec
  (core/experts/activations.py), which servers apply with deterministic rounding. A
  16-bit float is within half a unit in the last place; a blockwise quantized value is
  within half a quantization step of the block, and the block's largest magnitude
  travels almost exactly (its code is the top level, its scale a bfloat16 of
  absmax/levels), which pins the block's scale: a scaled answer shows there even when
  every value moved by less than a step.

:func:`excess` is the worst ratio of difference to bound over every value and block: at
most 1 for any honest answer, whatever its rounding; above 1 is evidence that the answer
was not computed by the named weights on the named inputs. These are bounds, not
statistics: no honest answer is ever over them, however many are audited, as long as
the compute bound holds for the hardware in use (why it holds: docs/decisions/010).
"""

from __future__ import annotations

import copy
import math
from typing import Final

import numpy as np
import torch
from torch import nn

from core.experts import activations

#: an honest computation's difference from the auditor's, relative to the value plus its
#: row's root mean square, per expert dtype (float32: ~4000 units in the last place)
COMPUTE_RTOL: Final[dict[torch.dtype, float]] = {
    torch.float32: 2.0**-12,
    torch.float16: 2.0**-6,
    torch.bfloat16: 2.0**-4,
}
#: the relative rounding of 16-bit floats (half a unit in the last place), and of the
#: bfloat16 scales of quantized blocks, with a factor 2 of margin
_F16_RELATIVE: Final = 2.0**-10
_BF16_RELATIVE: Final = 2.0**-7
#: the smallest magnitudes the 16-bit codecs round to (below: flushed or subnormal)
_F16_ABSOLUTE: Final = 2.0**-24
_BF16_ABSOLUTE: Final = 2.0**-126


def in_float32(module: nn.Module) -> nn.Module:
    """``module`` computing in float32: an auditor's reference for an expert held in a
    16-bit dtype is the exact value of what its weights compute on its inputs (its own
    16-bit rounding would add to the server's, and a CPU's 16-bit matrix products are
    slow). ``module`` itself when it is float32 already; else a copy."""
    if all(p.dtype == torch.float32 for p in module.parameters()):
        return module
    return copy.deepcopy(module).float()


def compute_bound(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per value: how far an honest computation in ``dtype`` may land from ``expected``."""
    e = expected.detach().float().cpu().numpy()
    return torch.from_numpy(_compute_bound(e, COMPUTE_RTOL[dtype]))


def _compute_bound(e: np.ndarray, rtol: float) -> np.ndarray:
    rms = np.sqrt(np.mean(np.square(e), axis=-1, keepdims=True))
    out: np.ndarray = (np.abs(e) + rms) * np.float32(rtol)
    return out


def excess(claimed: torch.Tensor, expected: torch.Tensor, codec: str, dtype: torch.dtype) -> float:
    """The worst ratio of ``|claimed - expected|`` to what an honest answer may differ by,
    over every value (and, for quantized codecs, every block's largest magnitude):
    ``<= 1`` for an honest answer sent in ``codec`` by an expert computing in ``dtype``.
    ``claimed``: the answer as the auditor decoded it; ``expected``: its recomputation.
    Infinite when the shapes differ or the claim is not finite."""
    activations.check_codec(codec)
    if claimed.shape != expected.shape:
        return math.inf
    if expected.numel() == 0:
        return 0.0
    # float32 is enough: its rounding (6e-8 relative) is far below every bound. numpy:
    # these are a few dozen small operations, each several times cheaper than torch's
    y = claimed.detach().float().cpu().numpy()
    e = expected.detach().float().cpu().numpy()
    if not np.isfinite(y).all():
        return math.inf
    slack = _compute_bound(e, COMPUTE_RTOL[dtype])
    if codec in ("raw", "f16", "bf16"):
        if codec == "f16":
            e = np.clip(e, -65504.0, 65504.0)  # the codec saturates there
        relative, floor = {
            "raw": (0.0, 0.0),
            "f16": (_F16_RELATIVE, _F16_ABSOLUTE),
            "bf16": (_BF16_RELATIVE, _BF16_ABSOLUTE),
        }[codec]
        bound = slack + relative * (np.abs(e) + slack) + floor
        return _worst(y - e, bound)
    return _quantized_excess(y, e, slack, codec)


def _quantized_excess(y: np.ndarray, e: np.ndarray, slack: np.ndarray, codec: str) -> float:
    levels = (1 << (activations.bits_of(codec) - 1)) - 1
    yb, eb, sb = (_blocks(t) for t in (y, e, slack))
    # an honest server quantized a value within ``slack`` of ours: its block's largest
    # magnitude is within the block's largest slack of our block's
    top = np.abs(eb).max(axis=-1)
    top_slack = sb.max(axis=-1)
    step = (top + top_slack) * np.float32((1 + _BF16_RELATIVE) / levels)
    # every value: within half a step (rounding to the nearest level) plus the compute
    values = _worst(yb - eb, step[..., None] / 2 + sb + _BF16_ABSOLUTE)
    # every block's largest magnitude: the top level times a bfloat16 scale
    tops = _worst(np.abs(yb).max(axis=-1) - top, _BF16_RELATIVE * (top + top_slack) + top_slack)
    return max(values, tops)


def _blocks(t: np.ndarray) -> np.ndarray:
    """[*, width] -> [rows, blocks, BLOCK], zero-padded like the codec's blocks."""
    width = t.shape[-1]
    nblocks = math.ceil(width / activations.BLOCK)
    flat = t.reshape(-1, width)
    if width % activations.BLOCK:
        flat = np.pad(flat, ((0, 0), (0, nblocks * activations.BLOCK - width)))
    return flat.reshape(flat.shape[0], nblocks, activations.BLOCK)


def _worst(difference: np.ndarray, bound: np.ndarray) -> float:
    # a bound of 0 (an all-zero row of a raw answer) allows exactly 0
    return float(np.max(np.abs(difference) / np.maximum(bound, np.float32(1e-38))))
