"""Atomic, numbered checkpoints (msgpack state + safetensors tensors) and optimizer state
kept as tensors: what the aggregator and the trainer save to survive a restart. Only our
own files are read back, and never with pickle."""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from net.codec import pack, unpack_bounded


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Numbered checkpoints, each complete before CURRENT points at it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def latest(self) -> tuple[int, dict[str, Any], dict[str, torch.Tensor]] | None:
        current = self.root / "CURRENT"
        if not current.exists():
            return None
        name = current.read_text().strip()
        folder = self.root / name
        state = unpack_bounded((folder / "state.msgpack").read_bytes(), 1 << 30)
        tensors = load_file(str(folder / "tensors.safetensors"))
        return int(name.split("-")[1]), state, tensors

    def save(self, number: int, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        name = f"ckpt-{number:06d}"
        tmp = self.root / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with open(tmp / "state.msgpack", "wb") as f:
            f.write(pack(state))
            f.flush()
            os.fsync(f.fileno())
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
        with open(tmp / "tensors.safetensors", "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / name)
        fsync_dir(self.root)
        pointer = self.root / "CURRENT.tmp"
        with open(pointer, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer, self.root / "CURRENT")
        fsync_dir(self.root)
        for old in self.root.glob("ckpt-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)


def make_optimizer(
    name: str, module: nn.Module, lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """``weight_decay`` is torch's: adamw's is decoupled (the weights shrink by ``lr x
    weight_decay`` of themselves each step, apart from the adaptive step); adam's and
    sgd's is an L2 term (``weight_decay x weight``) added to the gradient, so adam
    scales it by its running second moments like the rest of the gradient."""
    params = list(module.parameters())
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def optimizer_state(
    opt: torch.optim.Optimizer, prefix: str, tensors: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """Optimizer state as tensors (into ``tensors``) and plain values (returned)."""
    sd = opt.state_dict()
    scalars: dict[str, Any] = {}
    for idx, slots in sd["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}/{idx}/{key}"] = value.detach().cpu()
            else:
                scalars[f"{idx}/{key}"] = value
    return {"scalars": scalars}


def load_optimizer_state(
    opt: torch.optim.Optimizer, meta: dict[str, Any], prefix: str, tensors: dict[str, torch.Tensor]
) -> None:
    state: dict[int, dict[str, Any]] = defaultdict(dict)
    for tensor_name, value in tensors.items():
        if tensor_name.startswith(prefix + "/"):
            idx, key = tensor_name[len(prefix) + 1 :].split("/", 1)
            state[int(idx)][key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split("/", 1)
        state[int(idx)][key] = value
    sd = opt.state_dict()
    sd["state"] = dict(state)
    opt.load_state_dict(sd)
