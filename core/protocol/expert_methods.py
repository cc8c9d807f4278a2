"""The expert protocol, declared once for both ends: its RPC methods, the fields of a
request and of an answer (frozen types that write and read the wire's metadata), and its
error code.

moe.forward   ExpertRequest {uid, keep?, codecs?, answer?}, tensors [inputs]
              -> ExpertAnswer {version, sha256, handle?, ...}, tensors [outputs]
moe.backward  ExpertRequest {uid, receipt?, codecs?, answer?}, tensors [inputs,
              grad_outputs] -> ExpertAnswer {..., gradient}, tensors [grad_inputs]
moe.backward  ExpertRequest {uid, handle, ...}, tensors [grad_outputs]: the same, through
              the graph the forward pass with keep left on the server (GRAPH_GONE if not)
moe.backward  ExpertRequest {uid, recompute, ...}: input gradients at the current weights
              for a trainer's second opinion (they go into no contribution)
moe.info      ExpertRequest {uid} -> ExpertInfo {uid, spec, version, sha256, max_batch,
              load, queue, rate}

A request is the caller's word and is checked whole before any work (``parse`` raises
RequestError on a field of the wrong type); an answer is a volunteer's word and is read
leniently (``read``: a field of the wrong type reads as absent), the checks that matter
(codec, shapes, the signed statement) being the caller's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

FORWARD: Final = "moe.forward"
BACKWARD: Final = "moe.backward"
INFO: Final = "moe.info"
#: Error code of a backward request whose kept forward graph is gone.
GRAPH_GONE: Final = "graph_gone"

RAW: Final = "raw"


class RequestError(ValueError):
    """A request with a field of the wrong type (the server answers BadRequest)."""


@dataclass(frozen=True)
class ExpertRequest:
    uid: str
    #: the codec of each of the request's tensors (None: every one raw)
    codecs: tuple[str, ...] | None = None
    #: the codec the answer is wanted in
    answer: str = RAW
    #: forward: keep the graph on the server for the backward pass (trainers only)
    keep: bool = False
    #: backward: through the graph the forward pass that answered ``handle`` kept
    handle: int | None = None
    #: backward: a trainer's second opinion at the current weights (no contribution)
    recompute: bool = False
    #: backward: the trainer's signed receipt (core/protocol/contributions.py)
    receipt: bytes | None = None

    def tensors(self, method: str) -> int:
        """How many tensors the request carries, before their codecs' parts."""
        return 1 if method != BACKWARD or self.handle is not None else 2

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"uid": self.uid}
        if self.keep:
            meta["keep"] = True
        if self.handle is not None:
            meta["handle"] = self.handle
        if self.recompute:
            meta["recompute"] = True
        if self.receipt is not None:
            meta["receipt"] = self.receipt
        if self.codecs is not None:
            meta["codecs"] = list(self.codecs)
        if self.answer != RAW:
            meta["answer"] = self.answer
        return meta

    @classmethod
    def parse(cls, method: str, meta: Mapping[str, Any]) -> ExpertRequest:
        """The request of ``method`` that ``meta`` holds; RequestError names the first
        field of the wrong type. (Whether its uid is served and its codecs known is the
        server's to say.)"""
        uid = meta.get("uid")
        if not isinstance(uid, str):
            raise RequestError(f"expert {uid!r} is not served here")
        handle = meta.get("handle")
        if handle is not None and (not isinstance(handle, int) or isinstance(handle, bool)):
            raise RequestError("handle must be an integer")
        receipt = meta.get("receipt")
        request = cls(
            uid,
            keep=meta.get("keep") is True,
            handle=handle,
            recompute=meta.get("recompute") is True,
            receipt=receipt if isinstance(receipt, bytes) else None,
        )
        codecs = meta.get("codecs")
        count = request.tensors(method)
        if codecs is not None and (
            not isinstance(codecs, list)
            or len(codecs) != count
            or not all(isinstance(c, str) for c in codecs)
        ):
            raise RequestError(f"codecs must name {count} codec(s)")
        answer = meta.get("answer", RAW)
        if not isinstance(answer, str):
            raise RequestError(f"answer must name a codec, not {answer!r}")
        return replace(request, codecs=None if codecs is None else tuple(codecs), answer=answer)


@dataclass(frozen=True)
class Backlog:
    """What every answer tells the caller of the server's load (core/moe/load.py): the
    work waiting there and the work it does per second, in units (a forward row 1, a
    backward row 2)."""

    queue: float | None = None
    rate: float | None = None

    def to_meta(self) -> dict[str, Any]:
        fields = {"queue": self.queue, "rate": self.rate}
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class ExpertAnswer:
    #: the weights that computed it (a receipt names them)
    version: int
    sha256: str | None
    backlog: Backlog
    #: the codec of the answer's tensor
    codec: str = RAW
    #: seconds the server took, from the request's arrival to the answer
    seconds: float | None = None
    #: the volunteer's signed statement of what it computed from what
    statement: bytes | None = None
    #: forward: the handle of the graph kept for the backward pass
    handle: int | None = None
    #: backward: the answer is input gradients
    gradient: bool = False

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"version": self.version, "sha256": self.sha256}
        meta |= self.backlog.to_meta()
        if self.handle is not None:
            meta["handle"] = self.handle
        if self.codec != RAW:
            meta["codec"] = self.codec
        if self.seconds is not None:
            meta["seconds"] = self.seconds
        if self.statement is not None:
            meta["statement"] = self.statement
        if self.gradient:
            meta["gradient"] = True
        return meta

    @classmethod
    def read(cls, meta: Mapping[str, Any]) -> ExpertAnswer:
        """An answer's fields as a volunteer sent them: a field of the wrong type reads
        as absent (a codec of the wrong type as one no caller knows)."""
        codec = meta.get("codec", RAW)
        sha256 = meta.get("sha256")
        statement = meta.get("statement")
        return cls(
            version=_integer(meta.get("version")) or 0,
            sha256=sha256 if isinstance(sha256, str) else None,
            backlog=Backlog(_number(meta.get("queue")), _number(meta.get("rate"))),
            codec=codec if isinstance(codec, str) else repr(codec),
            seconds=_number(meta.get("seconds")),
            statement=statement if isinstance(statement, bytes) else None,
            handle=_integer(meta.get("handle")),
            gradient=meta.get("gradient") is True,
        )


@dataclass(frozen=True)
class ExpertInfo:
    """moe.info's answer: what a server serves, with which weights, how loaded."""

    uid: str
    spec: dict[str, Any]
    version: int
    sha256: str | None
    max_batch: int
    load: float
    backlog: Backlog

    def to_meta(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "sha256": self.sha256,
            **self.backlog.to_meta(),
            "uid": self.uid,
            "spec": self.spec,
            "max_batch": self.max_batch,
            "load": self.load,
        }


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
