"""The throttle decision, table-driven, hysteresis included; preferences."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from core.control.preferences import (
    Preferences,
    PreferencesError,
    Window,
    load_preferences,
    parse_preferences,
    save_preferences,
)
from core.node.throttle import Reason, Snapshot, ThrottleState, decide

MONDAY_NOON = dt.datetime(2026, 11, 23, 12, 0)  # a Monday
IDLE = 3600.0
P = Preferences()


@pytest.mark.parametrize(
    ("snapshot", "prefs", "state", "expected"),
    [
        (Snapshot(MONDAY_NOON, idle_seconds=IDLE), P, ThrottleState(), None),
        (Snapshot(MONDAY_NOON, idle_seconds=None), P, ThrottleState(), None),  # headless: idle
        (Snapshot(MONDAY_NOON, idle_seconds=30), P, ThrottleState(), Reason.USER_ACTIVE),
        (
            Snapshot(MONDAY_NOON, idle_seconds=30),
            P.updated({"idle_only": False}),
            ThrottleState(),
            None,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE),
            P,
            ThrottleState(paused_by_user=True),
            Reason.PAUSED,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE),
            P,
            ThrottleState(snoozed_until=MONDAY_NOON + dt.timedelta(hours=1)),
            Reason.SNOOZED,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE),
            P,
            ThrottleState(snoozed_until=MONDAY_NOON),
            None,
        ),  # snooze over
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, on_battery=True),
            P,
            ThrottleState(),
            Reason.ON_BATTERY,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, on_battery=True),
            P.updated({"pause_on_battery": False}),
            ThrottleState(),
            None,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, processes=frozenset({"game.exe"})),
            P.updated({"exclusive_apps": ["Game.exe"]}),
            ThrottleState(),
            Reason.EXCLUSIVE_APP,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE),
            P.updated({"schedule": [{"days": ["sat", "sun"]}]}),
            ThrottleState(),
            Reason.SCHEDULE,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE),
            P.updated({"schedule": [{"start": "22:00", "end": "07:00"}]}),
            ThrottleState(),
            Reason.SCHEDULE,
        ),
        (
            Snapshot(MONDAY_NOON.replace(hour=2), idle_seconds=IDLE),
            P.updated({"schedule": [{"days": ["sun"], "start": "22:00", "end": "07:00"}]}),
            ThrottleState(),
            None,
        ),  # Sunday night's window
        # temperature with hysteresis: pause at 83, resume only at 75
        (Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=82.9), P, ThrottleState(), None),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=83.0),
            P,
            ThrottleState(),
            Reason.GPU_HOT,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=80.0),
            P,
            ThrottleState(gpu_hot=True),
            Reason.GPU_HOT,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=75.0),
            P,
            ThrottleState(gpu_hot=True),
            None,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=None),
            P,
            ThrottleState(gpu_hot=True),
            None,
        ),  # no reading
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, cpu_temp_c=95.0),
            P,
            ThrottleState(),
            Reason.CPU_HOT,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, work_fraction=0.9),
            P.updated({"duty_cycle": 0.8}),
            ThrottleState(),
            Reason.DUTY_CYCLE,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, work_fraction=0.78),
            P.updated({"duty_cycle": 0.8}),
            ThrottleState(resting=True),
            Reason.DUTY_CYCLE,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=IDLE, work_fraction=0.7),
            P.updated({"duty_cycle": 0.8}),
            ThrottleState(resting=True),
            None,
        ),
        # the order of reasons: user pause beats everything, battery beats heat
        (
            Snapshot(MONDAY_NOON, idle_seconds=30, gpu_temp_c=99, on_battery=True),
            P,
            ThrottleState(paused_by_user=True),
            Reason.PAUSED,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=30, gpu_temp_c=99, on_battery=True),
            P,
            ThrottleState(),
            Reason.ON_BATTERY,
        ),
        (
            Snapshot(MONDAY_NOON, idle_seconds=30, gpu_temp_c=99),
            P,
            ThrottleState(),
            Reason.USER_ACTIVE,
        ),
    ],
)
def test_decide(snapshot, prefs, state, expected):
    decision = decide(snapshot, prefs, state)
    assert decision.reason == expected
    assert decision.run == (expected is None)


def test_hysteresis_over_a_temperature_trace():
    state, runs = ThrottleState(), []
    for temp in [70, 80, 83, 84, 80, 76, 75, 78, 82, 83]:
        decision = decide(Snapshot(MONDAY_NOON, idle_seconds=IDLE, gpu_temp_c=temp), P, state)
        state = decision.state
        runs.append(decision.run)
    assert runs == [True, True, False, False, False, False, True, True, True, False]


def test_a_finished_snooze_is_forgotten():
    state = ThrottleState(snoozed_until=MONDAY_NOON)
    decision = decide(Snapshot(MONDAY_NOON + dt.timedelta(seconds=1), idle_seconds=IDLE), P, state)
    assert decision.run
    assert decision.state.snoozed_until is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"pause_above_c": 70, "resume_below_c": 75}, "resume_below_c"),
        ({"idle_minutes": -1}, "idle_minutes"),
        ({"duty_cycle": 0}, "duty_cycle"),
        ({"gpus": [-1]}, "gpus"),
        ({"schedule": [{"days": ["monday"]}]}, "schedule.0.days"),
        ({"schedule": [{"start": "25:00"}]}, "schedule.0.start"),
        ({"colour": "blue"}, "colour: unknown preference"),
    ],
)
def test_invalid_preferences_name_the_field(changes, field):
    with pytest.raises(PreferencesError) as info:
        Preferences().updated(changes)
    assert field in str(info.value)


def test_preferences_survive_a_restart(tmp_path):
    path = tmp_path / "preferences.json"
    assert load_preferences(path) == Preferences()  # defaults when nothing is saved
    prefs = Preferences().updated(
        {"idle_minutes": 10, "schedule": [{"days": ["sat"], "start": "08:00", "end": "20:00"}]}
    )
    save_preferences(prefs, path)
    assert load_preferences(path) == prefs
    assert parse_preferences(prefs.model_dump()) == prefs
    assert isinstance(prefs.schedule[0], Window)
    assert replace(ThrottleState(), paused_by_user=True).paused_by_user
