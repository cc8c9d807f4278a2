"""Expert weights on disk (safetensors: no pickle) and their content hash."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save
from torch import nn


class WeightsError(ValueError):
    pass


@dataclass(frozen=True)
class WeightsInfo:
    version: int
    sha256: str


def weights_hash(module: nn.Module) -> str:
    """SHA-256 over every parameter and buffer: name, dtype, shape and bytes, sorted by
    name, so equal weights hash equal wherever they were made."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def save_weights(module: nn.Module, path: Path, *, version: int) -> WeightsInfo:
    """Write atomically; the file's metadata carries the version and the hash."""
    info = WeightsInfo(version, weights_hash(module))
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in module.state_dict().items():
        t = v.detach().contiguous().cpu()
        # safetensors refuses tensors that share memory (a model whose output head is its
        # embedding, tied): the second name gets a copy of its own
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[k] = t
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = save(tensors, metadata={"version": str(version), "sha256": info.sha256})
    with open(tmp, "wb") as f:
        f.write(canonical_safetensors(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return info


def canonical_safetensors(data: bytes) -> bytes:
    """The same file with its metadata in sorted order. safetensors writes the metadata
    from a hash map, in an order that changes from run to run: equal weights made other
    bytes, other chunks, and every publish of the same weights added a new set of chunks
    (33, then 69, of the same weights)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict):
        return data
    header["__metadata__"] = dict(sorted(metadata.items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > size:  # not the layout expected: leave the file as it was made
        return data
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]


def load_weights(
    module: nn.Module, path: Path, *, expected_sha256: str | None = None, cast: bool = False
) -> WeightsInfo:
    """Load into ``module`` (same names and shapes required), checking the hash. With
    ``cast`` (an owner's own files, never a peer's), tensors of another float dtype are
    rounded to the module's, and the file's own hash is then not checked."""
    try:
        tensors = load_file(str(path))
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise WeightsError(f"cannot read weights {path}: {exc}") from exc
    return _load_checked(module, tensors, metadata, str(path), expected_sha256, cast=cast)


def load_weights_bytes(
    module: nn.Module, blob: bytes, *, expected_sha256: str | None = None
) -> WeightsInfo:
    """:func:`load_weights` of a file's bytes (as fetched from a peer), read in memory:
    a temporary folder per pulled version (written, read, removed) was ~2% of an
    emulated host's CPU."""
    try:
        tensors = load(blob)  # checks the header and the tensors' bounds
        metadata = _metadata(blob)
    except (SafetensorError, ValueError) as exc:
        raise WeightsError(f"cannot read fetched weights: {exc}") from exc
    return _load_checked(module, tensors, metadata, "fetched weights", expected_sha256, cast=False)


def _metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file that ``load`` has read (so its header's
    length is within the file)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError("the file's metadata is not a table of strings")
    return metadata


def _load_checked(
    module: nn.Module,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    path: str,
    expected_sha256: str | None,
    *,
    cast: bool,
) -> WeightsInfo:
    """``tensors`` into ``module`` once their names, dtypes and shapes match, and the
    hash (the file's own, ``expected_sha256``) is checked."""
    own = module.state_dict()
    if set(tensors) != set(own):
        missing = sorted(set(own) - set(tensors))
        extra = sorted(set(tensors) - set(own))
        raise WeightsError(
            f"{path}: tensors do not match the expert (missing {missing[:3]}, extra {extra[:3]})"
        )
    if cast:
        recast = {k: t for k, t in tensors.items() if t.dtype != own[k].dtype}
        if recast and all(t.is_floating_point() for t in recast.values()):
            tensors = {k: t.to(own[k].dtype) for k, t in tensors.items()}
            metadata.pop("sha256", None)
    for name, t in tensors.items():
        if t.shape != own[name].shape or t.dtype != own[name].dtype:
            raise WeightsError(
                f"{path}: {name} is {t.dtype}{list(t.shape)}, "
                f"expected {own[name].dtype}{list(own[name].shape)}"
            )
    module.load_state_dict(tensors, strict=True)
    sha = weights_hash(module)
    for claimed in (metadata.get("sha256"), expected_sha256):
        if claimed is not None and claimed != sha:
            raise WeightsError(f"{path}: weights hash {sha[:12]} does not match {claimed[:12]}")
    try:
        version = int(metadata.get("version", "0"))
    except ValueError as exc:
        raise WeightsError(f"{path}: version metadata is not an integer") from exc
    return WeightsInfo(version, sha)
