"""One served expert: its module, weights identity, input checks, and the gradient
accumulator. Synchronous torch code: the server runs it in its compute thread."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from core.experts.kept import KeptBudget, KeptTensors
from core.experts.registry import ExpertSpec
from core.experts.uid import ExpertUID
from core.experts.weights import weights_hash

log = logging.getLogger(__name__)


#: Kept forward graphs one expert holds when nobody sized it from a memory plan.
DEFAULT_GRAPH_CACHE_BYTES = 64 * 1024 * 1024


class InvalidInput(ValueError):
    """A request's tensors do not fit the expert; the message says how."""


def default_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """What an expert of ``dtype`` computes in on ``device``: its own dtype on a GPU;
    float32 on a CPU, whose 16-bit matrix products run many times slower (without
    AMX). Either way its answers are the project's dtype, within an honest bound of
    the float32 reference that auditors recompute (core/experts/tolerance.py)."""
    return torch.float32 if device.type == "cpu" else dtype


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a request's tensor, in host memory) on ``device``. To a GPU through pinned
    memory (torch's caching host allocator: no new page-locked allocation per call) and
    an asynchronous copy, which the compute that follows on the same stream waits for."""
    if device.type != "cuda":
        return t.to(device)
    staged = t if t.is_pinned() else torch.empty_like(t, pin_memory=True).copy_(t)
    return staged.to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory for the wire: from a GPU into pinned memory, asynchronously,
    then waited for (the answer leaves once it is whole)."""
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host


def module_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class CacheMiss(KeyError):
    """The kept forward graph of a backward request is gone (expired or evicted)."""


@dataclass
class _Graph:
    owner: object  # who may use it: the peer that asked for the forward pass
    inputs: torch.Tensor
    outputs: torch.Tensor
    nbytes: int
    created: float


class GraphCache:
    """Autograd graphs of recent forward passes, so that a backward pass need not
    recompute them (a remote forward+backward then costs what a local one does).
    Bounded in bytes and entries, each kept at most ``ttl`` s. One owner may hold at
    most ``max_owner_bytes``; when the cache is full, the owner holding the most loses
    its oldest graph, so no caller's keep-forwards push out another's graphs."""

    def __init__(
        self,
        max_bytes: int,
        max_entries: int = 256,
        ttl: float = 60.0,
        max_owner_bytes: int | None = None,
    ) -> None:
        self.max_bytes, self.max_entries, self.ttl = max_bytes, max_entries, ttl
        self.max_owner_bytes = max_bytes // 2 if max_owner_bytes is None else max_owner_bytes
        self._graphs: OrderedDict[int, _Graph] = OrderedDict()
        self._bytes = 0
        self._by_owner: Counter[object] = Counter()
        self._next = itertools.count(1)
        self._lock = threading.Lock()
        self.hits = self.misses = self.evicted = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def held_by(self, owner: object) -> int:
        return self._by_owner[owner]

    def put(
        self, owner: object, inputs: torch.Tensor, outputs: torch.Tensor, nbytes: int
    ) -> int | None:
        if nbytes > min(self.max_bytes, self.max_owner_bytes):
            return None
        with self._lock:
            now = time.monotonic()
            self._drop_expired(now)
            handle = next(self._next)
            self._graphs[handle] = _Graph(owner, inputs, outputs, nbytes, now)
            self._bytes += nbytes
            self._by_owner[owner] += nbytes
            while self._by_owner[owner] > self.max_owner_bytes:
                self._drop_oldest_of(owner)
            while self._bytes > self.max_bytes or len(self._graphs) > self.max_entries:
                self._drop_oldest_of(max(self._by_owner, key=self._by_owner.__getitem__))
            return handle if handle in self._graphs else None

    def _drop_oldest_of(self, owner: object) -> None:
        handle = next(h for h, g in self._graphs.items() if g.owner == owner)
        self._drop(handle)
        self.evicted += 1

    def _drop(self, handle: int) -> _Graph:
        graph = self._graphs.pop(handle)
        self._bytes -= graph.nbytes
        self._by_owner[graph.owner] -= graph.nbytes
        if self._by_owner[graph.owner] <= 0:
            del self._by_owner[graph.owner]
        return graph

    def emptied(self) -> GraphCache:
        """An empty cache with this one's limits, numbering handles on from it (a handle
        names one graph, whatever weights it was kept on)."""
        fresh = GraphCache(self.max_bytes, self.max_entries, self.ttl, self.max_owner_bytes)
        fresh._next = self._next
        return fresh

    def holds(self, owner: object, handle: int) -> bool:
        with self._lock:
            graph = self._graphs.get(handle)
            return graph is not None and graph.owner == owner

    def pop(self, owner: object, handle: int) -> _Graph:
        with self._lock:
            graph = self._graphs.get(handle)
            if graph is None or graph.owner != owner:
                self.misses += 1
                raise CacheMiss(handle)
            self._drop(handle)
            if graph.created < time.monotonic() - self.ttl:
                self.misses += 1
                raise CacheMiss(handle)
            self.hits += 1
            return graph

    def __len__(self) -> int:
        return len(self._graphs)

    def expire(self) -> int:
        """Drop the graphs kept longer than ``ttl``; how many are left."""
        with self._lock:
            self._drop_expired(time.monotonic())
            return len(self._graphs)

    def _drop_expired(self, now: float) -> None:
        for handle in [h for h, g in self._graphs.items() if g.created < now - self.ttl]:
            self._drop(handle)


@dataclass
class GradientAccumulator:
    """Sums of parameter gradients since the last take(), with the samples behind them.
    The server never steps an optimizer: aggregators own the model."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    samples: int = 0
    backward_batches: int = 0
    #: the trainers' receipts of the backward requests behind the sums
    receipts: list[Any] = field(default_factory=list)
    #: their inputs and output gradients, kept for a contribution audit (when the node
    #: keeps them: a budget is given)
    kept: KeptTensors = field(default_factory=KeptTensors)
    #: sum in host memory: the accumulator of previous weights, whose late backward
    #: passes are rare, takes no device memory beyond what the memory plan counts
    on_host: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(
        self,
        module: nn.Module,
        samples: int,
        receipts: Sequence[Any] = (),
        tensors: tuple[torch.Tensor, torch.Tensor] | None = None,
        budget: KeptBudget | None = None,
    ) -> None:
        """Add ``module``'s parameter gradients (and clear them); ``tensors``: the
        inputs and output gradients that produced them, kept within ``budget``."""
        with self._lock:
            if tensors is not None:
                self.kept.keep(budget, tensors[0], tensors[1], receipts)
            self.receipts.extend(r for r in receipts if r is not None)
            for name, p in module.named_parameters():
                if p.grad is None:
                    continue
                g = p.grad.detach()
                if name in self.sums:
                    # float32 sums of the dtype's gradients, added in place (no float32
                    # copy of each gradient on the device)
                    self.sums[name].add_(g.to(self.sums[name].device))
                else:
                    where = "cpu" if self.on_host else g.device
                    self.sums[name] = g.to(where, torch.float32, copy=True)
                p.grad = None
            self.samples += samples
            self.backward_batches += 1

    def move_sums(self, device: torch.device | str) -> None:
        """The sums to ``device`` (a pausing node's to host memory, and back)."""
        with self._lock:
            self.sums = {k: v.to(device) for k, v in self.sums.items()}

    def take(self) -> tuple[dict[str, torch.Tensor], int]:
        """The sums and sample count so far; the accumulator starts again from zero."""
        sums, samples, _ = self.take_with_receipts()
        return sums, samples

    def take_with_receipts(self) -> tuple[dict[str, torch.Tensor], int, list[Any]]:
        sums, samples, receipts, _ = self.take_all()
        return sums, samples, receipts

    def take_all(self) -> tuple[dict[str, torch.Tensor], int, list[Any], KeptTensors]:
        """Sums, samples, receipts and the kept tensors behind them (whose bytes the
        caller now owns: give them back to the budget when done)."""
        with self._lock:
            out = self.sums, self.samples, self.receipts, self.kept
            self.sums, self.samples, self.backward_batches, self.receipts = {}, 0, 0, []
            self.kept = KeptTensors()
            return out


#: weights versions kept after a swap, at most: aggregators refuse contributions more
#: than the manifest's ``staleness_bound`` (4 by default) versions old, so gradients of
#: older weights would mostly be lost anyway
MAX_PREVIOUS_VERSIONS = 4


@dataclass
class PreviousWeights:
    """Weights served before a swap, kept while forward passes kept on them wait for
    their backward pass (a trainer's batch in flight across one or more swaps: with
    slow volunteers and frequent rounds, a batch's forward and backward passes can be
    rounds apart), their gradients going to their own accumulator, contributed for their
    version."""

    version: int
    module: nn.Module
    graphs: GraphCache
    accumulator: GradientAccumulator
    sha256: str = ""


class ExpertBackend:
    def __init__(
        self,
        uid: ExpertUID,
        spec: ExpertSpec,
        module: nn.Module,
        *,
        version: int = 0,
        device: torch.device | str | None = None,
        max_batch_size: int = 4096,
        graph_cache_bytes: int = DEFAULT_GRAPH_CACHE_BYTES,
        max_previous: int = MAX_PREVIOUS_VERSIONS,
    ) -> None:
        self.uid = uid
        self.spec = spec
        self.device = torch.device(device) if device is not None else default_device()
        #: what the module computes in here (the spec's dtype is what travels)
        self.compute_dtype = compute_dtype(spec.torch_dtype, self.device)
        self.sha256 = weights_hash(module)  # of the weights as published
        self.module = module.to(self.device, self.compute_dtype)
        self.module.requires_grad_(True)
        self.version = version
        self.max_batch_size = max_batch_size
        self.accumulator = GradientAccumulator()
        self.graphs = GraphCache(max_bytes=graph_cache_bytes)
        self.stale_dropped = 0  # backward batches whose receipts named replaced weights
        #: older weights still holding kept graphs, newest first
        self.previous: list[PreviousWeights] = []
        self.max_previous = max_previous
        #: where the inputs and output gradients behind contributions are kept for
        #: audits (None: not kept; set by the contribution sender, core/contributing)
        self.kept_budget: KeptBudget | None = None

    def offload(self) -> None:
        """Give the device's memory back (the node pauses: a game or the volunteer's own
        work needs it): kept graphs are dropped (their backward passes would wait for
        the pause anyway; trainers recompute elsewhere), previous weights with them, and
        the weights and gradient sums move to host memory until ``reload``. The caller
        holds the device (no batch runs)."""
        if self.device.type == "cpu":
            return
        self.graphs = self.graphs.emptied()
        for weights in self.previous:
            weights.module.to("cpu")
            weights.accumulator.move_sums("cpu")
        self.previous = [w for w in self.previous if w.accumulator.sums]
        self.module.to("cpu")
        self.accumulator.move_sums("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # back to the driver, not only to torch's cache

    def reload(self) -> None:
        """The weights and sums back on the device after ``offload``."""
        if self.device.type == "cpu":
            return
        self.module.to(self.device)
        self.accumulator.move_sums(self.device)

    def replace_weights(self, module: nn.Module, version: int, *, sha256: str = "") -> None:
        """Serve new weights from now on (the caller holds the device, so no batch runs).
        The old weights, their kept graphs and what was accumulated on them join
        ``previous``; older weights whose kept graphs are all used or expired are dropped,
        and beyond ``max_previous`` the oldest (the caller sent every accumulator's
        gradients first, see ``accumulators``). ``sha256``: the weights' hash when the
        caller checked it already (a pulled version): not computed again while every
        batch waits."""
        old = self.graphs
        self.accumulator.on_host = True
        self.previous.insert(
            0, PreviousWeights(self.version, self.module, old, self.accumulator, self.sha256)
        )
        waiting = [w for w in self.previous if w.graphs.expire()][: self.max_previous]
        # the memory plan counts one previous version (core/node/capacity.py); older ones
        # stay only while their weights fit in the kept graphs' share
        spare = old.max_bytes
        self.previous = waiting[:1]
        for weights in waiting[1:]:
            spare -= module_bytes(weights.module) + weights.graphs.nbytes
            if spare < 0:
                break
            self.previous.append(weights)
        self.sha256 = sha256 or weights_hash(module)
        self.module = module.to(self.device, self.compute_dtype)
        self.module.requires_grad_(True)
        self.version = version
        self.accumulator = GradientAccumulator()
        self.graphs = old.emptied()

    def accumulators(self) -> list[tuple[nn.Module, GradientAccumulator]]:
        """Every accumulator with gradients to send, with the module whose parameters they
        are: the previous weights' (late backward passes), oldest first, then the current
        ones'."""
        out = [(w.module, w.accumulator) for w in reversed(self.previous)]
        return [*out, (self.module, self.accumulator)]

    def sha256_of_version(self, version: int) -> str:
        """The weights hash of ``version`` if it is served or kept here, else ""."""
        if version == self.version:
            return self.sha256
        return next((w.sha256 for w in self.previous if w.version == version), "")

    def kept_version(self, owner: object, handle: int) -> int | None:
        """The weights version of a kept graph, or None when it is gone."""
        if self.graphs.holds(owner, handle):
            return self.version
        weights = self._previous_holding(owner, handle)
        return None if weights is None else weights.version

    def _previous_holding(self, owner: object, handle: int) -> PreviousWeights | None:
        return next((w for w in self.previous if w.graphs.holds(owner, handle)), None)

    # ---- checks (called on the network side, before anything is queued)

    def check_inputs(self, x: torch.Tensor) -> None:
        spec = self.spec
        if x.dtype != spec.torch_dtype:
            raise InvalidInput(f"{self.uid} takes {spec.dtype} inputs, got {x.dtype}")
        if x.dim() != spec.input_ndim or x.shape[-1] != spec.hidden:
            raise InvalidInput(
                f"{self.uid} takes [batch, hidden] with hidden={spec.hidden}, got {list(x.shape)}"
            )
        if not 1 <= x.shape[0] <= self.max_batch_size:
            raise InvalidInput(f"batch of {x.shape[0]} is outside 1..{self.max_batch_size}")
        if not torch.isfinite(x).all():
            raise InvalidInput("inputs contain NaN or infinity")

    def check_grad_outputs(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        self.check_inputs(x)
        if grad.shape != x.shape or grad.dtype != x.dtype:
            raise InvalidInput(
                f"grad_outputs {grad.dtype}{list(grad.shape)} must match "
                f"outputs {x.dtype}{list(x.shape)}"
            )
        if not torch.isfinite(grad).all():
            raise InvalidInput("grad_outputs contain NaN or infinity")

    # ---- compute (compute thread)

    def forward(
        self, x: torch.Tensor, keep: bool = False, owner: object = None
    ) -> tuple[torch.Tensor, int | None]:
        """Outputs; with ``keep``, the autograd graph is kept for a backward pass by
        ``owner`` and its handle returned (None when it does not fit the cache)."""
        x = self._in(x)
        if not keep:
            with torch.no_grad():
                out: torch.Tensor = self.module(x)
            return self._out(out), None
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.module(x)
        handle = self.graphs.put(owner, x, out, self._graph_bytes(x))
        return self._out(out.detach()), handle

    def _in(self, t: torch.Tensor) -> torch.Tensor:
        """A request's tensor on the device, in the compute dtype."""
        return to_device(t, self.device).to(self.compute_dtype)

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        """An answer in host memory, in the project's dtype."""
        return to_host(t.to(self.spec.torch_dtype))

    def _graph_bytes(self, x: torch.Tensor) -> int:
        """What a kept graph holds, roughly: the activations of every layer of every block,
        in widths of ``x`` per row (``ExpertSpec.kept_widths``)."""
        return int(x.numel() * x.element_size() * self.spec.kept_widths())

    def backward(
        self, x: torch.Tensor, grad_outputs: torch.Tensor, receipts: Sequence[Any] = ()
    ) -> torch.Tensor:
        """Input gradients for the caller; parameter gradients go to the accumulator.
        Stateless: the forward pass is recomputed from the inputs."""
        host_x = x
        x = self._in(x).detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.module(x)
            torch.autograd.backward(out, self._in(grad_outputs))
        self._accumulate(int(x.shape[0]), receipts, tensors=(host_x, grad_outputs))
        assert x.grad is not None
        return self._out(x.grad)

    def input_gradients(self, x: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
        """Input gradients alone, for an auditor's second opinion on another server's
        backward answer: no parameter gradient is computed, so nothing reaches the
        accumulator or a contribution."""
        x = self._in(x).detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.module(x)
            (grad_x,) = torch.autograd.grad(out, x, self._in(grad_outputs))
        return self._out(grad_x)

    def _accumulate(
        self,
        samples: int,
        receipts: Sequence[Any],
        weights: PreviousWeights | None = None,
        *,
        tensors: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Parameter gradients into the accumulator of the weights that computed them
        (``weights``: previous ones; None: the current ones), unless a receipt names
        other weights: the request waited while new weights were swapped in, and a
        contribution holding that receipt would be refused whole by the aggregator. Such
        rare gradients are dropped instead (the trainer still gets its input gradients)."""
        module = self.module if weights is None else weights.module
        version = self.version if weights is None else weights.version
        accumulator = self.accumulator if weights is None else weights.accumulator
        if any(getattr(r, "version", version) != version for r in receipts):
            module.zero_grad(set_to_none=True)
            self.stale_dropped += 1
            return
        accumulator.add(
            module, samples=samples, receipts=receipts, tensors=tensors, budget=self.kept_budget
        )

    def backward_kept(
        self, owner: object, handle: int, grad_outputs: torch.Tensor, receipts: Sequence[Any] = ()
    ) -> torch.Tensor:
        """Like backward, through the graph a forward pass kept (raises CacheMiss); a
        graph kept on previous weights too (its gradients are theirs)."""
        weights = None
        try:
            graph = self.graphs.pop(owner, handle)
        except CacheMiss:
            weights = self._previous_holding(owner, handle)
            if weights is None:
                raise
            graph = weights.graphs.pop(owner, handle)
        dtype = self.spec.torch_dtype
        if grad_outputs.shape != graph.outputs.shape or grad_outputs.dtype != dtype:
            raise InvalidInput(
                f"grad_outputs {grad_outputs.dtype}{list(grad_outputs.shape)} must match "
                f"outputs {dtype}{list(graph.outputs.shape)}"
            )
        torch.autograd.backward(graph.outputs, self._in(grad_outputs))
        self._accumulate(
            int(graph.inputs.shape[0]),
            receipts,
            weights,
            # as they came (exact: the compute dtype holds every value of the project's)
            tensors=(graph.inputs.detach().to(dtype), grad_outputs),
        )
        assert graph.inputs.grad is not None
        return self._out(graph.inputs.grad)


def batch_forward(
    backend: ExpertBackend, inputs: list[torch.Tensor], keep: bool, owner: object, extras: list[Any]
) -> tuple[torch.Tensor, int | None, int]:
    """A forward batch of a task pool (core/experts/batching.py): (outputs, handle of
    the kept graph or None, version of the weights that computed it)."""
    # the device is held: no new weights are swapped in while this runs
    version = backend.version
    return (*backend.forward(inputs[0], keep=keep, owner=owner), version)


def batch_backward(
    backend: ExpertBackend, inputs: list[torch.Tensor], keep: bool, owner: object, extras: list[Any]
) -> tuple[torch.Tensor, int | None, int]:
    """A backward batch of a task pool: (input gradients, None, version)."""
    version = backend.version
    return backend.backward(inputs[0], inputs[1], receipts=extras), None, version
