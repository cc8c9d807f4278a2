"""When may the node work? One pure function decides, from a snapshot of the probes, the
volunteer's preferences and a little state (the temperature latch): run, or pause with
the first reason in a fixed order. BOINC's ``check_suspend_processing`` is the model;
unlike it (and the other anchors), temperature pauses with hysteresis: pause at or above
``pause_above_c``, resume only at or below ``resume_below_c``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from enum import Enum

from core.control.preferences import Preferences


class Reason(Enum):
    """Why the node does not work, in the order they are checked (first wins)."""

    PAUSED = "paused by you"
    SNOOZED = "snoozed"
    SCHEDULE = "outside your schedule"
    ON_BATTERY = "running on battery"
    EXCLUSIVE_APP = "an exclusive app is running"
    USER_ACTIVE = "you are using the computer"
    GPU_HOT = "the GPU is too hot"
    CPU_HOT = "the CPU is too hot"
    DUTY_CYCLE = "resting (duty cycle)"


@dataclass(frozen=True)
class Snapshot:
    """What the probes saw. None means "this probe has nothing to say here"."""

    now: dt.datetime  # local time (the schedule is in the volunteer's clock)
    idle_seconds: float | None = None  # None: no user session (headless): counts as idle
    gpu_temp_c: float | None = None  # the hottest GPU in use
    cpu_temp_c: float | None = None
    on_battery: bool | None = None
    processes: frozenset[str] = frozenset()  # lower-case names of running programs
    work_fraction: float = 0.0  # share of the recent window spent computing


@dataclass(frozen=True)
class ThrottleState:
    paused_by_user: bool = False
    snoozed_until: dt.datetime | None = None
    gpu_hot: bool = False  # latched at pause_above_c, released at resume_below_c
    cpu_hot: bool = False
    resting: bool = False  # duty-cycle latch


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: Reason | None = None
    detail: str = ""
    state: ThrottleState = field(default_factory=ThrottleState)

    def describe(self) -> str:
        if self.run:
            return "working"
        assert self.reason is not None
        return f"{self.reason.value}{': ' + self.detail if self.detail else ''}"


def _latch(latched: bool, value: float | None, high: float, low: float) -> bool:
    if value is None:
        return False  # no reading: nothing to protect against
    if latched:
        return value > low
    return value >= high


def decide(snapshot: Snapshot, prefs: Preferences, state: ThrottleState) -> Decision:
    """Run or pause, and why. Pure: the new latch state is part of the decision."""
    gpu_hot = _latch(state.gpu_hot, snapshot.gpu_temp_c, prefs.pause_above_c, prefs.resume_below_c)
    cpu_hot = _latch(
        state.cpu_hot, snapshot.cpu_temp_c, prefs.cpu_pause_above_c, prefs.cpu_resume_below_c
    )
    cap = prefs.duty_cycle
    resting = cap < 1.0 and (
        snapshot.work_fraction > cap if not state.resting else snapshot.work_fraction > cap - 0.05
    )
    snoozed_until = state.snoozed_until
    if snoozed_until is not None and snapshot.now >= snoozed_until:
        snoozed_until = None
    new_state = replace(
        state, gpu_hot=gpu_hot, cpu_hot=cpu_hot, resting=resting, snoozed_until=snoozed_until
    )

    def pause(reason: Reason, detail: str = "") -> Decision:
        return Decision(False, reason, detail, new_state)

    if state.paused_by_user:
        return pause(Reason.PAUSED)
    if snoozed_until is not None:
        return pause(Reason.SNOOZED, f"until {snoozed_until:%a %H:%M}")
    if not prefs.schedule_allows(snapshot.now):
        return pause(Reason.SCHEDULE)
    if prefs.pause_on_battery and snapshot.on_battery:
        return pause(Reason.ON_BATTERY)
    running = sorted(a for a in prefs.exclusive_apps if a.lower() in snapshot.processes)
    if running:
        return pause(Reason.EXCLUSIVE_APP, running[0])
    if (
        prefs.idle_only
        and snapshot.idle_seconds is not None
        and snapshot.idle_seconds < prefs.idle_minutes * 60
    ):
        return pause(Reason.USER_ACTIVE)
    if gpu_hot:
        return pause(
            Reason.GPU_HOT,
            f"{snapshot.gpu_temp_c:.0f} °C, resumes at {prefs.resume_below_c:.0f} °C",
        )
    if cpu_hot:
        return pause(
            Reason.CPU_HOT,
            f"{snapshot.cpu_temp_c:.0f} °C, resumes at {prefs.cpu_resume_below_c:.0f} °C",
        )
    if resting:
        return pause(Reason.DUTY_CYCLE, f"at most {cap:.0%} of the time")
    return Decision(True, None, "", new_state)
