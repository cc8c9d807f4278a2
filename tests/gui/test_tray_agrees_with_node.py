"""The tray's forms agree with the node's rules. The limits dialog and the first-start
wizard are built offscreen and every spin box's range and value at the defaults, the
wizard's resume gap and the project ids it accepts are compared with what the node's own
model allows (core.control.limits, read off core.control.preferences.Preferences). A copy
of a rule in app/ that drifts from the node fails here.

An open end of a range (duty cycle > 0) cannot be a spin box's bound: there the box
starts one step (its smallest shown unit) inside the range."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QSpinBox, QWidget

from app.background import run_now
from app.limits import LimitsDialog
from app.wizard import LimitsPage, ProjectPage, WizardActions
from core.control.invite import Invite
from core.control.limits import (
    PROJECT_ID_RULE,
    is_project_id,
    normalize_project_id,
    preference_limits,
)
from core.control.models import ProjectSummary
from core.control.preferences import Preferences, PreferencesError

LIMITS = preference_limits()

#: The limits dialog's spin box for each numeric preference, and the factor between the
#: preference and what the box shows (the duty cycle is a share shown in percent).
DIALOG_SPINS: dict[str, tuple[str, float]] = {
    "idle_minutes": ("field_idle_minutes", 1.0),
    "pause_above_c": ("field_pause_above_c", 1.0),
    "resume_below_c": ("field_resume_below_c", 1.0),
    "cpu_pause_above_c": ("field_cpu_pause_above_c", 1.0),
    "cpu_resume_below_c": ("field_cpu_resume_below_c", 1.0),
    "duty_cycle": ("field_duty_cycle", 100.0),
    "memory_cap_gb": ("memoryCap", 1.0),
    "cpu_threads": ("cpuThreads", 1.0),
}


def expected_range(name: str, decimals: int, scale: float = 1.0) -> tuple[float, float]:
    """The node's range of ``name`` as a box with ``decimals`` shows it: a closed end is
    the bound, an open end the nearest value the box can show inside it."""
    rule = LIMITS.ranges[name]
    step = 10.0**-decimals
    low = rule.low * scale + (step if rule.low_open else 0.0)
    high = rule.high * scale - (step if rule.high_open else 0.0)
    # Both ends are values the node takes, and one step further out is one it refuses.
    assert rule.contains(low / scale), name
    assert rule.contains(high / scale), name
    assert not rule.contains((low - step) / scale), name
    assert not rule.contains((high + step) / scale), name
    return round(low, decimals), round(high, decimals)


def spin(widget: QWidget, cls: type[Any], name: str) -> Any:
    found = widget.findChild(cls, name)
    assert found is not None, f"no {cls.__name__} named {name}"
    return found


def no_changes(changes: dict[str, Any]) -> list[str]:
    return []


# ---------------------------------------------------------------- the limits dialog


@pytest.fixture
def dialog(qtbot: Any) -> LimitsDialog:
    made = LimitsDialog(Preferences(), no_changes)
    qtbot.addWidget(made)
    return made


def test_every_numeric_preference_has_a_spin_box_in_the_dialog():
    assert set(DIALOG_SPINS) == set(LIMITS.ranges)


@pytest.mark.parametrize("name", sorted(DIALOG_SPINS))
def test_dialog_spin_box_range_is_the_node_range(dialog, name):
    object_name, scale = DIALOG_SPINS[name]
    box = spin(dialog, QDoubleSpinBox, object_name)
    low, high = expected_range(name, box.decimals(), scale)
    assert (box.minimum(), box.maximum()) == (low, high)


def test_dialog_at_the_defaults_shows_the_node_defaults(dialog):
    defaults = LIMITS.defaults
    for name, (object_name, scale) in DIALOG_SPINS.items():
        if defaults[name] is None:  # no cap: the box is off
            continue
        box = spin(dialog, QDoubleSpinBox, object_name)
        assert box.value() == defaults[name] * scale, name
    assert spin(dialog, QCheckBox, "memoryLimit").isChecked() == (
        defaults["memory_cap_gb"] is not None
    )
    assert spin(dialog, QCheckBox, "cpuThreadsLimit").isChecked() == (
        defaults["cpu_threads"] is not None
    )
    assert dialog.values() == defaults


@pytest.mark.parametrize("end", ["minimum", "maximum"])
def test_the_node_takes_the_dialog_ends(dialog, end):
    spin(dialog, QCheckBox, "memoryLimit").setChecked(True)
    spin(dialog, QCheckBox, "cpuThreadsLimit").setChecked(True)
    for object_name, _scale in DIALOG_SPINS.values():
        box = spin(dialog, QDoubleSpinBox, object_name)
        box.setValue(getattr(box, end)())
    # What the dialog sends (percent back to a share, rounded) is what the node takes, as
    # it reads a request's JSON body.
    try:
        Preferences.model_validate_json(json.dumps(dialog.values()))
    except ValidationError as exc:
        pytest.fail(f"the node refuses the dialog's {end}: {exc}")


# ---------------------------------------------------------------- the wizard


class FakeActions:
    def __init__(self) -> None:
        self.found: list[str] = []
        self.joined: list[str] = []

    def find(self, invite: Invite) -> ProjectSummary:
        self.found.append(invite.project)
        return ProjectSummary(project=invite.project)

    def join(self, invite: Invite) -> list[str]:
        self.joined.append(invite.project)
        return []

    def actions(self) -> WizardActions:
        return WizardActions(
            list_projects=list,
            find=self.find,
            join=self.join,
            leave=list,
            start_benchmark=lambda: None,
            apply_limits=no_changes,
            run=run_now,
        )


@pytest.fixture
def fake() -> FakeActions:
    return FakeActions()


@pytest.fixture
def limits_page(qtbot: Any, fake: FakeActions) -> LimitsPage:
    page = LimitsPage(fake.actions())
    qtbot.addWidget(page)
    return page


@pytest.fixture
def project_page(qtbot: Any, fake: FakeActions) -> ProjectPage:
    page = ProjectPage(fake.actions())
    qtbot.addWidget(page)
    return page


def test_wizard_limits_page_starts_at_the_node_defaults(limits_page):
    defaults = LIMITS.defaults
    assert limits_page.idle_only.isChecked() == defaults["idle_only"]
    assert limits_page.idle_minutes.value() == defaults["idle_minutes"]
    assert limits_page.temp_limit.value() == defaults["pause_above_c"]
    assert limits_page.memory_cap.isChecked() == (defaults["memory_cap_gb"] is not None)
    # the page's changes at the start are the node's defaults, the resume temperature too
    changes = limits_page.changes()
    assert changes == {name: defaults[name] for name in changes}


def test_wizard_idle_minutes_and_memory_ranges_are_the_node_ranges(limits_page):
    idle = spin(limits_page, QSpinBox, "idleMinutesSpin")
    assert (idle.minimum(), idle.maximum()) == expected_range("idle_minutes", 0)
    memory = spin(limits_page, QDoubleSpinBox, "memoryCapSpin")
    assert (memory.minimum(), memory.maximum()) == expected_range(
        "memory_cap_gb", memory.decimals()
    )


def test_wizard_pause_limit_keeps_the_resume_temperature_in_range(limits_page):
    """The resume temperature is the pause limit less the node's gap; the pause limit's
    box spans exactly the whole degrees for which both are in the node's ranges."""
    gap = LIMITS.resume_gap_c
    pause, resume = LIMITS.ranges["pause_above_c"], LIMITS.ranges["resume_below_c"]
    allowed = [
        degrees
        for degrees in range(int(pause.low) - 1, int(pause.high) + 2)
        if pause.contains(degrees) and resume.contains(degrees - gap)
    ]
    box = spin(limits_page, QSpinBox, "tempLimitSpin")
    assert (box.minimum(), box.maximum()) == (min(allowed), max(allowed))
    assert LIMITS.defaults["pause_above_c"] - LIMITS.defaults["resume_below_c"] == gap
    limits_page.memory_cap.setChecked(True)
    for end in ("minimum", "maximum"):
        box.setValue(getattr(box, end)())
        limits_page.idle_minutes.setValue(getattr(limits_page.idle_minutes, end)())
        limits_page.memory_cap_gb.setValue(getattr(limits_page.memory_cap_gb, end)())
        changes = limits_page.changes()
        assert changes["pause_above_c"] - changes["resume_below_c"] == gap
        assert f"{changes['resume_below_c']:g} °C" in limits_page.resume_hint.text()
        try:
            Preferences().updated(changes)
        except PreferencesError as exc:
            pytest.fail(f"the node refuses the wizard's {end}: {exc.problems}")


