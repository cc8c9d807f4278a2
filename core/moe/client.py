"""Calling remote experts from torch code: the portal into the trio loop, calls with
failover between servers of one expert, and ``RemoteExpert``, a module whose forward and
backward are RPCs.

torch's autograd is synchronous and the network is trio: torch code runs in a worker
thread (``trio.to_thread.run_sync``) and reaches the loop through a :class:`Portal`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

import torch
import trio
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from core.experts import activations
from core.experts.activations import ActivationCodecError, WireCodecs
from core.moe.answer_checks import Answer, Evidence, statement_problem
from core.moe.audit import AnswerAuditor
from core.moe.load import BACKWARD_UNITS, FORWARD_UNITS, ServerLoads
from core.moe.voices import ExpertVoices
from core.protocol.aggregator_methods import MAX_REFEREE_ROWS, REFEREE
from core.protocol.answers import AnswerStatement
from core.protocol.contributions import Receipt
from core.protocol.expert_methods import (
    BACKWARD,
    FORWARD,
    GRAPH_GONE,
    RAW,
    ExpertAnswer,
    ExpertRequest,
)
from core.protocol.fields import MessageError
from net import (
    Overloaded,
    PeerID,
    PeerUnreachable,
    RemoteError,
    Reply,
    RpcError,
    RpcService,
    RpcTimeout,
    Unavailable,
)
from net.identity import Identity, peer_id_from_public_key

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Makes autograd call backward even when no input requires grad (the expert's own
#: parameters live remotely and still need their gradients).
DUMMY = torch.empty(0, requires_grad=True)


class ExpertCallError(RuntimeError):
    """No server of an expert gave a usable answer."""


class Portal:
    """Runs async functions on a trio loop from another (non-trio) thread."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token

    @classmethod
    def current(cls) -> Portal:
        """A portal into the trio loop of the calling task."""
        return cls(trio.lowlevel.current_trio_token())

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self.token)


@dataclass(frozen=True)
class ExpertServerRef:
    """One volunteer serving one expert, as its declaration says."""

    peer_id: PeerID
    sha256: str = ""
    version: int = 0
    load: float = 0.0


@dataclass(frozen=True)
class ForwardResult:
    server: ExpertServerRef  # who answered: the backward pass goes there first
    outputs: torch.Tensor
    handle: int | None  # the server's kept autograd graph, if it kept one
    version: int = 0  # the version of the weights that answered


@dataclass(frozen=True)
class ReceiptSigner:
    """Signs a receipt for every backward request a trainer sends (the expert server
    keeps them; aggregators only count gradients that receipts back)."""

    identity: Identity
    project: str

    def sign(self, uid: str, version: int, x: torch.Tensor, grad: torch.Tensor) -> bytes:
        return Receipt.sign(
            self.identity, self.project, uid, version, [x], [grad], int(x.shape[0])
        ).encode()


@dataclass
class CallStatistics:
    forward_calls: int = 0
    backward_calls: int = 0
    graph_misses: int = 0
    failovers: int = 0
    failures: int = 0
    anomalies: int = 0
    #: activations and their gradients, both ways: bytes on the wire, and what the same
    #: values take as float32 (their ratio is what the project's codecs save)
    wire_bytes: int = 0
    float32_bytes: int = 0

    def count(self, parts: Sequence[Any], t: torch.Tensor) -> None:
        self.wire_bytes += activations.wire_bytes(parts)
        self.float32_bytes += 4 * t.numel()


#: Errors after which another server of the same expert is worth trying.
_RETRYABLE = (PeerUnreachable, RpcTimeout, Overloaded, Unavailable)
#: servers asked for one second opinion at most (each a forward pass of a few rows)
OPINION_TRIES = 3
# which servers give second opinions: not for a volunteer to predict
_OPINIONS = random.SystemRandom()


