"""An aggregator's files besides its journal: one file per expert, replaced atomically
when that expert's version changes; the published weights of recent versions, for
audits; and a small state file. A round writes what it changed, not the whole state.

Layout of the folder::

    experts/<uid>.safetensors          the expert's whole state: master weights, the
                                       optimizer's and the robust rule's tensors; its
                                       version and the rest in the header's metadata
    history/<uid>/<version>.safetensors  the weights of a past version as published
    state.msgpack                      nonces and batches seen, statistics, bans
    journal-<n>.log                    core/aggregator/journal.py

Only our own files are read back, and never with pickle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from core.checkpoints import fsync_dir
from net.codec import pack, unpack_bounded

#: the state file holds nonces and statistics, never tensors
MAX_STATE_BYTES = 1 << 30
_META_KEY = "moehome"


def _file_name(uid: str) -> str:
    # uids are [a-z0-9_.-] (core/experts/uid.py) plus the trunk's: safe as file names
    if not uid or "/" in uid or uid.startswith("."):
        raise ValueError(f"{uid!r} cannot name a file")
    return uid


def write_atomically(path: Path, write: Any) -> int:
    """``write(tmp_path)`` then fsync and rename over ``path``: a reader (or a restart
    after kill -9) sees the old file or the new one, whole. Returns the bytes written."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    size = tmp.stat().st_size
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return size


class ExpertFiles:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "experts").mkdir(parents=True, exist_ok=True)
        (root / "history").mkdir(parents=True, exist_ok=True)

    def save(self, uid: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> int:
        """Replace ``uid``'s file; returns the bytes written."""
        header = {_META_KEY: json.dumps(meta, sort_keys=True)}
        contiguous = {k: v.detach().contiguous() for k, v in tensors.items()}
        path = self.root / "experts" / f"{_file_name(uid)}.safetensors"
        return write_atomically(path, lambda tmp: save_file(contiguous, str(tmp), header))

    def load(self, uid: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        path = self.root / "experts" / f"{_file_name(uid)}.safetensors"
        if not path.exists():
            return None
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[_META_KEY])
        return load_file(str(path)), meta

    def keep_version(self, uid: str, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Keep the published weights of ``uid`` at ``version``; returns bytes written."""
        folder = self.root / "history" / _file_name(uid)
        folder.mkdir(exist_ok=True)
        contiguous = {k: v.detach().contiguous() for k, v in weights.items()}
        path = folder / f"{version}.safetensors"
        return write_atomically(path, lambda tmp: save_file(contiguous, str(tmp)))

    def kept_versions(self, uid: str) -> list[int]:
        folder = self.root / "history" / _file_name(uid)
        if not folder.exists():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.safetensors") if p.stem.isdigit())

    def version(self, uid: str, version: int) -> dict[str, torch.Tensor] | None:
        path = self.root / "history" / _file_name(uid) / f"{version}.safetensors"
        return load_file(str(path)) if path.exists() else None

    def forget_versions(self, uid: str, keep: int) -> None:
        """Delete all but the newest ``keep`` kept versions of ``uid``."""
        versions = self.kept_versions(uid)
        for old in versions[: max(0, len(versions) - keep)]:
            (self.root / "history" / _file_name(uid) / f"{old}.safetensors").unlink(missing_ok=True)


class StateFile:
    """The small rest of an aggregator's state: msgpack, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, state: dict[str, Any]) -> int:
        data = pack(state)
        if len(data) > MAX_STATE_BYTES:
            raise ValueError("aggregator state too large")

        def write(tmp: Path) -> None:
            tmp.write_bytes(data)

        return write_atomically(self.path, write)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        result: dict[str, Any] = unpack_bounded(self.path.read_bytes(), MAX_STATE_BYTES)
        return result
