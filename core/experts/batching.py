"""Batches concurrent requests for one expert and runs them off the network loop.

A pool per (expert, operation) queues requests; its loop takes everything queued (up to
max_batch_size samples), concatenates along the batch dimension, runs the batch in a
worker thread under the device limiter (one batch on the device at a time), and splits
the results. No request waits for company: while one batch computes, the next one forms,
so batches grow with load and a lone request pays no added latency (``max_wait`` can
trade latency for bigger batches).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import trio

log = logging.getLogger(__name__)

#: Runs one batch: (batched input tensors, keep, owner, extras) -> (outputs, handle of a
#: kept autograd graph or None). ``keep`` is only ever True for a batch of a single
#: request, whose caller is ``owner``; ``extras`` holds each request's extra (receipts).
Process = Callable[[list[torch.Tensor], bool, object, list[Any]], tuple[torch.Tensor, int | None]]


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
    error: BaseException | None = None
    abandoned: bool = False


@dataclass
class PoolStatistics:
    batches: int = 0
    samples: int = 0
    largest_batch: int = 0
    compute_seconds: float = 0.0


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
    ) -> None:
        self.name = name
        self._process = process
        #: asked before each batch: an error to fail it with instead of computing (pause)
        self._refuse = refuse
        self._limiter = device_limiter
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self._send, self._recv = trio.open_memory_channel[_Task](math.inf)
        self._queued_samples = 0
        self.stats = PoolStatistics()

    @property
    def queued_samples(self) -> int:
        return self._queued_samples

    async def submit(
        self, *tensors: torch.Tensor, keep: bool = False, owner: object = None, extra: Any = None
    ) -> tuple[torch.Tensor, int | None]:
        """Run ``process`` on these tensors (batched with others); returns its output rows
        and, when ``keep`` was asked and the request ran alone, the kept graph's handle."""
        task = _Task(tensors, int(tensors[0].shape[0]), keep, owner, extra)
        self._queued_samples += task.size
        self._send.send_nowait(task)
        try:
            await task.done.wait()
        except BaseException:
            task.abandoned = True  # the caller left (deadline); skip it if not started
            raise
        if task.error is not None:
            raise task.error
        assert task.result is not None
        return task.result, task.handle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        carry: _Task | None = None
        while True:
            first = carry or await self._recv.receive()
            carry = None
            batch, size = [first], first.size
            deadline = trio.current_time() + self.max_wait
            while size < self.max_batch_size:
                task = await self._next_before(deadline)
                if task is None:
                    break
                if size + task.size > self.max_batch_size:
                    carry = task
                    break
                batch.append(task)
                size += task.size
            await self._run_batch(batch)

    async def _next_before(self, deadline: float) -> _Task | None:
        try:
            return self._recv.receive_nowait()
        except trio.WouldBlock:
            pass
        if trio.current_time() >= deadline:
            return None
        with trio.move_on_at(deadline):
            return await self._recv.receive()
        return None

    async def _run_batch(self, batch: list[_Task]) -> None:
        live = [t for t in batch if not t.abandoned]
        self._queued_samples -= sum(t.size for t in batch)
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
        started = trio.current_time()
        try:
            keep = len(live) == 1 and live[0].keep
            output, handle = await trio.to_thread.run_sync(
                self._process,
                inputs,
                keep,
                live[0].owner,
                [t.extra for t in live],
                limiter=self._limiter,
            )
        except Exception as exc:
            log.exception("%s failed on a batch of %d", self.name, sum(t.size for t in live))
            for t in live:
                t.error = exc
                t.done.set()
            return
        self.stats.batches += 1
        size = sum(t.size for t in live)
        self.stats.samples += size
        self.stats.largest_batch = max(self.stats.largest_batch, size)
        self.stats.compute_seconds += trio.current_time() - started
        offset = 0
        for t in live:
            t.handle = handle
            t.result = output[offset : offset + t.size]
            offset += t.size
            t.done.set()