@dataclass
class ExpertCaller:
    """Forward and backward calls to one expert, with failover between its servers."""

    rpc: RpcService
    forward_timeout: float = 10.0
    backward_timeout: float = 20.0
    stats: CallStatistics = field(default_factory=CallStatistics)
    on_failure: Callable[[ExpertServerRef], None] | None = None
    #: told (server, seconds) after every answered call: how fast each server is
    on_latency: Callable[[ExpertServerRef, float], None] | None = None
    receipts: ReceiptSigner | None = None
    #: how activations and their gradients travel (the project's manifest says)
    codecs: WireCodecs = field(default_factory=WireCodecs)
    #: what the experts compute in (the manifest's ``[model] dtype``): inputs and output
    #: gradients are sent in it, answers come back in it
    dtype: torch.dtype = torch.float32
    #: the trainer's view of each server's backlog: a call goes to the server of its
    #: expert expected to finish it first (shared by every layer's caller)
    loads: ServerLoads | None = None
    #: recomputes a random share of the answers (core/moe/audit.py)
    auditor: AnswerAuditor | None = None
    #: keeps each expert's work on as many servers as its aggregator waits for
    #: (core/moe/voices.py; shared by every layer's caller)
    voices: ExpertVoices | None = None

    async def forward(
        self,
        uid: str,
        servers: Sequence[ExpertServerRef],
        x: torch.Tensor,
        *,
        keep: bool = False,
        prefer: Hashable | None = None,
    ) -> ForwardResult:
        """Outputs of ``uid`` for ``x`` from the first server that answers. With ``keep``
        the server keeps the autograd graph for the backward pass (see ``backward``).
        ``prefer``: the peer id of the server to ask first (a phase's plan, core/moe/load.py
        ``ServerLoads.plan``), the others only if it fails."""
        self.stats.forward_calls += 1
        x = x.to(self.dtype)
        codec = self.codecs.activations
        request = ExpertRequest(uid, None if codec == RAW else (codec,), codec, keep=keep)
        parts = activations.encode(x, codec)
        self.stats.count(parts, x)
        server, reply = await self._try_servers(
            uid,
            servers,
            FORWARD,
            request.to_meta(),
            parts,
            self.forward_timeout,
            x.shape[0] * FORWARD_UNITS,
            # a kept graph's backward pass follows, on the same server: it contributes
            rows=x.shape[0] if keep else 0,
            prefer=prefer,
        )
        outputs = self._answer(uid, server, reply, x)
        self._offer_audit("forward", uid, server, reply, x, None, outputs)
        answer = ExpertAnswer.read(reply.meta)
        # the weights that answered: a receipt names them, and the volunteer's
        # contribution is tied to them
        return ForwardResult(server, outputs, answer.handle, answer.version)

    async def backward(
        self,
        uid: str,
        servers: Sequence[ExpertServerRef],
        x: torch.Tensor,
        grad_outputs: torch.Tensor,
        *,
        kept: ForwardResult | None = None,
    ) -> torch.Tensor:
        """Input gradients. Through the graph ``kept`` by the forward pass when it is still
        there (only grad_outputs travel); otherwise recomputed by a server with the same
        weights as the one that did the forward pass."""
        self.stats.backward_calls += 1
        x, grad_outputs = x.to(self.dtype), grad_outputs.to(self.dtype)
        act, grad_codec = self.codecs.activations, self.codecs.gradients
        # gradients are rounded at random: unbiased, whatever the codec drops
        grad_parts = activations.encode(grad_outputs, grad_codec, stochastic=True)
        receipt = None
        if self.receipts is not None:
            # the receipt names what the server decodes: the inputs its forward pass saw
            # and the gradients this request carries
            version = kept.version if kept is not None else (servers[0].version if servers else 0)
            seen_x = activations.roundtrip(x, act)
            seen_grad = activations.decode(
                grad_parts, grad_codec, width=grad_outputs.shape[-1], dtype=grad_outputs.dtype
            )
            receipt = self.receipts.sign(uid, version, seen_x, seen_grad)
        if kept is not None and kept.handle is not None:
            through_kept = ExpertRequest(
                uid,
                None if grad_codec == RAW else (grad_codec,),
                grad_codec,
                handle=kept.handle,
                receipt=receipt,
            )
            self.stats.count(grad_parts, grad_outputs)
            try:
                reply = await self._call(
                    kept.server,
                    BACKWARD,
                    through_kept.to_meta(),
                    grad_parts,
                    self.backward_timeout,
                    x.shape[0] * BACKWARD_UNITS,
                )
                grad_x = self._answer(uid, kept.server, reply, x)
                self._offer_audit("backward", uid, kept.server, reply, x, grad_parts, grad_x)
                return grad_x
            except RemoteError as exc:
                if exc.code != GRAPH_GONE:
                    raise ExpertCallError(
                        f"backward {uid} on {kept.server.peer_id}: {exc}"
                    ) from exc
                self.stats.graph_misses += 1
            except (RpcError, ExpertCallError) as exc:
                log.info("kept-graph backward of %s failed (%s); recomputing elsewhere", uid, exc)
                # the server may have taken the receipt before the call failed on our side
                servers = others_first(kept.server, servers)
        request = ExpertRequest(
            uid,
            None if (act, grad_codec) == (RAW, RAW) else (act, grad_codec),
            grad_codec,
            receipt=receipt,
        )
        x_parts = activations.encode(x, act)
        self.stats.count(x_parts, x)
        self.stats.count(grad_parts, grad_outputs)
        server, reply = await self._try_servers(
            uid,
            servers,
            BACKWARD,
            request.to_meta(),
            [*x_parts, *grad_parts],
            self.backward_timeout,
            x.shape[0] * (FORWARD_UNITS + BACKWARD_UNITS),  # recomputed, then backward
            rows=x.shape[0],
        )
        grad_x = self._answer(uid, server, reply, x)
        self._offer_audit("backward", uid, server, reply, x, grad_parts, grad_x)
        return grad_x

    def _offer_audit(
        self,
        kind: Literal["forward", "backward"],
        uid: str,
        server: ExpertServerRef,
        reply: Reply,
        x: torch.Tensor,
        grad_parts: list[Any] | None,
        answer: torch.Tensor,
    ) -> None:
        """Hand the answer to the auditor if its draw says so (after the answer came:
        the volunteer cannot tell which answers are checked), with the inputs (and
        gradients) as the server decoded them."""
        if self.auditor is None or not self.auditor.draw():
            return
        seen_x = activations.roundtrip(x, self.codecs.activations)
        seen_grad = None
        if grad_parts is not None:
            seen_grad = activations.decode(
                grad_parts, self.codecs.gradients, width=x.shape[-1], dtype=x.dtype
            )
        evidence = self._evidence(uid, server, reply, kind, seen_x, seen_grad)
        rows = self.auditor.rows(x.shape[0])
        self.auditor.submit(
            Answer(
                kind,
                uid,
                server.peer_id,
                ExpertAnswer.read(reply.meta).version,
                # every row is encoded on its own: these rows' codes are those the server
                # decoded
                seen_x[rows],
                None if seen_grad is None else seen_grad[rows],
                answer[rows],
                ExpertAnswer.read(reply.meta).codec,  # checked by _answer
                evidence,
            )
        )

    async def opinion(
        self, answer: Answer, servers: Sequence[ExpertServerRef], asked: set[PeerID]
    ) -> tuple[PeerID, torch.Tensor] | None:
        """Another server's answer to ``answer``'s rows at its version, uncompressed:
        an auditor's second opinion where it lacks the weights (core/moe/audit.py). A
        forward answer is put as a plain forward pass; a backward answer as a
        recomputation, whose parameter gradients go into no contribution. The server is
        drawn at random among ``servers`` not in ``asked`` (those that declare the
        answer's version first); each one tried joins ``asked``. Counts in no server's
        load, and is not itself audited."""
        candidates = [s for s in servers if s.peer_id not in asked]
        _OPINIONS.shuffle(candidates)
        candidates.sort(key=lambda s: s.version != answer.version)
        request = ExpertRequest(answer.uid, recompute=answer.kind != "forward")
        if answer.kind == "forward":
            method, timeout = FORWARD, self.forward_timeout
            tensors = [answer.inputs]
        else:
            assert answer.grad_outputs is not None
            method, timeout = BACKWARD, self.backward_timeout
            tensors = [answer.inputs, answer.grad_outputs]
        wires = [part for t in tensors for part in activations.encode(t, "raw")]
        for server in candidates[:OPINION_TRIES]:
            asked.add(server.peer_id)
            try:
                meta = request.to_meta()
                reply = await self.rpc.call(server.peer_id, method, meta, wires, timeout=timeout)
                if ExpertAnswer.read(reply.meta).version != answer.version:
                    continue  # another version's outputs say nothing of this answer
                return server.peer_id, self._answer(answer.uid, server, reply, answer.inputs)
            except (RemoteError, RpcError, ExpertCallError) as exc:
                log.info("no second opinion on %s from %s: %s", answer.uid, server.peer_id, exc)
        return None

    async def referee(self, answer: Answer, aggregator: PeerID) -> torch.Tensor | None:
        """What the weights of ``answer``'s version compute for its rows, as the
        expert's ``aggregator`` (which holds them) recomputes them; None when it gives
        no word (unreachable, or that version is gone there)."""
        if answer.inputs.shape[0] > MAX_REFEREE_ROWS:
            return None
        meta = {"uid": answer.uid, "version": answer.version, "kind": answer.kind}
        tensors = [answer.inputs]
        if answer.grad_outputs is not None:
            tensors.append(answer.grad_outputs)
        wires = [part for t in tensors for part in activations.encode(t, "raw")]
        try:
            reply = await self.rpc.call(
                aggregator, REFEREE, meta, wires, timeout=self.backward_timeout
            )
            expected = activations.decode(
                list(reply.tensors), "raw", width=answer.claimed.shape[-1], dtype=torch.float32
            )
        except (RemoteError, RpcError, ActivationCodecError, ValueError) as exc:
            log.info("no referee's word on %s from %s: %s", answer.uid, aggregator, exc)
            return None
        if expected.shape != answer.claimed.shape:
            log.info("the referee %s answered %s rows of another shape", aggregator, answer.uid)
            return None
        return expected

    def _evidence(
        self,
        uid: str,
        server: ExpertServerRef,
        reply: Reply,
        kind: str,
        seen_x: torch.Tensor,
        seen_grad: torch.Tensor | None,
    ) -> Evidence | None:
        """The server's signed statement with what it covers, if it is the statement of
        this answer, by this server, of this request; else None."""
        told = ExpertAnswer.read(reply.meta)
        try:
            statement = AnswerStatement.decode(told.statement)
        except MessageError:
            return None
        evidence = Evidence(statement, seen_x, seen_grad, tuple(reply.tensors))
        expected = (uid, told.version, kind, told.codec)
        project = statement.project if self.receipts is None else self.receipts.project
        if (
            (statement.uid, statement.version, statement.kind, statement.codec) != expected
            or statement.project != project
            or peer_id_from_public_key(statement.volunteer) != server.peer_id
            or statement_problem(evidence) is not None
        ):
            return None
        return evidence

    async def _call(
        self,
        server: ExpertServerRef,
        method: str,
        meta: dict[str, Any],
        wires: list[Any],
        timeout: float,
        units: float,
    ) -> Reply:
        """One call, with the server's backlog kept up to date (``units``: its work)."""
        if self.loads is None:
            return await self.rpc.call(server.peer_id, method, meta, wires, timeout=timeout)
        self.loads.sent(server.peer_id, units)
        told = ExpertAnswer.read({})  # no answer: nothing reported
        started = trio.current_time()
        try:
            reply = await self.rpc.call(server.peer_id, method, meta, wires, timeout=timeout)
            told = ExpertAnswer.read(reply.meta)
            return reply
        finally:
            self.loads.ended(
                server.peer_id,
                units,
                trio.current_time(),
                queue=told.backlog.queue,
                rate=told.backlog.rate,
                elapsed=trio.current_time() - started,
                seconds=told.seconds,
            )

    def _answer(
        self, uid: str, server: ExpertServerRef, reply: Reply, like: torch.Tensor
    ) -> torch.Tensor:
        """The reply's one tensor (outputs or input gradients, shaped like ``like``),
        decoded with the codec the reply names."""
        try:
            name = activations.check_codec(ExpertAnswer.read(reply.meta).codec)
            out = activations.decode(reply.tensors, name, width=like.shape[-1], dtype=like.dtype)
        except ActivationCodecError as exc:
            self.stats.failures += 1
            raise ExpertCallError(f"{uid} on {server.peer_id} answered badly: {exc}") from exc
        if out.shape != like.shape:
            self.stats.failures += 1
            raise ExpertCallError(
                f"{uid} on {server.peer_id} answered {list(out.shape)} for {list(like.shape)}"
            )
        self.stats.count(reply.tensors, out)
        return out

    async def _try_servers(
        self,
        uid: str,
        servers: Sequence[ExpertServerRef],
        method: str,
        meta: dict[str, Any],
        wires: list[Any],
        timeout: float,
        units: float = 0.0,
        *,
        rows: int = 0,
        prefer: Hashable | None = None,
    ) -> tuple[ExpertServerRef, Reply]:
        """``rows``: the samples this call adds to the answering server's contribution
        (0 for a pass that leads to none); ``prefer``: the server to ask first (a plan
        that spread the expert's work already: no reordering for its voices)."""
        if not servers:
            raise ExpertCallError(f"no server of {uid} is known")
        if self.loads is not None:
            servers = self.loads.order(servers, units, trio.current_time(), key=lambda s: s.peer_id)
        if prefer is not None:
            servers = [s for s in servers if s.peer_id == prefer] + [
                s for s in servers if s.peer_id != prefer
            ]
        elif self.voices is not None and rows:
            servers = self.voices.order(uid, servers, key=lambda s: s.peer_id)
        errors: list[str] = []
        with trio.move_on_after(timeout):
            for i, server in enumerate(servers):
                if i:
                    self.stats.failovers += 1
                started = trio.current_time()
                if self.voices is not None:
                    # counted when sent: the parts of a split call are sent side by side
                    self.voices.sent(uid, server.peer_id, rows)
                try:
                    reply = await self._call(server, method, meta, wires, timeout, units)
                except _RETRYABLE as exc:
                    errors.append(f"{server.peer_id}: {exc}")
                    if self.on_failure is not None:
                        self.on_failure(server)
                    continue
                except (RemoteError, RpcError) as exc:
                    self.stats.failures += 1
                    raise ExpertCallError(f"{method} {uid} on {server.peer_id}: {exc}") from exc
                if len(reply.tensors) != _parts_of(reply):
                    errors.append(f"{server.peer_id}: answered {len(reply.tensors)} tensors")
                    continue
                if self.on_latency is not None:
                    self.on_latency(server, trio.current_time() - started)
                return server, reply
        self.stats.failures += 1
        raise ExpertCallError(
            f"{method} {uid}: every server failed ({'; '.join(errors[:3]) or 'timed out'})"
        )


