"""Batches concurrent requests for one expert and runs them off the network loop, fairly.

A pool per (expert, operation) queues requests per caller; its loop takes the next batch
(up to max_batch_size samples), concatenates along the batch dimension, runs it in a
worker thread under the device limiter (one batch on the device at a time), and splits
the results. No request waits for company: while one batch computes, the next one forms,
so batches grow with load and a lone request pays no added latency (``max_wait`` can
trade latency for bigger batches).

Fairness (issue 14): measured before, 40 identities sending maximum batches raised an
honest trainer's step from ~7 ms of RPC to 5.2 s, because the queue was first come,
first served across all callers. Now:

* callers are served in priority classes: the project's trainers (whose receipts make
  the work count) before strangers, so no crowd of strangers delays a trainer by more
  than the batch already on the device;
* within a class, callers take turns, one request each (round robin), so a caller
  that queues much waits for itself, not others;
* a caller may have at most ``max_queued_per_caller`` samples waiting, and strangers
  together at most ``max_queued_strangers``; beyond, requests are refused Overloaded
  (the caller backs off) instead of growing a queue without end.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
import trio

from net import Overloaded

log = logging.getLogger(__name__)

#: The emulated swarm's pace (the rig: core/demo/emulated.py): the seconds the device is
#: held for a batch of this much work, in forward rows (a backward row is 2), whatever
#: this computer's speed. None in real use: a batch takes what it takes.
Pace = Callable[[float], float]

#: Runs one batch: (batched input tensors, keep, owner, extras) -> (outputs, handle of a
#: kept autograd graph or None, the version of the weights that computed them). ``keep``
#: is only ever True for a batch of a single request, whose caller is ``owner``;
#: ``extras`` holds each request's extra (receipts).
Process = Callable[
    [list[torch.Tensor], bool, object, list[Any]], tuple[torch.Tensor, int | None, int]
]

#: Priority classes: lower runs first.
TRAINER = 0
STRANGER = 1

T = TypeVar("T")


class QueueFull(Exception):
    """A request would pass its caller's (or the strangers') share of the queue."""


@dataclass
class _Caller(Generic[T]):
    priority: int
    items: deque[tuple[T, int, bool]] = field(default_factory=deque)  # (item, size, solo)
    samples: int = 0


class FairQueue(Generic[T]):
    """Requests by caller, served by priority class then in turns. Pure: no I/O, no
    clock; the pool (below) drives it."""

    def __init__(self, max_per_caller: int, max_strangers: int) -> None:
        self.max_per_caller = max_per_caller
        self.max_strangers = max_strangers
        self._callers: dict[Hashable, _Caller[T]] = {}
        # per class, callers with something queued, in turn order
        self._turns: dict[int, deque[Hashable]] = {}
        self.samples = 0
        self._stranger_samples = 0

    def __len__(self) -> int:
        return sum(len(c.items) for c in self._callers.values())

    @property
    def stranger_samples(self) -> int:
        return self._stranger_samples

    def queued_for(self, caller: Hashable) -> int:
        entry = self._callers.get(caller)
        return entry.samples if entry is not None else 0

    def push(
        self, caller: Hashable, item: T, size: int, priority: int, *, solo: bool = False
    ) -> None:
        """Queue ``item`` (``size`` samples) for ``caller``; QueueFull when it would pass
        the caller's share, or the strangers' share for a caller that is no trainer.
        ``solo``: the item runs in a batch of its own (a forward pass whose graph is
        kept for the caller's backward pass)."""
        entry = self._callers.get(caller)
        queued = entry.samples if entry is not None else 0
        if queued + size > self.max_per_caller:
            raise QueueFull(f"more than {self.max_per_caller} samples queued by one caller")
        if priority > TRAINER and self._stranger_samples + size > self.max_strangers:
            raise QueueFull(f"more than {self.max_strangers} samples queued by strangers")
        if entry is None:
            entry = self._callers[caller] = _Caller(priority)
        if not entry.items:
            self._turns.setdefault(entry.priority, deque()).append(caller)
        entry.items.append((item, size, solo))
        entry.samples += size
        self.samples += size
        if entry.priority > TRAINER:
            self._stranger_samples += size

    def take_batch(self, max_size: int, max_strangers: int | None = None) -> list[T]:
        """The next batch: classes in order, callers in turn, one request each, until
        the next request would not fit. Strangers' requests take at most
        ``max_strangers`` samples of it (their batches hold the device briefly, so a
        trainer arriving meanwhile waits little). At least one request when any is
        queued."""
        batch: list[T] = []
        size = 0
        strangers = 0
        for priority in sorted(self._turns):
            turns = self._turns[priority]
            while turns:
                caller = turns[0]
                entry = self._callers[caller]
                item, n, solo = entry.items[0]
                if batch and (solo or size + n > max_size):
                    return batch
                if (
                    batch
                    and priority > TRAINER
                    and max_strangers is not None
                    and strangers + n > max_strangers
                ):
                    return batch
                entry.items.popleft()
                entry.samples -= n
                self.samples -= n
                if entry.priority > TRAINER:
                    self._stranger_samples -= n
                batch.append(item)
                size += n
                if priority > TRAINER:
                    strangers += n
                turns.popleft()
                if entry.items:
                    turns.append(caller)  # its next request waits for everyone else's turn
                else:
                    del self._callers[caller]
                if solo:
                    return batch
            del self._turns[priority]
        return batch


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``fn(*args)`` and the seconds it took (measured in the thread that ran it)."""
    started = time.perf_counter()
    return fn(*args), time.perf_counter() - started


async def on_device(
    device: trio.CapacityLimiter,
    fn: Callable[..., T],
    *args: Any,
    paced_seconds: float | None = None,
) -> tuple[T, float]:
    """``fn(*args)`` in a worker thread holding ``device``, and the seconds the device was
    busy with it. With ``paced_seconds`` (the emulated swarm), the device is held that
    long from when it is acquired, sleeping whatever ``fn`` did not take."""
    if paced_seconds is None:
        return await trio.to_thread.run_sync(_timed, fn, *args, limiter=device)
    async with device:
        result, seconds = await trio.to_thread.run_sync(_timed, fn, *args)
        if paced_seconds > seconds:
            await trio.sleep(paced_seconds - seconds)
            seconds = paced_seconds
    return result, seconds


@dataclass(eq=False)
class _Task:
    tensors: tuple[torch.Tensor, ...]
    size: int
    keep: bool = False
    owner: object = None
    extra: Any = None
    done: trio.Event = field(default_factory=trio.Event)
    result: torch.Tensor | None = None
    handle: int | None = None
    version: int = 0
    error: BaseException | None = None
    abandoned: bool = False


@dataclass
class PoolStatistics:
    batches: int = 0
    samples: int = 0
    largest_batch: int = 0
    compute_seconds: float = 0.0
    #: requests refused because their caller (or the strangers) had too much queued
    refused: int = 0


class TaskPool:
    def __init__(
        self,
        name: str,
        process: Process,
        device_limiter: trio.CapacityLimiter,
        *,
        max_batch_size: int,
        max_wait: float = 0.0,
        refuse: Callable[[], BaseException | None] | None = None,
        priority: Callable[[object], int] = lambda owner: TRAINER,
        max_queued_per_caller: int | None = None,
        max_queued_strangers: int | None = None,
        max_stranger_batch: int | None = None,
        paced_seconds: Callable[[int], float] | None = None,
    ) -> None:
        """``paced_seconds``: how long a batch of so many rows takes on the device
        being emulated (the emulated swarm); the device is held that long, sleeping
        whatever the real computation did not take."""
        self.name = name
        self._process = process
        #: asked before each batch: an error to fail it with instead of computing (pause)
        self._refuse = refuse
        self._priority = priority
        self._limiter = device_limiter
        self._paced_seconds = paced_seconds
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self._queue: FairQueue[_Task] = FairQueue(
            max_queued_per_caller or 2 * max_batch_size,
            max_queued_strangers or 4 * max_batch_size,
        )
        self.max_stranger_batch = max_stranger_batch
        self._arrivals = trio.lowlevel.ParkingLot()
        self.stats = PoolStatistics()

    @property
    def queued_samples(self) -> int:
        return self._queue.samples

    def room_for(self, owner: object, size: int) -> bool:
        """Whether a request of ``size`` samples from ``owner`` would be queued now."""
        queue = self._queue
        if queue.queued_for(owner) + size > queue.max_per_caller:
            return False
        return self._priority(owner) == TRAINER or queue.stranger_samples + size <= (
            queue.max_strangers
        )

    async def submit(
        self, *tensors: torch.Tensor, keep: bool = False, owner: object = None, extra: Any = None
    ) -> tuple[torch.Tensor, int | None, int]:
        """Run ``process`` on these tensors (batched with others); returns its output rows,
        the kept graph's handle when ``keep`` was asked and the request ran alone, and the
        version of the weights that computed them (new weights may be swapped in before
        the caller answers: an answer names the weights that made it, which an audit
        recomputes). Raises Overloaded when ``owner`` (or the strangers) already queued too much."""
        task = _Task(tensors, int(tensors[0].shape[0]), keep, owner, extra)
        try:
            self._queue.push(owner, task, task.size, self._priority(owner), solo=keep)
        except QueueFull as exc:
            self.stats.refused += 1
            raise Overloaded(f"{self.name}: {exc}; retry later") from None
        self._arrivals.unpark_all()
        try:
            await task.done.wait()
        except BaseException:
            task.abandoned = True  # the caller left (deadline); skip it if not started
            raise
        if task.error is not None:
            raise task.error
        assert task.result is not None
        return task.result, task.handle, task.version

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._queue.samples:
                await self._arrivals.park()
            if self.max_wait > 0:
                with trio.move_on_after(self.max_wait):
                    while self._queue.samples < self.max_batch_size:
                        await self._arrivals.park()
            await self._run_batch(
                self._queue.take_batch(self.max_batch_size, self.max_stranger_batch)
            )

    async def _run_batch(self, batch: list[_Task]) -> None:
        live = [t for t in batch if not t.abandoned]
        for t in batch:
            if t.abandoned:
                t.done.set()
        if not live:
            return
        refusal = self._refuse() if self._refuse is not None else None
        if refusal is not None:  # paused: no new work starts, queued requests are told why
            for t in live:
                t.error = refusal
                t.done.set()
            return
        inputs = [
            torch.cat([t.tensors[i] for t in live]) if len(live) > 1 else live[0].tensors[i]
            for i in range(len(live[0].tensors))
        ]
        size = sum(t.size for t in live)
        try:
            keep = len(live) == 1 and live[0].keep
            args = (inputs, keep, live[0].owner, [t.extra for t in live])
            paced = None if self._paced_seconds is None else self._paced_seconds(size)
            (output, handle, version), seconds = await on_device(
                self._limiter, self._process, *args, paced_seconds=paced
            )
        except Exception as exc:
            log.exception("%s failed on a batch of %d", self.name, sum(t.size for t in live))
            for t in live:
                t.error = exc
                t.done.set()
            return
        self.stats.batches += 1
        self.stats.samples += size
        self.stats.largest_batch = max(self.stats.largest_batch, size)
        self.stats.compute_seconds += seconds  # on the device, not waiting for it
        offset = 0
        for t in live:
            t.handle = handle
            t.version = version
            t.result = output[offset : offset + t.size]
            offset += t.size
            t.done.set()
