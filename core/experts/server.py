"""The expert server of a volunteer's node: forward, backward and info over the RPC,
batched per expert, computed off the network loop, announced in the DHT."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
import trio
from torch import nn

from core.experts import activations
from core.experts.activations import ActivationCodecError
from core.experts.backend import CacheMiss, ExpertBackend, InvalidInput
from core.experts.batching import STRANGER, TRAINER, Process, TaskPool, on_device
from core.experts.cheats import Answering, Cheat
from core.experts.records import (
    SERVING,
    WITHDRAWN,
    ExpertAnnouncement,
    PrefixAnnouncement,
    check_project,
    expert_key,
    prefix_children,
)
from core.protocol.answers import NONE, AnswerStatement, parts_digest
from core.protocol.contributions import MessageError, Receipt, tensor_digest
from core.protocol.expert_methods import BACKWARD, FORWARD, GRAPH_GONE, INFO
from net import (
    BadRequest,
    CallContext,
    DhtError,
    Overloaded,
    Peer,
    RateLimited,
    RemoteError,
    Reply,
    RequestHead,
    TooLarge,
    Unavailable,
)
from net.identity import peer_id_from_public_key
from net.ratelimit import Admission, PeerRateLimiter, RateLimits

log = logging.getLogger(__name__)

#: Declarations (DHT puts) in flight at once.
DECLARE_AT_ONCE = 4

#: The rate limiter's key for all strangers together.
_ALL_STRANGERS = "*"


@dataclass(frozen=True)
class ServerConfig:
    project: str = "demo"
    #: Largest batch run at once, in samples (requests are joined up to it).
    max_batch_size: int = 4096
    #: Seconds a batch may wait for more requests before it runs (0: never waits).
    max_wait: float = 0.0
    #: Declarations are re-put this often and live this long in the DHT.
    announce_interval: float = 30.0
    announce_ttl: float = 90.0
    #: Refuse backward requests without a valid receipt of the trainer (needed for the
    #: parameter gradients to become contributions; off for the demo project).
    require_receipts: bool = False
    #: The project's trainers (public keys, from the manifest). Their requests are
    #: served before strangers', and only theirs may keep forward graphs here (a
    #: stranger's backward pass would need a trainer's receipt anyway). Empty: every
    #: caller is treated alike (the demo project).
    trainers: frozenset[bytes] = frozenset()
    #: Samples one caller may have waiting per expert and operation (None: 2x
    #: max_batch_size).
    max_queued_per_caller: int | None = None
    #: When trainers are listed, strangers are served from what is left, in small
    #: batches: at most this many samples waiting, all strangers together (None: a
    #: quarter of max_batch_size), and this many per request and per batch (None: a
    #: sixteenth), so that a trainer arriving behind them waits one short batch at most.
    max_queued_strangers: int | None = None
    max_stranger_batch: int | None = None
    #: Rows one source address of strangers may send per second (None: 4 stranger
    #: batches); beyond, requests are refused RateLimited, an offence that gets a
    #: source that keeps at it banned (net/transport/admission.py).
    stranger_rows_per_second: float | None = None
    #: The emulated swarm only (0 in real use): a forward pass takes this many seconds
    #: per row and a backward pass twice that, whatever this computer's speed (it sleeps
    #: the rest), so that many slow volunteers fit on one machine.
    emulated_seconds_per_row: float = 0.0
    #: Demo and tests only: alter every answer so (core/experts/cheats.py); None, always,
    #: for an honest node.
    cheat: Cheat | None = None


class ExpertServer:
    def __init__(
        self,
        peer: Peer,
        backends: Mapping[str, ExpertBackend],
        config: ServerConfig | None = None,
        *,
        paused: bool = False,
    ) -> None:
        """``paused``: start without taking work (declared as withdrawn until resumed)."""
        self.peer = peer
        self.backends = dict(backends)
        self.config = config or ServerConfig()
        check_project(self.config.project)
        self._trainers = frozenset(peer_id_from_public_key(k) for k in self.config.trainers)
        rows_per_second = self.config.stranger_rows_per_second or 4.0 * self._stranger_batch
        self._stranger_rates: PeerRateLimiter[str] = PeerRateLimiter(
            RateLimits(requests_per_second=rows_per_second, request_burst=2 * rows_per_second)
        )
        self._device = trio.CapacityLimiter(1)  # one batch on the device at a time
        self._forward_pools = {
            uid: self._pool(f"{uid}.forward", partial(_run_forward, b), cost=1.0)
            for uid, b in self.backends.items()
        }
        self._backward_pools = {
            uid: self._pool(f"{uid}.backward", partial(_run_backward, b), cost=2.0)
            for uid, b in self.backends.items()
        }
        self._paused = paused
        self._announcing = trio.Lock()
        # (caller, uid, handle) -> digest of the kept inputs; handles are numbered per
        # expert, so the uid is part of the key. Oldest dropped past 4096.
        self._input_digests: dict[tuple[object, str, int], bytes] = {}
        self._receipt_batches: dict[bytes, None] = {}  # an ordered set, oldest dropped

    # ------------------------------------------------------------ lifecycle

    async def run(
        self, *, task_status: trio.TaskStatus[ExpertServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        handlers = {FORWARD: self._forward, BACKWARD: self._backward, INFO: self._info}
        for method, handler in handlers.items():
            screen = self._screen if method in (FORWARD, BACKWARD) else None
            self.peer.rpc.register(method, handler, screen=screen)
        try:
            async with trio.open_nursery() as nursery:
                for pool in [*self._forward_pools.values(), *self._backward_pools.values()]:
                    await nursery.start(pool.run)
                await self._announce_current()  # started means declared, too
                nursery.start_soon(self._announce_loop)
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._announce(withdraw=True)
            for method in handlers:  # another server may take over this peer's methods
                self.peer.rpc.unregister(method)

    def _pool(self, name: str, process: Process, *, cost: float) -> TaskPool:
        """``cost``: the pass's work per row, in forward passes (for the emulation)."""
        config = self.config
        per_row = cost * config.emulated_seconds_per_row
        return TaskPool(
            name,
            process,
            self._device,
            max_batch_size=config.max_batch_size,
            max_wait=config.max_wait,
            refuse=self._refusal,
            priority=self._priority,
            max_queued_per_caller=config.max_queued_per_caller,
            max_queued_strangers=config.max_queued_strangers or max(1, config.max_batch_size // 4),
            max_stranger_batch=self._stranger_batch,
            emulated_seconds=(lambda rows: rows * per_row) if per_row > 0 else None,
        )

    @property
    def _stranger_batch(self) -> int:
        return self.config.max_stranger_batch or max(1, self.config.max_batch_size // 16)

    def _screen(self, head: RequestHead) -> RemoteError | None:
        """Refuse from the header, before the payload is read: a stranger's request
        larger than a stranger's batch, or one that would not be queued now."""
        if self._paused:
            return Unavailable("this volunteer is paused")
        uid = head.meta.get("uid")
        pools = self._forward_pools if head.method == FORWARD else self._backward_pools
        pool = pools.get(uid) if isinstance(uid, str) else None
        if pool is None or not head.specs or not head.specs[0][1]:
            return None  # the handler explains what is wrong
        rows = head.specs[0][1][0]
        if not self._is_trainer(head.peer_id):
            if rows > self._stranger_batch:
                return TooLarge(f"this server takes at most {self._stranger_batch} rows from you")
            admission = self._stranger_rates.admit(
                head.source, 0, trio.current_time(), requests=float(rows)
            )
            if admission is not Admission.ADMIT:
                return RateLimited("too many rows from your address; slow down")
            # all strangers together, from however many addresses: a few times one's
            # share, so the device mostly waits for the project's trainers
            everyone = self._stranger_rates.admit(
                _ALL_STRANGERS, 0, trio.current_time(), requests=float(rows) / 4
            )
            if everyone is not Admission.ADMIT:
                return Overloaded("serving strangers at full rate; retry later")
        if not pool.room_for(head.peer_id, rows):
            return Overloaded(f"{pool.name}: queue full; retry later")
        return None

    def _is_trainer(self, caller: object) -> bool:
        return not self._trainers or caller in self._trainers

    def _priority(self, caller: object) -> int:
        return TRAINER if self._is_trainer(caller) else STRANGER

    def _refusal(self) -> BaseException | None:
        return Unavailable("this volunteer is paused") if self._paused else None

    async def pause(self) -> None:
        """Stop taking work at once (requests get Unavailable), then withdraw the
        declarations; returns when the withdrawal is stored."""
        self._paused = True
        await self._announce_current()

    async def resume(self) -> None:
        self._paused = False
        await self._announce_current()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def device(self) -> trio.CapacityLimiter:
        """Held while a batch computes: hold it to change weights between batches."""
        return self._device

    async def announce_now(self, uid: str | None = None) -> None:
        """Declare again at once: every expert, or only ``uid`` (its new weights were
        swapped in: the others' records and the prefixes have not changed, and
        declaring all after each of a round's swaps made a node's DHT traffic grow with
        the square of its experts)."""
        await self._announce_current(None if uid is None else [uid])

    def compute_seconds(self) -> float:
        """Seconds the device has spent on batches since the server started."""
        pools = [*self._forward_pools.values(), *self._backward_pools.values()]
        return sum(p.stats.compute_seconds for p in pools)

    def samples_done(self) -> int:
        """Samples computed (forward and backward) since the server started."""
        pools = [*self._forward_pools.values(), *self._backward_pools.values()]
        return sum(p.stats.samples for p in pools)

    def load(self, uid: str) -> float:
        queued = self._forward_pools[uid].queued_samples + self._backward_pools[uid].queued_samples
        return queued / self.config.max_batch_size

    # ------------------------------------------------------------ DHT declarations

    async def _announce_loop(self) -> None:
        while True:
            await trio.sleep(self.config.announce_interval)
            await self._announce_current()

    async def _announce_current(self, only: list[str] | None = None) -> None:
        # One announcement at a time: a withdrawal must not be overtaken by the records
        # of an announcement that started before it (newest record wins in the DHT).
        async with self._announcing:
            await self._announce(withdraw=self._paused, only=only)

    async def _announce(self, *, withdraw: bool, only: list[str] | None = None) -> None:
        """Put (or withdraw) every declaration: one record per expert, one per prefix
        (``only``: just these experts' records). Withdrawing puts newer records saying
        so, which replace ours everywhere."""
        project, ttl = self.config.project, self.config.announce_ttl
        puts: list[tuple[str, bytes]] = []
        for uid, backend in self.backends.items():
            if only is not None and uid not in only:
                continue
            ann = ExpertAnnouncement(
                uid,
                WITHDRAWN if withdraw else SERVING,
                backend.version,
                backend.sha256,
                0.0 if withdraw else self.load(uid),
                self.config.max_batch_size,
            )
            puts.append((expert_key(project, uid), ann.encode()))
        for prefix, coords in prefix_children(list(self.backends) if only is None else []).items():
            puts.append(
                (
                    expert_key(project, prefix),
                    PrefixAnnouncement(() if withdraw else tuple(coords)).encode(),
                )
            )

        failed: list[str] = []
        # a few at a time: 32 experts and their prefixes at once were ~200 DHT queries
        # in flight, which on a busy computer timed out (an owner's first project: a
        # third of the declarations failed, and the trainer lost sight of experts)
        limiter = trio.CapacityLimiter(DECLARE_AT_ONCE)

        async def put(key: str, value: bytes) -> None:
            async with limiter:
                try:
                    await self.peer.dht.put(key, value, ttl=ttl)
                except DhtError as exc:
                    failed.append(f"{key.rsplit('/', 1)[-1]}: {exc}")

        async with trio.open_nursery() as nursery:
            for key, value in puts:
                nursery.start_soon(put, key, value)
        if failed:  # one line a round, not one per record
            log.warning(
                "could not declare %d of %d records (%s)", len(failed), len(puts), failed[0]
            )

    # ------------------------------------------------------------ RPC handlers

    def _backend(self, ctx: CallContext) -> ExpertBackend:
        if self._paused:
            raise Unavailable("this volunteer is paused")
        uid = ctx.request.meta.get("uid")
        backend = self.backends.get(uid) if isinstance(uid, str) else None
        if backend is None:
            raise BadRequest(f"expert {uid!r} is not served here")
        return backend

    def _tensors(self, ctx: CallContext, backend: ExpertBackend, count: int) -> list[torch.Tensor]:
        """The request's ``count`` tensors, decoded with the codecs its ``codecs`` field
        names (one per tensor; none: raw), each checked before it is decoded."""
        codecs = ctx.request.meta.get("codecs", ["raw"] * count)
        if not isinstance(codecs, list) or len(codecs) != count:
            raise BadRequest(f"codecs must name {count} codec(s)")
        try:
            names = [activations.check_codec(c) for c in codecs]
        except ActivationCodecError as exc:
            raise BadRequest(str(exc)) from exc
        sizes = [activations.parts_per_tensor(n) for n in names]
        wires = ctx.request.tensors
        if len(wires) != sum(sizes):
            raise BadRequest(f"expected {sum(sizes)} tensor(s), got {len(wires)}")
        out, at = [], 0
        spec = backend.spec
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

    def _answer_codec(self, ctx: CallContext) -> str:
        try:
            return activations.check_codec(ctx.request.meta.get("answer", "raw"))
        except ActivationCodecError as exc:
            raise BadRequest(str(exc)) from exc

    def _reply(
        self,
        ctx: CallContext,
        backend: ExpertBackend,
        t: torch.Tensor,
        version: int,
        kind: Literal["forward", "backward"],
        inputs_sha256: bytes,
        grad: torch.Tensor | None = None,
        **meta: Any,
    ) -> Reply:
        """``t`` in the codec the request asked its answer in, naming the ``version`` of
        the weights that computed it, with this volunteer's signed statement of what it
        computed from what (``inputs_sha256``: of the inputs; ``grad``: the output
        gradients of a backward pass)."""
        codec = self._answer_codec(ctx)
        if codec != "raw":
            meta["codec"] = codec
        meta["seconds"] = round(trio.current_time() - ctx.arrived, 4)
        parts = tuple(activations.encode(t, codec))
        meta["statement"] = AnswerStatement.sign(
            self.peer.identity,
            project=self.config.project,
            uid=str(backend.uid),
            version=version,
            kind=kind,
            codec=codec,
            inputs_sha256=inputs_sha256,
            grads_sha256=NONE if grad is None else tensor_digest([grad]),
            answer_sha256=parts_digest(parts),
        ).encode()
        identity = {"version": version, "sha256": backend.sha256_of_version(version)}
        return Reply({**identity, **self.backlog(), **meta}, parts)

    def _identity(self, backend: ExpertBackend) -> dict[str, Any]:
        return {"version": backend.version, "sha256": backend.sha256, **self.backlog()}

    def backlog(self) -> dict[str, float]:
        """What each answer tells the caller of this server's load (core/moe/load.py):
        ``queue``, the work waiting here, and ``rate``, the work done per second on the
        device, in units (a forward row 1, a backward row 2)."""
        queue = done = seconds = 0.0
        for pools, units in ((self._forward_pools, 1.0), (self._backward_pools, 2.0)):
            for pool in pools.values():
                queue += pool.queued_samples * units
                done += pool.stats.samples * units
                seconds += pool.stats.compute_seconds
        out = {"queue": queue}
        if seconds > 0:
            out["rate"] = done / seconds
        return out

    async def _forward(self, ctx: CallContext) -> Reply:
        backend = self._backend(ctx)
        (x,) = self._tensors(ctx, backend, 1)
        self._answer_codec(ctx)  # refused before the work, not after
        try:
            backend.check_inputs(x)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        keep = ctx.request.meta.get("keep") is True and self._is_trainer(ctx.peer_id)
        pool = self._forward_pools[str(backend.uid)]
        y, handle, version = await pool.submit(x, keep=keep, owner=ctx.peer_id)
        if self.config.cheat is not None:
            y = self.config.cheat(Answering("forward", y, x, _older(backend)))
        meta: dict[str, Any] = {}
        inputs_sha256 = tensor_digest([x])
        if handle is not None:
            meta["handle"] = handle
            # the backward pass's receipt and signed answer name them
            key = (ctx.peer_id, str(backend.uid), handle)
            self._input_digests[key] = inputs_sha256
            while len(self._input_digests) > 4096:
                del self._input_digests[next(iter(self._input_digests))]
        return self._reply(ctx, backend, y, version, "forward", inputs_sha256, **meta)

    async def _backward(self, ctx: CallContext) -> Reply:
        backend = self._backend(ctx)
        handle = ctx.request.meta.get("handle")
        if handle is not None:
            return await self._backward_kept(ctx, backend, handle)
        if ctx.request.meta.get("recompute") is True:
            return await self._recompute_backward(ctx, backend)
        x, grad = self._backward_inputs(ctx, backend)
        inputs_sha256 = tensor_digest([x])
        receipt = self._receipt(ctx, backend, inputs_sha256, grad)
        grad_x, _, version = await self._backward_pools[str(backend.uid)].submit(
            x, grad, owner=ctx.peer_id, extra=receipt
        )
        return self._backward_reply(ctx, backend, grad_x, version, inputs_sha256, grad)

    def _backward_inputs(
        self, ctx: CallContext, backend: ExpertBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A backward request's inputs and output gradients, checked (its answer's codec
        too: refused before the work, not after)."""
        x, grad = self._tensors(ctx, backend, 2)
        self._answer_codec(ctx)
        try:
            backend.check_grad_outputs(x, grad)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        return x, grad

    def _backward_reply(
        self,
        ctx: CallContext,
        backend: ExpertBackend,
        grad_x: torch.Tensor,
        version: int,
        inputs_sha256: bytes,
        grad: torch.Tensor,
    ) -> Reply:
        """The signed answer of a backward pass (altered first by a demo cheat)."""
        if self.config.cheat is not None:
            grad_x = self.config.cheat(Answering("backward", grad_x, grad, _older(backend)))
        return self._reply(
            ctx, backend, grad_x, version, "backward", inputs_sha256, grad, gradient=True
        )

    async def _recompute_backward(self, ctx: CallContext, backend: ExpertBackend) -> Reply:
        """Input gradients at the current weights that go into no contribution: a
        trainer's second opinion on another server's backward answer (core/moe/audit.py),
        for a trainer without the room for the weights. Only the manifest's trainers
        may ask: the work earns the volunteer nothing."""
        if not self._is_trainer(ctx.peer_id):
            raise BadRequest("only the project's trainers may ask for a recomputation")
        x, grad = self._backward_inputs(ctx, backend)
        per_row = 3 * self.config.emulated_seconds_per_row  # forward, then backward

        def run() -> tuple[torch.Tensor, int]:
            # the device is held: no new weights are swapped in while this runs
            return backend.input_gradients(x, grad), backend.version

        (grad_x, version), _ = await on_device(
            self._device, run, emulated_seconds=x.shape[0] * per_row if per_row > 0 else None
        )
        return self._backward_reply(ctx, backend, grad_x, version, tensor_digest([x]), grad)

    def _receipt(
        self,
        ctx: CallContext,
        backend: ExpertBackend,
        inputs_digest: bytes,
        grad: torch.Tensor,
        *,
        version: int | None = None,
    ) -> Receipt | None:
        """The request's receipt, checked against what the request carries and the
        weights that will compute it (``version``; None: the current ones)."""
        raw = ctx.request.meta.get("receipt")
        if not self.config.require_receipts:
            return None
        if not isinstance(raw, bytes):
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
            (bool(self._trainers) and signer not in self._trainers, "signer is no trainer"),
            (signer != ctx.peer_id, "sent by someone other than its signer"),
            (receipt.project != self.config.project, "project"),
            (receipt.uid != str(backend.uid), "uid"),
            (receipt.version != (backend.version if version is None else version), "version"),
            (receipt.samples != grad.shape[0], "samples"),
            (receipt.grads_sha256 != tensor_digest([grad]), "grad_outputs hash"),
            (receipt.inputs_sha256 != inputs_digest, "inputs hash"),
            (receipt.batch_id in self._receipt_batches, "batch id used before"),
        ]
        wrong = [what for bad, what in problems if bad]
        if wrong:
            raise BadRequest(f"receipt does not match the request: {', '.join(wrong)}")
        self._receipt_batches[receipt.batch_id] = None
        while len(self._receipt_batches) > 1_000_000:
            del self._receipt_batches[next(iter(self._receipt_batches))]
        return receipt

    async def _backward_kept(
        self, ctx: CallContext, backend: ExpertBackend, handle: object
    ) -> Reply:
        """Backward through the graph a forward pass kept: only grad_outputs travel."""
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise BadRequest("handle must be an integer")
        (grad,) = self._tensors(ctx, backend, 1)
        self._answer_codec(ctx)
        if grad.dtype != backend.spec.torch_dtype or not torch.isfinite(grad).all():
            raise BadRequest(f"grad_outputs must be finite {backend.spec.dtype}")
        receipt = None
        # the weights that kept the graph compute its backward pass, whatever was swapped
        # in since
        version = backend.kept_version(ctx.peer_id, handle)
        if version is None:
            raise GraphGone(f"forward graph {handle} is gone; send the inputs again")
        digest = self._input_digests.pop((ctx.peer_id, str(backend.uid), handle), None)
        if digest is None:
            raise GraphGone(f"forward graph {handle} is gone; send the inputs again")
        # a graph kept across a swap of weights: the receipt names the old version
        receipt = self._receipt(ctx, backend, digest, grad, version=version)
        try:
            grad_x = await self._kept_on_device(
                partial(backend.backward_kept, ctx.peer_id, handle, grad, receipts=[receipt]),
                rows=grad.shape[0],
            )
        except CacheMiss:
            raise GraphGone(f"forward graph {handle} is gone; send the inputs again") from None
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        return self._backward_reply(ctx, backend, grad_x, version, digest, grad)

    async def _kept_on_device(self, run: Callable[[], torch.Tensor], *, rows: int) -> torch.Tensor:
        """A backward pass through a kept graph on the device (emulated like the pools'
        backward batches)."""
        per_row = 2 * self.config.emulated_seconds_per_row
        out, _ = await on_device(
            self._device, run, emulated_seconds=rows * per_row if per_row > 0 else None
        )
        return out

    async def _info(self, ctx: CallContext) -> Reply:
        backend = self._backend(ctx)
        uid = str(backend.uid)
        return Reply(
            {
                **self._identity(backend),
                "uid": uid,
                "spec": backend.spec.to_dict(),
                "max_batch": self.config.max_batch_size,
                "load": self.load(uid),
            }
        )


def _older(backend: ExpertBackend) -> nn.Module | None:
    """The weights the expert served before its current version (for a cheat)."""
    return backend.previous[0].module if backend.previous else None


class GraphGone(RemoteError):
    code = GRAPH_GONE


def _run_forward(
    backend: ExpertBackend, inputs: list[torch.Tensor], keep: bool, owner: object, extras: list[Any]
) -> tuple[torch.Tensor, int | None, int]:
    # the device is held: no new weights are swapped in while this runs
    version = backend.version
    return (*backend.forward(inputs[0], keep=keep, owner=owner), version)


def _run_backward(
    backend: ExpertBackend, inputs: list[torch.Tensor], keep: bool, owner: object, extras: list[Any]
) -> tuple[torch.Tensor, int | None, int]:
    version = backend.version
    return backend.backward(inputs[0], inputs[1], receipts=extras), None, version