def _parts_of(reply: Reply) -> int:
    """How many tensors a reply of one tensor should carry, by the codec it names (0,
    which no reply matches, for a codec we do not know)."""
    try:
        codec = activations.check_codec(ExpertAnswer.read(reply.meta).codec)
        return activations.parts_per_tensor(codec)
    except ActivationCodecError:
        return 0


def same_weights(
    used: ExpertServerRef, servers: Sequence[ExpertServerRef]
) -> list[ExpertServerRef]:
    """``used`` first, then other servers with the same weights: a backward pass must be
    computed on the weights that did the forward pass."""
    return [used] + [s for s in servers if s != used and s.sha256 and s.sha256 == used.sha256]


def others_first(
    tried: ExpertServerRef, servers: Sequence[ExpertServerRef]
) -> list[ExpertServerRef]:
    """``servers`` with ``tried`` last. A backward call that failed on the trainer's side
    (a timeout) may have reached its server, which then holds the call's receipt: the
    same receipt sent there again is refused as a batch used before, so a recomputation
    goes to another server with the same weights first."""
    return [s for s in servers if s != tried] + [s for s in servers if s == tried]


class _RemoteExpertFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, dummy: torch.Tensor, expert: RemoteExpert, keep: bool, x: torch.Tensor
    ) -> torch.Tensor:
        result = expert.portal.run(
            partial(expert.caller.forward, keep=keep), expert.uid, expert.servers, x.detach().cpu()
        )
        ctx.expert = expert  # type: ignore[attr-defined]
        ctx.result = result  # type: ignore[attr-defined]
        ctx.save_for_backward(x)
        return result.outputs.to(x.device)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[None, None, None, torch.Tensor]:
        (x,) = ctx.saved_tensors
        expert: RemoteExpert = ctx.expert
        result: ForwardResult = ctx.result
        grad_x = expert.portal.run(
            partial(expert.caller.backward, kept=result),
            expert.uid,
            same_weights(result.server, expert.servers),
            x.detach().cpu(),
            grad_y.detach().cpu().contiguous(),
        )
        return None, None, None, grad_x.to(x.device)


class RemoteExpert(nn.Module):
    """An expert served elsewhere, used like a local module: autograd works through it.

    ``servers``: the volunteers serving ``uid``, tried in order (failover on errors that
    another server may not have: unreachable, timed out, overloaded, paused).
    """

    def __init__(
        self,
        uid: str,
        servers: Sequence[ExpertServerRef],
        caller: ExpertCaller,
        portal: Portal,
    ) -> None:
        super().__init__()
        self.uid = uid
        self.servers = list(servers)
        self.caller = caller
        self.portal = portal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # keep the server's graph only when a backward pass may follow
        keep = torch.is_grad_enabled()
        out = _RemoteExpertFunction.apply(DUMMY, self, keep, x)  # type: ignore[no-untyped-call]
        assert isinstance(out, torch.Tensor)
        return out

    def extra_repr(self) -> str:
        return f"uid={self.uid!r}, servers={len(self.servers)}"
