"""The trainers' signed evaluations an aggregator keeps for anyone to read (the project
page's loss over time; core/protocol/evaluations.py).

Only the manifest's trainers are heard, each point checked by its signature. Bounded:
``MAX_POINTS_PER_TRAINER`` per trainer; past it every other point of the older half is
dropped, so a long run keeps its whole curve, coarser where it is old. Kept in an
append-only file (one length-prefixed point per record, synced): a kill -9 loses at most
the point being written, and a torn last record is skipped on reading.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Collection
from pathlib import Path
from typing import Final

from core.files import replace_file
from core.protocol.evaluations import MAX_POINT_BYTES, EvaluationPoint
from core.protocol.fields import MessageError

log = logging.getLogger(__name__)

MAX_POINTS_PER_TRAINER: Final = 512
#: a point stamped further ahead of this aggregator's clock is refused (clock skew)
MAX_FUTURE_SECONDS: Final = 600.0
_LENGTH: Final = struct.Struct(">H")


class EvaluationRefused(ValueError):
    """A point this aggregator does not keep, and why."""


def thinned(points: list[EvaluationPoint], limit: int) -> list[EvaluationPoint]:
    """``points`` (oldest first) cut to at most ``limit``: every other point of the older
    half dropped, as often as needed; the newest point is always kept. Pure."""
    out = list(points)
    while len(out) > limit:
        half = len(out) // 2
        out = out[:half:2] + out[half:] if half >= 2 else out[-limit:]
    return out


class EvaluationStore:
    def __init__(self, path: Path | None, project: str, trainers: Collection[bytes]) -> None:
        self.path = path
        self.project = project
        self.trainers = frozenset(trainers)
        #: per trainer (public key), oldest first
        self.points: dict[bytes, list[EvaluationPoint]] = {}

    def load(self) -> int:
        """Reads the file (if any); returns the points kept. Records that do not decode,
        verify or belong (a manifest that changed its trainers) are skipped, and a torn
        last record (a kill during a write) cut off: the file is written again without
        them, so that the next record is appended where a reader expects it."""
        if self.path is None or not self.path.exists():
            return 0
        data = self.path.read_bytes()
        at, clean = 0, True
        while at < len(data):
            if at + _LENGTH.size > len(data):
                clean = False
                break
            (n,) = _LENGTH.unpack_from(data, at)
            record = data[at + _LENGTH.size : at + _LENGTH.size + n]
            at += _LENGTH.size + n
            if len(record) < n:
                log.warning(
                    "%s: a torn last record (%d of %d bytes) cut off", self.path, len(record), n
                )
                clean = False
                break
            try:
                self._keep(self._checked(EvaluationPoint.decode(record), now=None))
            except (MessageError, EvaluationRefused) as exc:
                log.warning("%s: a record skipped: %s", self.path, exc)
                clean = False
        for trainer, points in self.points.items():
            if len(points) > MAX_POINTS_PER_TRAINER:
                self.points[trainer] = thinned(points, MAX_POINTS_PER_TRAINER)
                clean = False
        if not clean:
            self._rewrite()
        return sum(len(p) for p in self.points.values())

    def add(self, point: EvaluationPoint, now: float) -> None:
        """Keeps ``point`` (and writes it down) or raises EvaluationRefused."""
        self._checked(point, now)
        before = len(self.points.get(point.trainer, ()))
        self._keep(point)
        points = self.points[point.trainer]
        if len(points) > MAX_POINTS_PER_TRAINER:
            self.points[point.trainer] = thinned(points, MAX_POINTS_PER_TRAINER)
            self._rewrite()
        elif len(points) > before:
            self._append(point)

    def after(self, time: float, limit: int) -> tuple[list[EvaluationPoint], bool]:
        """The points measured after ``time``, oldest first, at most ``limit``; and
        whether more are left."""
        newer = sorted(
            (p for points in self.points.values() for p in points if p.time > time),
            key=lambda p: (p.time, p.trainer),
        )
        return newer[:limit], len(newer) > limit

    def _checked(self, point: EvaluationPoint, now: float | None) -> EvaluationPoint:
        if point.project != self.project:
            raise EvaluationRefused(f"an evaluation of another project ({point.project})")
        if point.trainer not in self.trainers:
            raise EvaluationRefused("the manifest lists no such trainer")
        if now is not None and point.time > now + MAX_FUTURE_SECONDS:
            raise EvaluationRefused("an evaluation stamped in the future")
        if not point.verify():
            raise EvaluationRefused("a bad signature")
        return point

    def _keep(self, point: EvaluationPoint) -> None:
        """In time order; a point at a time already kept for its trainer replaces none
        (a trainer sends each once; a repeat is dropped)."""
        points = self.points.setdefault(point.trainer, [])
        if any(p.time == point.time for p in points[-8:]):
            return
        points.append(point)
        if len(points) > 1 and points[-2].time > point.time:
            points.sort(key=lambda p: p.time)

    def _append(self, point: EvaluationPoint) -> None:
        if self.path is None:
            return
        record = point.encode()
        assert len(record) <= MAX_POINT_BYTES
        with open(self.path, "ab") as f:
            f.write(_LENGTH.pack(len(record)) + record)
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self) -> None:
        if self.path is None:
            return
        records = b"".join(
            _LENGTH.pack(len(r)) + r
            for points in self.points.values()
            for r in (p.encode() for p in points)
        )
        replace_file(self.path, records)
