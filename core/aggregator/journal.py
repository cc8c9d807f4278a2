"""An aggregator's journal: accepted contributions (fsynced before the contributor is
told "accepted"), audits' outcomes and the rounds applied, appended to segments
``journal-<n>.log``. The oldest segments go once everything in them is settled
(applied, discarded, or stale); the experts' own files (core/aggregator/store.py) hold
the rest, so a restart reads what is left and redoes nothing twice.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch

from core.experts.wire import NAME_BY_TORCH, from_wire
from net.codec import pack, unpack_bounded
from net.rpc import Tensor

log = logging.getLogger(__name__)

_RECORD = struct.Struct(">II")
MAX_RECORD_BYTES: Final = 512 * 1024 * 1024


#: a segment is closed and a new one begun past this size
SEGMENT_BYTES: Final = 256 * 1024 * 1024


@dataclass(frozen=True, order=True)
class Location:
    """Where a record lies: its segment's number and its offset in it."""

    segment: int
    offset: int


class Journal:
    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self.bytes_written = 0
        legacy = folder / "journal.log"  # one file, before segments: the oldest one
        if legacy.exists() and not self._path(0).exists():
            os.replace(legacy, self._path(0))
        segments = self.segments()
        self.current = segments[-1] + 1 if segments else 1
        # a new segment at each start: the last one may end in a torn record
        self._file = open(self._path(self.current), "ab")  # noqa: SIM115 - held open
        self._size = 0

    def _path(self, segment: int) -> Path:
        return self.folder / f"journal-{segment:06d}.log"

    def segments(self) -> list[int]:
        return sorted(
            int(p.stem.split("-")[1])
            for p in self.folder.glob("journal-*.log")
            if p.stem.split("-")[1].isdigit()
        )

    def append(self, record: Any) -> Location:
        """Write one record and fsync it: when this returns, it survives kill -9."""
        data = pack(record)
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError("journal record too large")
        if self._size and self._size + len(data) > self.segment_bytes:
            self._file.close()
            self.current += 1
            self._file = open(self._path(self.current), "ab")  # noqa: SIM115
            self._size = 0
        where = Location(self.current, self._size)
        chunk = _RECORD.pack(len(data), zlib.crc32(data)) + data
        self._file.write(chunk)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._size += len(chunk)
        self.bytes_written += len(chunk)
        return where

    def read_at(self, where: Location) -> Any:
        """The record at ``where`` (checked as when it was replayed)."""
        with open(self._path(where.segment), "rb") as f:
            f.seek(where.offset)
            record = _read_one(f, self._path(where.segment))
        if record is None:
            raise OSError(f"journal record at {where} is gone or damaged")
        return record

    def records(self) -> Iterator[tuple[Location, Any]]:
        """Every complete record of every segment, oldest first; a segment's reading
        stops at a torn or corrupt tail (never acknowledged)."""
        for segment in self.segments():
            path = self._path(segment)
            with open(path, "rb") as f:
                while True:
                    offset = f.tell()
                    record = _read_one(f, path)
                    if record is None:
                        break
                    yield Location(segment, offset), record

    def drop_before(self, segment: int) -> None:
        """Delete the segments older than ``segment`` (never the one being written)."""
        for old in self.segments():
            if old < min(segment, self.current):
                self._path(old).unlink(missing_ok=True)

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


def _read_one(f: Any, path: Path) -> Any:
    head = f.read(_RECORD.size)
    if len(head) < _RECORD.size:
        return None
    length, crc = _RECORD.unpack(head)
    if length > MAX_RECORD_BYTES:
        log.warning("journal %s: implausible record length; stopping there", path)
        return None
    data = f.read(length)
    if len(data) < length or zlib.crc32(data) != crc:
        log.warning("journal %s: torn last record dropped (never acknowledged)", path)
        return None
    return unpack_bounded(data, MAX_RECORD_BYTES)


def tensor_record(t: torch.Tensor) -> list[Any]:
    """A tensor as a journal record's field: [dtype, shape, raw bytes]."""
    t = t.detach().contiguous().cpu()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [NAME_BY_TORCH[t.dtype], list(t.shape), data]


def tensor_from_record(r: list[Any]) -> torch.Tensor:
    return from_wire(Tensor(r[0], tuple(r[1]), bytearray(r[2])))
