"""The expert server of a volunteer's node: forward, backward and info over the RPC,
batched per expert, computed off the network loop, announced in the DHT."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch
import trio

from core.experts.admission import PAUSED, ServerAdmission
from core.experts.announcer import Announcer
from core.experts.answers import (
    AnswerDraft,
    AnswerHook,
    ExpertCall,
    GraphGone,
    ReceiptCheck,
    answer_codec,
    older_weights,
    request_tensors,
    signed_reply,
)
from core.experts.backend import (
    CacheMiss,
    ExpertBackend,
    InvalidInput,
    batch_backward,
    batch_forward,
)
from core.experts.batching import Pace, Process, TaskPool, on_device
from core.experts.records import check_project
from core.experts.retries import AnsweredOnce
from core.protocol.contributions import tensor_digest
from core.protocol.expert_methods import (
    BACKWARD,
    FORWARD,
    INFO,
    Backlog,
    ExpertInfo,
    ExpertRequest,
    RequestError,
)
from net import BadRequest, CallContext, Peer, RemoteError, Reply, RequestHead, Unavailable
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)


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
    #: The rig only (the emulated swarm, so that many slow volunteers fit on one
    #: machine): how long the device is held for a batch (batching.Pace).
    pace: Pace | None = None
    #: The rig only (core/demo/cheats.py): alter every answer so before it is signed.
    answer_hook: AnswerHook | None = None


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
        config = self.config
        trainers = frozenset(peer_id_from_public_key(k) for k in config.trainers)
        self.admission = ServerAdmission(
            trainers,
            stranger_batch=config.max_stranger_batch or max(1, config.max_batch_size // 16),
            stranger_rows_per_second=config.stranger_rows_per_second,
            paused=lambda: self._paused,
        )
        self.announcer = Announcer(
            peer.dht,
            config.project,
            self.backends,
            ttl=config.announce_ttl,
            interval=config.announce_interval,
            max_batch_size=config.max_batch_size,
            withdrawn=lambda: self._paused,
            load=self.load,
        )
        self._receipt = ReceiptCheck(config.project, trainers, required=config.require_receipts)
        self._answered = AnsweredOnce()  # backward calls by receipt: a repeat gets the answer
        self._device = trio.CapacityLimiter(1)  # one batch on the device at a time
        self._forward_pools = {
            uid: self._pool(f"{uid}.forward", partial(batch_forward, b), cost=1.0)
            for uid, b in self.backends.items()
        }
        self._backward_pools = {
            uid: self._pool(f"{uid}.backward", partial(batch_backward, b), cost=2.0)
            for uid, b in self.backends.items()
        }
        self._paused = paused
        # (caller, uid, handle) -> digest of the kept inputs; handles are numbered per
        # expert, so the uid is part of the key. Oldest dropped past 4096.
        self._input_digests: dict[tuple[object, str, int], bytes] = {}

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
                await self.announcer.announce()  # started means declared, too
                nursery.start_soon(self.announcer.run)
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.announcer.withdraw()
            for method in handlers:  # another server may take over this peer's methods
                self.peer.rpc.unregister(method)

    def _pool(self, name: str, process: Process, *, cost: float) -> TaskPool:
        """``cost``: the pass's work per row, in forward passes (for the rig's pace)."""
        config, pace = self.config, self.config.pace
        return TaskPool(
            name,
            process,
            self._device,
            max_batch_size=config.max_batch_size,
            max_wait=config.max_wait,
            refuse=self.admission.refusal,
            priority=self.admission.priority,
            max_queued_per_caller=config.max_queued_per_caller,
            max_queued_strangers=config.max_queued_strangers or max(1, config.max_batch_size // 4),
            max_stranger_batch=self.admission.stranger_batch,
            paced_seconds=None if pace is None else (lambda rows: pace(cost * rows)),
        )

    def _paced(self, cost: float, rows: int) -> float | None:
        """Seconds the rig's pace holds the device for ``rows`` of ``cost`` each."""
        return None if self.config.pace is None else self.config.pace(cost * rows)

    def _screen(self, head: RequestHead) -> RemoteError | None:
        return self.admission.screen(head, self._queue_of)

    def _queue_of(self, method: str, uid: str) -> TaskPool | None:
        return (self._forward_pools if method == FORWARD else self._backward_pools).get(uid)

    async def pause(self) -> None:
        """Stop taking work at once (requests get Unavailable), then withdraw the
        declarations; returns when the withdrawal is stored."""
        self._paused = True
        await self.announcer.announce()
        # the device's memory back to the volunteer once no batch runs
        async with self._device:
            await trio.to_thread.run_sync(self._each_backend, ExpertBackend.offload)

    async def resume(self) -> None:
        async with self._device:
            await trio.to_thread.run_sync(self._each_backend, ExpertBackend.reload)
        self._paused = False
        await self.announcer.announce()

    def _each_backend(self, method: Callable[[ExpertBackend], None]) -> None:
        for backend in self.backends.values():
            method(backend)

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
        await self.announcer.announce(None if uid is None else [uid])

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

    # ------------------------------------------------------------ RPC handlers

    def _call(self, ctx: CallContext, method: str) -> ExpertCall:
        """The request, parsed, and the expert it names (refused while paused)."""
        if self._paused:
            raise Unavailable(PAUSED)
        try:
            request = ExpertRequest.parse(method, ctx.request.meta)
        except RequestError as exc:
            raise BadRequest(str(exc)) from exc
        backend = self.backends.get(request.uid)
        if backend is None:
            raise BadRequest(f"expert {request.uid!r} is not served here")
        return ExpertCall(ctx, method, request, backend)

    def _reply(
        self,
        call: ExpertCall,
        t: torch.Tensor,
        version: int,
        inputs_sha256: bytes,
        grad: torch.Tensor | None = None,
        handle: int | None = None,
    ) -> Reply:
        """The signed answer (core/experts/answers.py), with this server's backlog."""
        sign = partial(signed_reply, self.peer.identity, self.config.project)
        return sign(call, t, version, inputs_sha256, grad, self.backlog(), handle)

    def _altered(self, draft: AnswerDraft) -> torch.Tensor:
        hook = self.config.answer_hook
        return draft.answer if hook is None else hook(draft)

    def backlog(self) -> Backlog:
        """What each answer tells the caller of this server's load (core/moe/load.py):
        the work waiting here, and the work done per second on the device, in units (a
        forward row 1, a backward row 2)."""
        queue = done = seconds = 0.0
        for pools, units in ((self._forward_pools, 1.0), (self._backward_pools, 2.0)):
            for pool in pools.values():
                queue += pool.queued_samples * units
                done += pool.stats.samples * units
                seconds += pool.stats.compute_seconds
        return Backlog(queue, done / seconds if seconds > 0 else None)

    async def _forward(self, ctx: CallContext) -> Reply:
        call = self._call(ctx, FORWARD)
        backend = call.backend
        (x,) = request_tensors(call)
        answer_codec(call.request)  # refused before the work, not after
        try:
            backend.check_inputs(x)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        keep = call.request.keep and self.admission.is_trainer(call.caller)
        pool = self._forward_pools[str(backend.uid)]
        y, handle, version = await pool.submit(x, keep=keep, owner=call.caller)
        y = self._altered(AnswerDraft("forward", y, x, older_weights(backend)))
        inputs_sha256 = tensor_digest([x])
        if handle is not None:
            # the backward pass's receipt and signed answer name them
            self._input_digests[(call.caller, str(backend.uid), handle)] = inputs_sha256
            while len(self._input_digests) > 4096:
                del self._input_digests[next(iter(self._input_digests))]
        return self._reply(call, y, version, inputs_sha256, handle=handle)

    async def _backward(self, ctx: CallContext) -> Reply:
        call = self._call(ctx, BACKWARD)
        if call.request.recompute:
            return await self._recompute_backward(call)
        if call.request.receipt is None:
            return await self._backward_once(call)
        # a repeat (same receipt) gets the first answer again (core/experts/retries.py)
        key = (call.caller, call.request.receipt)
        return await self._answered.once(key, partial(self._backward_once, call))

    async def _backward_once(self, call: ExpertCall) -> Reply:
        if call.request.handle is not None:
            return await self._backward_kept(call, call.request.handle)
        x, grad = self._backward_inputs(call)
        inputs_sha256 = tensor_digest([x])
        receipt = self._receipt(call, inputs_sha256, grad)
        grad_x, _, version = await self._backward_pools[str(call.backend.uid)].submit(
            x, grad, owner=call.caller, extra=receipt
        )
        return self._backward_reply(call, grad_x, version, inputs_sha256, grad)

    def _backward_inputs(self, call: ExpertCall) -> tuple[torch.Tensor, torch.Tensor]:
        """A backward request's inputs and output gradients, checked (its answer's codec
        too: refused before the work, not after)."""
        x, grad = request_tensors(call)
        answer_codec(call.request)
        try:
            call.backend.check_grad_outputs(x, grad)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        return x, grad

    def _backward_reply(
        self,
        call: ExpertCall,
        grad_x: torch.Tensor,
        version: int,
        inputs_sha256: bytes,
        grad: torch.Tensor,
    ) -> Reply:
        """The signed answer of a backward pass."""
        older = older_weights(call.backend)
        grad_x = self._altered(AnswerDraft("backward", grad_x, grad, older))
        return self._reply(call, grad_x, version, inputs_sha256, grad)

    async def _recompute_backward(self, call: ExpertCall) -> Reply:
        """Input gradients at the current weights that go into no contribution: a
        trainer's second opinion on another server's backward answer (core/moe/audit.py),
        for a trainer without the room for the weights. Only the manifest's trainers
        may ask: the work earns the volunteer nothing."""
        if not self.admission.is_trainer(call.caller):
            raise BadRequest("only the project's trainers may ask for a recomputation")
        x, grad = self._backward_inputs(call)
        backend = call.backend

        def run() -> tuple[torch.Tensor, int]:
            # the device is held: no new weights are swapped in while this runs
            return backend.input_gradients(x, grad), backend.version

        (grad_x, version), _ = await on_device(
            self._device,
            run,
            paced_seconds=self._paced(3.0, x.shape[0]),  # forward, backward
        )
        return self._backward_reply(call, grad_x, version, tensor_digest([x]), grad)

    async def _backward_kept(self, call: ExpertCall, handle: int) -> Reply:
        """Backward through the graph a forward pass kept: only grad_outputs travel."""
        backend, caller = call.backend, call.caller
        (grad,) = request_tensors(call)
        answer_codec(call.request)
        if grad.dtype != backend.spec.torch_dtype or not torch.isfinite(grad).all():
            raise BadRequest(f"grad_outputs must be finite {backend.spec.dtype}")
        gone = f"forward graph {handle} is gone; send the inputs again"
        # the weights that kept the graph compute its backward pass, whatever was swapped
        # in since
        version = backend.kept_version(caller, handle)
        digest = self._input_digests.pop((caller, str(backend.uid), handle), None)
        if version is None or digest is None:
            raise GraphGone(gone)
        # a graph kept across a swap of weights: the receipt names the old version
        receipt = self._receipt(call, digest, grad, version=version)
        run = partial(backend.backward_kept, caller, handle, grad, receipts=[receipt])
        try:  # held on the device (and paced) like the pools' backward batches
            grad_x, _ = await on_device(
                self._device, run, paced_seconds=self._paced(2.0, grad.shape[0])
            )
        except CacheMiss:
            raise GraphGone(gone) from None
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from exc
        return self._backward_reply(call, grad_x, version, digest, grad)

    async def _info(self, ctx: CallContext) -> Reply:
        backend = self._call(ctx, INFO).backend
        uid = str(backend.uid)
        info = ExpertInfo(
            uid,
            backend.spec.to_dict(),
            backend.version,
            backend.sha256,
            self.config.max_batch_size,
            self.load(uid),
            self.backlog(),
        )
        return Reply(info.to_meta())
