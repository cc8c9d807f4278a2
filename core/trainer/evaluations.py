"""The trainer's evaluations, signed and sent to the project's aggregators, which keep
them for the project page's loss over time (core/protocol/evaluations.py).

Sending never holds training up: ``publish`` queues (a full queue drops the point and
says so), one task delivers, and ``close`` gives the last points (the final evaluation)
a few seconds to leave before the trainer exits."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from core.project.distribution import aggregator_peers
from core.project.signed import SignedManifest
from core.protocol.evaluations import EVALUATION, EvaluationPoint
from net import Peer, PeerID, RpcError

log = logging.getLogger(__name__)

#: points waiting to be sent (an evaluation comes every eval_every steps: minutes apart)
QUEUE: int = 64
#: seconds one aggregator is given to take a point
SEND_TIMEOUT_S: float = 10.0


class EvaluationPublisher:
    def __init__(
        self, peer: Peer, signed: SignedManifest, clock: Callable[[], float] = time.time
    ) -> None:
        self.peer = peer
        self.project = signed.project_id
        self.aggregators: list[PeerID] = aggregator_peers(peer, signed.manifest)
        self.clock = clock
        self._send, self._receive = trio.open_memory_channel[EvaluationPoint](QUEUE)
        self._finished = trio.Event()
        #: points each aggregator took, and sends that failed
        self.delivered = 0
        self.failed = 0

    def publish(self, *, step: int, samples: int, tokens: int, loss: float) -> None:
        """Sign and queue an evaluation (never blocks)."""
        point = EvaluationPoint.sign(
            self.peer.identity,
            self.project,
            step=step,
            samples=samples,
            tokens=tokens,
            loss=loss,
            time=self.clock(),
        )
        try:
            self._send.send_nowait(point)
        except (trio.WouldBlock, trio.ClosedResourceError):
            log.info("the evaluation at step %d is not sent: the queue is full or closed", step)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver queued points until ``close``."""
        task_status.started()
        try:
            async with self._receive:
                async for point in self._receive:
                    async with trio.open_nursery() as nursery:
                        for agg in self.aggregators:
                            nursery.start_soon(self._deliver, agg, point)
        finally:
            self._finished.set()

    async def close(self, wait_s: float = SEND_TIMEOUT_S) -> None:
        """No more points; wait up to ``wait_s`` for the queued ones to be delivered."""
        await self._send.aclose()
        with trio.move_on_after(wait_s):
            await self._finished.wait()

    async def _deliver(self, agg: PeerID, point: EvaluationPoint) -> None:
        try:
            await self.peer.rpc.call(
                agg, EVALUATION, {"point": point.encode()}, timeout=SEND_TIMEOUT_S
            )
        except RpcError as exc:
            self.failed += 1
            log.info(
                "aggregator %s did not take the evaluation of step %d: %s", agg, point.step, exc
            )
        else:
            self.delivered += 1
