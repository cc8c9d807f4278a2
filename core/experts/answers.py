"""What an expert server reads from a request and sends back: tensors decoded with the
codecs the request names (each checked before it is decoded), the answer in the codec it
asked for with the volunteer's signed statement, and the trainer's receipt checked
against what the request carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import trio
from torch import nn

from core.experts import activations
from core.experts.activations import ActivationCodecError
from core.experts.backend import ExpertBackend
from core.protocol.answers import NONE, AnswerStatement, parts_digest
from core.protocol.contributions import MessageError, Receipt, tensor_digest
from core.protocol.expert_methods import (
    GRAPH_GONE,
    RAW,
    Backlog,
    ExpertAnswer,
    ExpertRequest,
)
from net import BadRequest, CallContext, Identity, PeerID, RemoteError, Reply
from net.identity import peer_id_from_public_key


@dataclass(frozen=True)
class AnswerDraft:
    """An answer before it is signed, with what a hook that alters answers may use: the
    request's tensor (inputs, or output gradients) and the expert's older weights. Only
    the rig sets such a hook (core/demo/cheats.py, to show audits at work); an honest
    node sends every answer as computed."""

    kind: Literal["forward", "backward"]
    answer: torch.Tensor
    request: torch.Tensor
    older: nn.Module | None  # the weights before the current version, if kept


#: Alters an answer before it is signed (None in real use).
AnswerHook = Callable[[AnswerDraft], torch.Tensor]


def older_weights(backend: ExpertBackend) -> nn.Module | None:
    """The weights the expert served before its current version (for an answer hook)."""
    return backend.previous[0].module if backend.previous else None


class GraphGone(RemoteError):
    """The forward graph a backward request names is gone (dropped, or never kept):
    the caller sends the inputs again."""

    code = GRAPH_GONE


#: Receipts' batch ids remembered (a receipt is good for one backward pass).
RECEIPTS_REMEMBERED = 1_000_000


@dataclass(frozen=True)
class ExpertCall:
    """A request to an expert server, parsed and its expert found."""

    ctx: CallContext
    method: str
    request: ExpertRequest
    backend: ExpertBackend

    @property
    def caller(self) -> PeerID:
        return self.ctx.peer_id


def request_tensors(call: ExpertCall) -> list[torch.Tensor]:
    """The request's tensors, decoded with the codecs it names (one per tensor; none:
    raw), each checked before it is decoded."""
    count = call.request.tensors(call.method)
    try:
        names = [activations.check_codec(c) for c in call.request.codecs or [RAW] * count]
    except ActivationCodecError as exc:
        raise BadRequest(str(exc)) from exc
    sizes = [activations.parts_per_tensor(n) for n in names]
    wires = call.ctx.request.tensors
    if len(wires) != sum(sizes):
        raise BadRequest(f"expected {sum(sizes)} tensor(s), got {len(wires)}")
    out, at = [], 0
    spec = call.backend.spec
    for name, size in zip(names, sizes, strict=True):
        try:
            out.append(
                activations.decode(
                    wires[at : at + size], name, width=spec.hidden, dtype=spec.torch_dtype
                )
            )
        except ActivationCodecError as exc:
            raise BadRequest(str(exc)) from exc
        at += size
    return out


def answer_codec(request: ExpertRequest) -> str:
    """The codec the request asks its answer in (checked before the work, not after)."""
    try:
        return activations.check_codec(request.answer)
    except ActivationCodecError as exc:
        raise BadRequest(str(exc)) from exc


def signed_reply(
    identity: Identity,
    project: str,
    call: ExpertCall,
    t: torch.Tensor,
    version: int,
    inputs_sha256: bytes,
    grad: torch.Tensor | None,
    backlog: Backlog,
    handle: int | None = None,
) -> Reply:
    """``t`` in the codec the request asked its answer in, naming the ``version`` of the
    weights that computed it, with this volunteer's signed statement of what it computed
    from what (``inputs_sha256``: of the inputs; ``grad``: the output gradients of a
    backward pass, None for a forward pass)."""
    codec = answer_codec(call.request)
    parts = tuple(activations.encode(t, codec))
    statement = AnswerStatement.sign(
        identity,
        project=project,
        uid=str(call.backend.uid),
        version=version,
        kind="forward" if grad is None else "backward",
        codec=codec,
        inputs_sha256=inputs_sha256,
        grads_sha256=NONE if grad is None else tensor_digest([grad]),
        answer_sha256=parts_digest(parts),
    )
    answer = ExpertAnswer(
        version,
        call.backend.sha256_of_version(version),
        backlog,
        codec=codec,
        seconds=round(trio.current_time() - call.ctx.arrived, 4),
        statement=statement.encode(),
        handle=handle,
        gradient=grad is not None,
    )
    return Reply(answer.to_meta(), parts)


class ReceiptCheck:
    """Checks a backward request's receipt (when the project needs them): signed by one
    of ``trainers`` (any signer when empty) who sent the request itself, for this
    project, expert, version, rows and tensors, and never used before."""

    def __init__(self, project: str, trainers: frozenset[PeerID], *, required: bool) -> None:
        self.project, self.trainers, self.required = project, trainers, required
        self._batches: dict[bytes, None] = {}  # an ordered set, oldest dropped

    def __call__(
        self,
        call: ExpertCall,
        inputs_digest: bytes,
        grad: torch.Tensor,
        *,
        version: int | None = None,
    ) -> Receipt | None:
        """The request's receipt, checked against what the request carries and the
        weights that will compute it (``version``; None: the current ones)."""
        raw, backend = call.request.receipt, call.backend
        if not self.required:
            return None
        if raw is None:
            raise BadRequest("this server needs a signed receipt with every backward request")
        try:
            receipt = Receipt.decode(raw)
        except MessageError as exc:
            raise BadRequest(f"receipt: {exc}") from exc
        if not receipt.verify():
            raise BadRequest("receipt does not match the request: signature")
        signer = peer_id_from_public_key(receipt.trainer)
        problems = [
            # a receipt is what makes a gradient count: one of anyone but the project's
            # trainers would be refused with the volunteer's whole contribution, a strike
            # against the volunteer that a stranger could buy with one small request
            (bool(self.trainers) and signer not in self.trainers, "signer is no trainer"),
            (signer != call.caller, "sent by someone other than its signer"),
            (receipt.project != self.project, "project"),
            (receipt.uid != str(backend.uid), "uid"),
            (receipt.version != (backend.version if version is None else version), "version"),
            (receipt.samples != grad.shape[0], "samples"),
            (receipt.grads_sha256 != tensor_digest([grad]), "grad_outputs hash"),
            (receipt.inputs_sha256 != inputs_digest, "inputs hash"),
            (receipt.batch_id in self._batches, "batch id used before"),
        ]
        wrong = [what for bad, what in problems if bad]
        if wrong:
            raise BadRequest(f"receipt does not match the request: {', '.join(wrong)}")
        self._batches[receipt.batch_id] = None
        while len(self._batches) > RECEIPTS_REMEMBERED:
            del self._batches[next(iter(self._batches))]
        return receipt
