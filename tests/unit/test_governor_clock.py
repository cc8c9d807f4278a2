"""The throttle's time-driven logic on trio's MockClock (autojump): a snooze of hours, a
working week's schedule and the duty cycle's window play out in milliseconds, and the
wall clock the governor reads follows the same mock time.

The tests step the governor themselves (as its loop does every ``interval``): real probes
are read on a worker thread, and an autojumping clock does not wait for threads, so with
the loop running the clock could jump past a step that is still reading (FakeProbes are
read inline)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import trio

from core.control.preferences import Preferences, Window
from core.node.governor import Governor
from core.node.probes import FakeProbes
from core.node.throttle import Decision, Reason

MONDAY_0859 = dt.datetime(2026, 11, 23, 8, 59)  # a Monday


def following_trio(start: dt.datetime) -> Callable[[], dt.datetime]:
    """A wall clock that starts at ``start`` and moves with trio's clock."""
    t0 = trio.current_time()
    return lambda: start + dt.timedelta(seconds=trio.current_time() - t0)


def reason(governor: Governor) -> Reason | None:
    assert governor.decision is not None
    return governor.decision.reason


async def after(governor: Governor, seconds: float) -> Decision:
    """The governor's decision ``seconds`` from now."""
    await trio.sleep(seconds)
    return await governor.step()


async def test_a_snooze_ends_by_itself_on_time(autojump_clock):
    governor = Governor(FakeProbes(), Preferences, None, clock=following_trio(MONDAY_0859))
    governor.snooze(3 * 3600)
    assert (await after(governor, 0)).reason is Reason.SNOOZED
    assert (await after(governor, 3 * 3600 - 1)).reason is Reason.SNOOZED
    assert (await after(governor, 1)).run


async def test_a_working_week_schedule(autojump_clock):
    office = Preferences(
        schedule=[Window(days=["mon", "tue", "wed", "thu", "fri"], start="09:00", end="17:00")]
    )
    governor = Governor(FakeProbes(), lambda: office, None, clock=following_trio(MONDAY_0859))
    assert (await after(governor, 0)).reason is Reason.SCHEDULE  # 08:59
    assert (await after(governor, 59)).reason is Reason.SCHEDULE  # 08:59:59
    assert (await after(governor, 1)).run  # 09:00
    assert (await after(governor, 8 * 3600 - 1)).run  # 16:59:59 (17:00 is still in)
    assert (await after(governor, 61)).reason is Reason.SCHEDULE  # 17:01
    assert (await after(governor, 4 * 86400 + 16 * 3600)).reason is Reason.SCHEDULE  # Sat 09:01
    assert (await after(governor, 2 * 86400)).run  # Monday 09:01


class ComputingServer:
    """Stands in for the expert server: computes all the time it is not paused."""

    def __init__(self) -> None:
        self.paused = False
        self._busy = 0.0
        self._since = trio.current_time()

    def compute_seconds(self) -> float:
        return self._busy + (0.0 if self.paused else trio.current_time() - self._since)

    async def pause(self) -> None:
        self._busy = self.compute_seconds()
        self.paused = True

    async def resume(self) -> None:
        self._since = trio.current_time()
        self.paused = False


async def test_the_duty_cycle_holds_over_half_an_hour(autojump_clock):
    half = Preferences(duty_cycle=0.5)
    server = ComputingServer()
    governor = Governor(FakeProbes(), lambda: half, server, duty_window=600.0)  # type: ignore[arg-type]
    start = trio.current_time()
    for _ in range(900):  # half an hour (three windows), a look every 2 s
        await after(governor, 2)
    share = server.compute_seconds() / (trio.current_time() - start)
    # the latch rests from above the cap down to 5 points below it
    assert 0.44 <= share <= 0.51, share
    assert any(c.decision.reason is Reason.DUTY_CYCLE for c in governor.changes)