HEX = "0123456789abcdef"
IDS = [
    HEX * 2,  # 32 hex digits
    "f" * 32,
    HEX.upper() * 2,  # pasted upper-case
    f"  {HEX * 2}\n",  # pasted with whitespace
    HEX * 2 + "0",  # 33
    (HEX * 2)[:-1],  # 31
    "g" * 32,
    "0x" + (HEX * 2)[:30],
    HEX + " " + HEX[:-1],
    "",
    "not-an-id",
    "\N{ARABIC-INDIC DIGIT ZERO}" * 32,  # a digit, but not 0-9
]


@pytest.mark.parametrize("text", IDS)
def test_wizard_accepts_exactly_the_ids_the_node_accepts(project_page, fake, text):
    node_takes = is_project_id(normalize_project_id(text))
    project_page.picker.invite_edit.setText(text)
    assert project_page.isComplete() == node_takes
    assert project_page.validatePage() == node_takes
    if node_takes:
        assert fake.found == [normalize_project_id(text)]  # the node was asked ...
        assert fake.joined == [normalize_project_id(text)]  # ... and joined it
    else:
        assert fake.found == []
        assert fake.joined == []
        if text.strip():  # an empty field is no mistake to point out
            assert PROJECT_ID_WORDS in project_page.picker.invite_error.text()


def test_ids_the_node_takes():
    # the cases above include both kinds (else the comparison proves little)
    taken = [text for text in IDS if is_project_id(normalize_project_id(text))]
    assert taken == IDS[:4]


#: How the node's rule describes an id (core.control.limits.PROJECT_ID_RULE).
PROJECT_ID_WORDS = "32 characters, 0-9 and a-f"


def test_the_wizard_says_the_node_rule_for_ids():
    assert PROJECT_ID_WORDS in PROJECT_ID_RULE.replace(" long, made of", ",")
