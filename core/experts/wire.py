"""torch tensors <-> net.Tensor (raw bytes with dtype and shape). Nothing is unpickled."""

from __future__ import annotations

import warnings
from typing import Final

import torch

from net import Tensor

TORCH_BY_NAME: Final = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
NAME_BY_TORCH: Final = {v: k for k, v in TORCH_BY_NAME.items()}


def to_wire(t: torch.Tensor) -> Tensor:
    """The tensor's bytes (little-endian, C order) with its dtype and shape."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    name = NAME_BY_TORCH.get(t.dtype)
    if name is None:
        raise TypeError(f"cannot send a {t.dtype} tensor")
    if not t.numel():
        return Tensor(name, tuple(t.shape), b"")
    data = memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # no copy
    return Tensor(name, tuple(t.shape), data)


def from_wire(w: Tensor) -> torch.Tensor:
    """A CPU tensor over the received bytes (no copy when the buffer is writable)."""
    dtype = TORCH_BY_NAME[w.dtype]
    if w.nbytes == 0:
        return torch.empty(w.shape, dtype=dtype)
    buf = w.data if isinstance(w.data, bytearray) else bytearray(w.data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer's note about shared memory
        flat = torch.frombuffer(buf, dtype=torch.uint8)
    return flat.view(dtype).reshape(w.shape)
