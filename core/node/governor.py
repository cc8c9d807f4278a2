"""Makes the node obey the throttle: polls the probes, decides, pauses and resumes the
expert server (which at once stops starting batches and refuses requests, then withdraws
its declarations so that trainers route around it)."""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from core.control.preferences import Preferences
from core.experts.server import ExpertServer
from core.node.probes import Probes, Reading
from core.node.throttle import Decision, Snapshot, ThrottleState, decide

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateChange:
    at: float  # trio clock
    decision: Decision


class Governor:
    def __init__(
        self,
        probes: Probes,
        preferences: Callable[[], Preferences],
        server: ExpertServer | None,
        *,
        interval: float = 0.25,
        duty_window: float = 600.0,
        clock: Callable[[], dt.datetime] = dt.datetime.now,
        on_change: Callable[[Decision], None] | None = None,
    ) -> None:
        self.on_change = on_change  # e.g. an event for the control API's stream
        self.probes = probes
        self.preferences = preferences
        self.server = server
        self.interval = interval
        self.duty_window = duty_window
        self.clock = clock
        self.state = ThrottleState()
        self.decision: Decision | None = None
        self.last_reading: Reading | None = None
        self.changes: deque[StateChange] = deque(maxlen=1000)
        self._compute: deque[tuple[float, float]] = deque()  # (time, compute seconds so far)
        self._wake = trio.Event()

    # ---- commands (from the control API)

    def pause(self) -> None:
        self.state = ThrottleState(**{**self.state.__dict__, "paused_by_user": True})
        self._wake.set()

    def resume(self) -> None:
        self.state = ThrottleState(
            **{**self.state.__dict__, "paused_by_user": False, "snoozed_until": None}
        )
        self._wake.set()

    def snooze(self, seconds: float) -> None:
        until = self.clock() + dt.timedelta(seconds=seconds)
        self.state = ThrottleState(**{**self.state.__dict__, "snoozed_until": until})
        self._wake.set()

    async def attach(self, server: ExpertServer) -> None:
        """Govern ``server`` from now on; one that joins while the node is paused is
        paused at once (start it with ``paused=True`` so it never takes work)."""
        self.server = server
        self._compute.clear()  # the duty-cycle window counts this server's seconds
        await self._enforce()

    def detach(self) -> None:
        """The node serves nothing now."""
        self.server = None
        self._compute.clear()

    async def _enforce(self) -> None:
        if self.server is None or self.decision is None:
            return
        if self.decision.run and self.server.paused:
            await self.server.resume()
        elif not self.decision.run and not self.server.paused:
            await self.server.pause()

    # ---- the loop

    async def run(
        self, *, task_status: trio.TaskStatus[Governor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.step()
        task_status.started(self)
        while True:
            with trio.move_on_after(self.interval):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.step()

    async def step(self) -> Decision:
        if getattr(self.probes, "reads_in_memory", False):
            reading = self.probes.read()
        else:  # real probes read files, run tools, talk to drivers
            reading = await trio.to_thread.run_sync(self.probes.read)
        self.last_reading = reading
        snapshot = Snapshot(
            now=self.clock(),
            idle_seconds=reading.idle_seconds,
            gpu_temp_c=reading.gpu_temp_c,
            cpu_temp_c=reading.cpu_temp_c,
            on_battery=reading.on_battery,
            processes=reading.processes,
            work_fraction=self._work_fraction(),
        )
        decision = decide(snapshot, self.preferences(), self.state)
        self.state = decision.state
        previous = self.decision
        self.decision = decision
        if previous is None or (previous.run, previous.reason) != (decision.run, decision.reason):
            self.changes.append(StateChange(trio.current_time(), decision))
            log.info("%s", decision.describe())
            if self.on_change is not None:
                self.on_change(decision)
            await self._enforce()
        return decision

    def _work_fraction(self) -> float:
        """Share of the last ``duty_window`` seconds the device spent computing."""
        if self.server is None:
            return 0.0
        now = trio.current_time()
        total = self.server.compute_seconds()
        self._compute.append((now, total))
        while len(self._compute) > 1 and self._compute[0][0] < now - self.duty_window:
            self._compute.popleft()
        start_time, start_total = self._compute[0]
        span = now - start_time
        return (total - start_total) / span if span > 1.0 else 0.0
