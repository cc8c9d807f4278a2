"""Durable storage of an aggregator: an append-only journal of accepted contributions
(fsynced before the contributor is told "accepted") and atomic checkpoints.

Layout of the folder::

    CURRENT                 name of the newest complete checkpoint (replaced atomically)
    ckpt-000042/            one checkpoint: state.msgpack + tensors.safetensors
    journal.log             records appended since that checkpoint

A journal record is ``length (u32) | crc32 (u32) | msgpack bytes``. A torn last record
(the process died mid-write) fails its length or checksum and is dropped: it was never
acknowledged, because acknowledgement waits for fsync.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import torch

from core.experts.wire import NAME_BY_TORCH, from_wire
from net.codec import pack, unpack_bounded
from net.rpc import Tensor

log = logging.getLogger(__name__)

_RECORD = struct.Struct(">II")
MAX_RECORD_BYTES: Final = 512 * 1024 * 1024


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - held open for the journal's life

    def append(self, record: Any) -> None:
        """Write one record and fsync it: when this returns, it survives kill -9."""
        data = pack(record)
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError("journal record too large")
        self._file.write(_RECORD.pack(len(data), zlib.crc32(data)) + data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(path: Path) -> Iterator[Any]:
        """Every complete record; stops at a torn or corrupt tail."""
        if not path.exists():
            return
        with open(path, "rb") as f:
            while True:
                head = f.read(_RECORD.size)
                if len(head) < _RECORD.size:
                    return
                length, crc = _RECORD.unpack(head)
                if length > MAX_RECORD_BYTES:
                    log.warning("journal %s: implausible record length; stopping there", path)
                    return
                data = f.read(length)
                if len(data) < length or zlib.crc32(data) != crc:
                    log.warning("journal %s: torn last record dropped (never acknowledged)", path)
                    return
                yield unpack_bounded(data, MAX_RECORD_BYTES)


def tensor_record(t: torch.Tensor) -> list[Any]:
    """A tensor as a journal record's field: [dtype, shape, raw bytes]."""
    t = t.detach().contiguous().cpu()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [NAME_BY_TORCH[t.dtype], list(t.shape), data]


def tensor_from_record(r: list[Any]) -> torch.Tensor:
    return from_wire(Tensor(r[0], tuple(r[1]), bytearray(r[2])))
