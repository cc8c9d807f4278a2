"""The tray's limits dialog and dashboard, driven offscreen with pytest-qt."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, TypeVar

import pytest
from pydantic import TypeAdapter
from PySide6.QtCore import Qt, QTime
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDoubleSpinBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QWidget,
)

from app.dashboard import (
    DASH,
    MAX_EVENTS,
    DashboardWindow,
    count_text,
    credit_text,
    credit_title,
    day_ticks,
    describe_event,
    event_lines,
    event_rows,
    lifetime_text,
)
from app.limits import LimitsDialog, ScheduleEditor, plain_message
from core.control.limits import preference_limits
from core.control.models import (
    ContributionCounts,
    Credit,
    CreditDay,
    DeviceStatus,
    Event,
    History,
    HourOfWork,
    Lifetime,
    MinuteReading,
    NetworkStatus,
    Readings,
    Status,
)
from core.control.preferences import Preferences

W = TypeVar("W", bound=QWidget)

PREFERENCES = {
    "idle_only": False,
    "idle_minutes": 7.5,
    "pause_above_c": 80.0,
    "resume_below_c": 70.0,
    "cpu_pause_above_c": 88.0,
    "cpu_resume_below_c": 78.0,
    "duty_cycle": 0.5,
    "schedule": [
        {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "22:00", "end": "07:30"},
        {"days": ["sat", "sun"], "start": "09:00", "end": "18:00"},
    ],
    "pause_on_battery": False,
    "exclusive_apps": ["steam.exe", "blender"],
    "gpus": [0, 2],
    "memory_cap_gb": 6.5,
    "cpu_threads": 3,
    "listen_on_network": False,
    "relay_for_others": True,
    "map_port": True,
}


class Recorder:
    """An ``apply`` that records its calls and answers with the given problems."""

    def __init__(self, *answers: list[str]) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answers = list(answers)

    def __call__(self, changes: dict[str, Any]) -> list[str]:
        self.calls.append(changes)
        return self.answers.pop(0) if self.answers else []


def make_dialog(qtbot, preferences=None, apply=None) -> LimitsDialog:
    dialog = LimitsDialog(
        Preferences.model_validate(PREFERENCES if preferences is None else preferences),
        apply if apply is not None else Recorder(),
    )
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def child(widget: QWidget, cls: type[W], name: str) -> W:
    found = widget.findChild(cls, name)
    assert found is not None, f"no {cls.__name__} named {name}"
    return found


def click(qtbot: Any, widget: QWidget, name: str) -> None:
    qtbot.mouseClick(child(widget, QPushButton, name), Qt.MouseButton.LeftButton)


# -- limits dialog ---------------------------------------------------------------------------


def test_limits_dialog_shows_the_preferences_it_was_given(qtbot):
    dialog = make_dialog(qtbot)
    assert not child(dialog, QCheckBox, "field_idle_only").isChecked()
    assert child(dialog, QDoubleSpinBox, "field_idle_minutes").value() == 7.5
    assert child(dialog, QDoubleSpinBox, "field_pause_above_c").value() == 80.0
    assert child(dialog, QDoubleSpinBox, "field_resume_below_c").value() == 70.0
    assert child(dialog, QDoubleSpinBox, "field_cpu_pause_above_c").value() == 88.0
    assert child(dialog, QDoubleSpinBox, "field_cpu_resume_below_c").value() == 78.0
    assert child(dialog, QDoubleSpinBox, "field_duty_cycle").value() == 50.0
    assert not child(dialog, QCheckBox, "field_pause_on_battery").isChecked()
    apps = child(dialog, QPlainTextEdit, "field_exclusive_apps").toPlainText()
    assert apps.splitlines() == ["steam.exe", "blender"]
    assert not child(dialog, QCheckBox, "gpusAll").isChecked()
    assert child(dialog, QLineEdit, "gpusList").text() == "0, 2"
    assert child(dialog, QCheckBox, "memoryLimit").isChecked()
    assert child(dialog, QDoubleSpinBox, "memoryCap").value() == 6.5
    assert not child(dialog, QCheckBox, "field_listen_on_network").isChecked()
    relay = child(dialog, QCheckBox, "field_relay_for_others")
    assert relay.isChecked()
    assert not relay.isEnabled()  # no relaying without listening on the network
    router = child(dialog, QCheckBox, "field_map_port")
    assert router.isChecked()
    assert not router.isEnabled()
    child(dialog, QCheckBox, "field_listen_on_network").setChecked(True)
    assert relay.isEnabled()
    assert router.isEnabled()
    child(dialog, QCheckBox, "field_listen_on_network").setChecked(False)
    assert child(dialog, QCheckBox, "cpuThreadsLimit").isChecked()
    assert child(dialog, QDoubleSpinBox, "cpuThreads").value() == 3
    editor = child(dialog, ScheduleEditor, "field_schedule")
    assert editor.row_count() == 2
    assert editor.row(0).start.time() == QTime(22, 0)
    assert editor.row(0).end.time() == QTime(7, 30)
    assert dialog.values() == PREFERENCES
    # every field has its (hidden) error label, and a tooltip that explains it
    for name in PREFERENCES:
        assert child(dialog, QLabel, f"error_{name}").isHidden()
        field = dialog.findChild(QWidget, f"field_{name}")
        assert field is not None
        assert field.toolTip()
    assert child(dialog, QLabel, "error_general").isHidden()


def test_limits_dialog_shows_the_node_defaults(qtbot):
    # the client fills in what an older node leaves out: the dialog sees whole Preferences
    dialog = make_dialog(qtbot, preferences={"idle_minutes": 10})
    assert dialog.values() == {**preference_limits().defaults, "idle_minutes": 10.0}


def test_save_sends_all_values_with_the_right_types(qtbot):
    apply = Recorder()
    dialog = make_dialog(qtbot, apply=apply)
    child(dialog, QCheckBox, "field_idle_only").setChecked(True)
    child(dialog, QDoubleSpinBox, "field_duty_cycle").setValue(25.0)
    child(dialog, QPlainTextEdit, "field_exclusive_apps").setPlainText(" game.exe \n\nobs\n")
    child(dialog, QLineEdit, "gpusList").setText("1,3")
    child(dialog, QCheckBox, "memoryLimit").setChecked(False)
    # the spin box stops at the node's own limit
    child(dialog, QDoubleSpinBox, "field_pause_above_c").setValue(120.0)
    with qtbot.waitSignal(dialog.accepted, timeout=1000):
        click(qtbot, dialog, "saveButton")
    assert len(apply.calls) == 1
    sent = apply.calls[0]
    assert set(sent) == set(preference_limits().defaults)
    assert sent["idle_only"] is True
    assert sent["duty_cycle"] == 0.25
    assert sent["pause_above_c"] == preference_limits().ranges["pause_above_c"].high
    assert sent["exclusive_apps"] == ["game.exe", "obs"]
    assert sent["gpus"] == [1, 3]
    assert sent["memory_cap_gb"] is None
    assert sent["schedule"] == PREFERENCES["schedule"]
    for name in ("idle_minutes", "pause_above_c", "resume_below_c", "duty_cycle"):
        assert type(sent[name]) is float, name
    assert dialog.result() == QDialog.DialogCode.Accepted


def test_save_sends_all_gpus_and_a_memory_cap(qtbot):
    apply = Recorder()
    dialog = make_dialog(qtbot, preferences={**PREFERENCES, "memory_cap_gb": None}, apply=apply)
    child(dialog, QCheckBox, "gpusAll").setChecked(True)
    assert not child(dialog, QLineEdit, "gpusList").isEnabled()
    assert not child(dialog, QDoubleSpinBox, "memoryCap").isEnabled()
    child(dialog, QCheckBox, "memoryLimit").setChecked(True)
    child(dialog, QDoubleSpinBox, "memoryCap").setValue(12.0)
    click(qtbot, dialog, "saveButton")
    assert apply.calls[0]["gpus"] == "all"
    assert apply.calls[0]["memory_cap_gb"] == 12.0


def test_problems_from_the_node_are_shown_and_the_dialog_stays_open(qtbot):
    apply = Recorder(
        [
            "resume_below_c: resume_below_c (90.0) must be below pause_above_c (83.0)",
            "schedule.0.start: String should match pattern '^\\d\\d:\\d\\d$'",
            "preferences: the node could not save the file",
            "new_field: something only a newer node knows",
        ],
        [],
    )
    dialog = make_dialog(qtbot, apply=apply)
    accepted: list[bool] = []
    dialog.accepted.connect(lambda: accepted.append(True))
    click(qtbot, dialog, "saveButton")
    assert dialog.isVisible()
    assert not accepted

    resume = child(dialog, QLabel, "error_resume_below_c")
    assert resume.isVisible()
    assert (
        resume.text() == "“Resume GPU below” (90.0) must be below “Pause GPU above” (83.0)"
    )  # the dialog's words
    schedule = child(dialog, QLabel, "error_schedule")
    assert schedule.isVisible()
    assert schedule.text() == "window 1, start: use the form HH:MM (00:00 to 23:59)"
    general = child(dialog, QLabel, "error_general")
    assert general.isVisible()
    assert "the node could not save the file" in general.text()
    assert "new_field: something only a newer node knows" in general.text()
    assert child(dialog, QLabel, "error_pause_above_c").isHidden()

    # the second Save succeeds: the errors go away and the dialog accepts
    with qtbot.waitSignal(dialog.saved, timeout=1000) as saved:
        click(qtbot, dialog, "saveButton")
    assert saved.args == [apply.calls[1]]
    assert accepted == [True]
    assert resume.isHidden()
    assert schedule.isHidden()
    assert general.isHidden()


def test_a_check_across_fields_shows_at_the_field_it_names(qtbot):
    # the node reports checks across fields against the whole object; the message names
    # the field the user should change
    problem = "preferences: resume_below_c (90.0) must be below pause_above_c (83.0)"
    dialog = make_dialog(qtbot, apply=Recorder([problem], [problem]))
    click(qtbot, dialog, "saveButton")
    error = child(dialog, QLabel, "error_resume_below_c")
    assert error.isVisible()
    assert error.text() == "“Resume GPU below” (90.0) must be below “Pause GPU above” (83.0)"
    assert child(dialog, QLabel, "error_general").isHidden()
    # fixing either field clears it (the fix itself is checked on the next Save)
    child(dialog, QDoubleSpinBox, "field_pause_above_c").setValue(95.0)
    assert error.isHidden()
    click(qtbot, dialog, "saveButton")
    assert error.isVisible()
    child(dialog, QDoubleSpinBox, "field_resume_below_c").setValue(60.0)
    assert error.isHidden()


@pytest.mark.parametrize(
    ("node_says", "form_says"),
    [
        ("Input should be less than or equal to 100", "must be at most 100"),
        ("Input should be greater than or equal to 0", "must be at least 0"),
        ("Input should be greater than 0", "must be above 0"),
        ("Input should be a valid number, unable to parse string as a number", "must be a number"),
        ("Value error, days must not repeat", "days must not repeat"),
        ("something new", "something new"),
    ],
)
def test_pydantic_wording_reads_as_a_form_says_it(node_says, form_says):
    assert plain_message(node_says) == form_says


def test_an_unreachable_node_is_a_general_problem(qtbot):
    def apply(changes):
        raise ConnectionError("connection refused")

    dialog = make_dialog(qtbot, apply=apply)
    click(qtbot, dialog, "saveButton")
    general = child(dialog, QLabel, "error_general")
    assert general.isVisible()
    assert "connection refused" in general.text()
    assert dialog.isVisible()


def test_unparsable_gpu_indexes_are_refused_before_sending(qtbot):
    apply = Recorder()
    dialog = make_dialog(qtbot, apply=apply)
    child(dialog, QLineEdit, "gpusList").setText("0, one")
    click(qtbot, dialog, "saveButton")
    assert apply.calls == []
    assert "'one'" in child(dialog, QLabel, "error_gpus").text()


def test_cancel_rejects_without_sending(qtbot):
    apply = Recorder()
    dialog = make_dialog(qtbot, apply=apply)
    with qtbot.waitSignal(dialog.rejected, timeout=1000):
        click(qtbot, dialog, "cancelButton")
    assert apply.calls == []


def test_schedule_editor_add_and_remove_round_trip(qtbot):
    dialog = make_dialog(qtbot, preferences={**PREFERENCES, "schedule": []})
    editor = child(dialog, ScheduleEditor, "field_schedule")
    assert editor.row_count() == 0
    assert dialog.values()["schedule"] == []

    click(qtbot, editor, "addScheduleWindow")
    click(qtbot, editor, "addScheduleWindow")
    assert editor.row_count() == 2
    first, second = editor.row(0), editor.row(1)
    for day, box in first.days.items():
        box.setChecked(day in ("mon", "wed"))
    first.start.setTime(QTime(8, 15))
    first.end.setTime(QTime(17, 45))
    second.days["sun"].setChecked(False)
    assert dialog.values()["schedule"] == [
        {"days": ["mon", "wed"], "start": "08:15", "end": "17:45"},
        {"days": ["mon", "tue", "wed", "thu", "fri", "sat"], "start": "22:00", "end": "08:00"},
    ]

    qtbot.mouseClick(first.remove, Qt.MouseButton.LeftButton)
    assert editor.row_count() == 1
    remaining = dialog.values()["schedule"]
    assert remaining == [
        {"days": ["mon", "tue", "wed", "thu", "fri", "sat"], "start": "22:00", "end": "08:00"}
    ]

    # what was read back shows the same in a new dialog
    again = make_dialog(qtbot, preferences={**PREFERENCES, "schedule": remaining})
    assert again.values()["schedule"] == remaining

    qtbot.mouseClick(editor.row(0).remove, Qt.MouseButton.LeftButton)
    assert editor.row_count() == 0
    assert dialog.values()["schedule"] == []


# -- dashboard -------------------------------------------------------------------------------

FULL_STATUS = Status(
    state="working",
    reason="idle for 5 minutes",
    reason_code="idle",
    project="p1",
    project_name="Tiny MoE",
    experts={"ffn.0.3": 4, "ffn.1.7": 2},
    contributions=ContributionCounts(sent=15, accepted=12, given_up=1, refused={"stale": 2}),
    samples_done=12345,
    device=DeviceStatus(
        device="cuda:0",
        memory="24 GB",
        benchmark={"samples_per_s": 100.0},
        network_rtt_ms=35.2,
    ),
    readings=Readings(
        gpu_temp_c=66.0,
        gpu_utilization=0.8,
        gpu_power_w=210.0,
        cpu_temp_c=55.0,
        idle_seconds=400,
        on_battery=False,
    ),
    peers=7,
    uptime_s=7300,
    lifetime=Lifetime(
        working_s=93_600, samples=4_567_890, contributions_accepted=321, since=1_790_000_000
    ),
    network=NetworkStatus(
        reach="relayed",
        observed_ip="198.18.0.100",
        reachability="reachable through a relay: your router blocks direct connections",
        advice="nothing is needed; to make connections direct, forward TCP port 4001",
    ),
)

FIGURES = (
    "figureContributions",
    "figureExperts",
    "figurePeers",
    "figureSamples",
    "figureLifetime",
    "figureCredit",
    "figureDevice",
    "figureReadings",
    "figureNetwork",
)
EVENTS = TypeAdapter(list[Event])


def make_dashboard(qtbot: Any) -> DashboardWindow:
    window = DashboardWindow()
    qtbot.addWidget(window)
    window.show()
    return window


def text(window: QWidget, name: str) -> str:
    return child(window, QLabel, name).text()


def test_dashboard_shows_a_full_status(qtbot):
    window = make_dashboard(qtbot)
    assert window.windowTitle() == "moehome — dashboard"
    window.update_status(FULL_STATUS)
    state = text(window, "dashboardState")
    assert "Working" in state
    assert "idle for 5 minutes" in state
    contributions = text(window, "figureContributions")
    assert "12 accepted / 15 sent" in contributions
    assert "2 refused" in contributions
    assert text(window, "figureExperts") == "ffn.0.3, ffn.1.7"
    assert text(window, "figurePeers") == "7"
    assert text(window, "figureSamples") == "12,345 since the node started"
    assert text(window, "figureLifetime") == (
        "1 d 2 h of work  ·  4,567,890 tokens  ·  321 contributions accepted  (since "
        f"{datetime.fromtimestamp(1_790_000_000).strftime('%Y-%m-%d')})"
    )
    assert "cuda:0" in text(window, "figureDevice")
    assert "24 GB" in text(window, "figureDevice")
    network = child(window, QLabel, "figureNetwork")
    assert network.text() == "Reachable through a relay: your router blocks direct connections."
    assert network.toolTip().startswith("Nothing is needed; to make connections direct")


def test_dashboard_shows_dashes_for_what_the_node_lacks(qtbot):
    window = make_dashboard(qtbot)
    window.update_status(FULL_STATUS)
    # the node does not answer
    window.update_status(None)
    assert text(window, "dashboardState") == "Node not running"
    for name in FIGURES:
        assert text(window, name) == DASH, name
    # a node just started, on a computer without sensors: Nones and empties
    window.update_status(Status(state="starting", reason=""))
    assert text(window, "dashboardState") == "Starting  ·  up 0 min"
    assert text(window, "figureDevice") == DASH
    assert text(window, "figureReadings") == DASH
    assert text(window, "figureExperts") == "none"
    assert text(window, "figurePeers") == "0"
    assert text(window, "figureNetwork") == DASH  # an older node says nothing of it
    # only the readings this computer has
    window.update_status(
        Status(
            state="working",
            reason="",
            device=DeviceStatus(device="cpu"),
            readings=Readings(cpu_temp_c=55.0, on_battery=True),
        )
    )
    assert text(window, "figureReadings") == "CPU 55 °C  ·  on battery"
    assert text(window, "figureDevice") == "the processor (no GPU found)"


def test_dashboard_plots_the_history(qtbot):
    window = make_dashboard(qtbot)
    t0 = 1_700_000_000
    window.update_history(
        History(
            hours=[
                HourOfWork(hour=t0, working_s=3000.0, samples=40, gpu_temp_c_max=70.0),
                HourOfWork(hour=t0 + 3600, working_s=600.0, samples=5, cpu_temp_c_max=None),
            ],
            temperatures=[
                MinuteReading(at=t0, gpu_temp_c=60.0, cpu_temp_c=50.0, gpu_utilization=0.5),
                MinuteReading(at=t0 + 60, gpu_temp_c=None, cpu_temp_c=51.0),
                # out of order: the curves are drawn in time order
                MinuteReading(at=t0 + 180, gpu_temp_c=63.0, cpu_temp_c=52.0),
                MinuteReading(at=t0 + 120, gpu_temp_c=62.0, gpu_utilization=0.75),
            ],
        )
    )
    data = window.expose_data()
    assert data["gpu_temp_c"] == {"x": [t0, t0 + 120, t0 + 180], "y": [60.0, 62.0, 63.0]}
    assert data["cpu_temp_c"] == {"x": [t0, t0 + 60, t0 + 180], "y": [50.0, 51.0, 52.0]}
    assert data["gpu_utilization_pct"] == {"x": [t0, t0 + 120], "y": [50.0, 75.0]}
    assert data["samples_per_hour"]["heights"] == [40.0, 5.0]
    assert data["samples_per_hour"]["x"] == [t0 + 1800, t0 + 3600 + 1800]

    window.update_history(History())
    data = window.expose_data()
    assert data["gpu_temp_c"] == {"x": [], "y": []}
    assert data["samples_per_hour"] == {"x": [], "heights": []}


DAY = 20_400  # a UTC day (days since 1970-01-01): 2025-11-08


@pytest.mark.parametrize(
    ("credit", "words"),
    [
        (Credit(), DASH),  # the aggregators were not asked yet
        (
            Credit(total=1234.4, today=56.6, aggregators=2, aggregators_listed=2, checked_at=1.0),
            "57 today  ·  1,234 in all",
        ),
        (
            Credit(
                total=10,
                today=4,
                revoked=3,
                aggregators=1,
                aggregators_listed=3,
                checked_at=1.0,
                rank=3,
                ranked=17,
            ),
            "4 today  ·  10 in all  ·  #3 of 17 on the project's leaderboard  ·  3 taken back "
            "by bans  (1 of 3 aggregators answered)",
        ),
    ],
)
def test_the_credit_figure(credit, words):
    assert credit_text(credit) == words


@pytest.mark.parametrize(
    ("days", "title"),
    [
        ([], "Credit per day (none yet: the project's aggregators sign it as rounds close)"),
        (
            [CreditDay(day=DAY, credit=0.0)],
            "Credit per day (none yet: the project's aggregators sign it as rounds close)",
        ),
        ([CreditDay(day=DAY, credit=5.0)], "Credit per day"),
        (
            [CreditDay(day=-1, credit=700.0), CreditDay(day=DAY, credit=5.0)],
            "Credit per day (and 700 before these days)",
        ),
        ([CreditDay(day=-1, credit=700.0)], "Credit per day (700 earned before the last 90 days)"),
    ],
)
def test_the_credit_plot_says_what_it_shows(days, title):
    assert credit_title(days) == title


def test_day_labels_sit_under_their_days():
    # 2025-11-08 is DAY; labels every day while there are few, every few days after
    assert day_ticks([DAY, DAY + 2]) == [
        ((DAY + 0.5) * 86_400, "Nov 08"),
        ((DAY + 1.5) * 86_400, "Nov 09"),
        ((DAY + 2.5) * 86_400, "Nov 10"),
    ]
    ticks = day_ticks([DAY, DAY + 89])
    assert len(ticks) == 7
    assert ticks[0] == ((DAY + 0.5) * 86_400, "Nov 08")
    assert ticks[1][1] == "Nov 21"  # 13 days on
    assert day_ticks([DAY]) == [((DAY + 0.5) * 86_400, "Nov 08")]


def test_dashboard_plots_the_credit_the_aggregators_signed(qtbot):
    window = make_dashboard(qtbot)
    assert window.expose_data()["credit_per_day"] == {"x": [], "heights": []}
    credit = Credit(
        total=725.0,
        today=20.0,
        aggregators=1,
        aggregators_listed=1,
        checked_at=1.0,
        proof="/data/credit/p1.proof",
        days=[
            CreditDay(day=-1, credit=700.0),  # older than the listed days: not placed
            CreditDay(day=DAY, credit=5.0),
            CreditDay(day=DAY + 2, credit=20.0),
        ],
    )
    window.update_status(FULL_STATUS.model_copy(update={"credit": credit}))
    figure = child(window, QLabel, "figureCredit")
    assert figure.text() == "20 today  ·  725 in all"
    assert "moehome credit verify /data/credit/p1.proof" in figure.toolTip()
    # one bar per listed UTC day, over the middle of that day (a gap day has none)
    assert window.expose_data()["credit_per_day"] == {
        "x": [(DAY + 0.5) * 86_400, (DAY + 2.5) * 86_400],
        "heights": [5.0, 20.0],
    }
    assert window._credit_plot.getPlotItem().titleLabel.text == (
        "Credit per day (and 700 before these days)"
    )
    # the node stops answering: the figures go, the days it showed stay plotted
    window.update_status(None)
    assert figure.text() == DASH
    assert window.expose_data()["credit_per_day"]["heights"] == [5.0, 20.0]


def test_dashboard_breaks_curves_at_gaps(qtbot):
    window = make_dashboard(qtbot)
    t0 = 1_700_000_000
    window.update_history(
        History(
            temperatures=[
                MinuteReading(at=t0 + minute * 60, gpu_temp_c=60.0) for minute in (0, 1, 10, 11)
            ]
        )
    )
    # the node was off from minute 1 to minute 10: no line across that gap
    assert list(window._gpu_curve.opts["connect"]) == [True, False, True, True]


def test_dashboard_lists_events_newest_first(qtbot):
    window = make_dashboard(qtbot)
    window.add_events(
        EVENTS.validate_python(
            [
                {"id": 1, "kind": "state", "run": True, "reason": "idle", "at": 1_700_000_000},
                {"id": 2, "kind": "contribution", "uid": "ffn.0.3", "outcome": "accepted"},
            ]
        )
    )
    window.add_events(
        EVENTS.validate_python(
            [
                {"id": 2, "kind": "contribution", "uid": "ffn.0.3", "outcome": "accepted"},
                {"id": 3, "kind": "contribution", "uid": "ffn.0.3", "outcome": "stale"},
                {"id": 4, "kind": "error", "message": "disk full"},
                {"id": 5, "kind": "experts", "experts": ["ffn.0.3", "ffn.1.7"]},
                {"id": 6, "kind": "state", "run": False, "reason": "GPU at 84 °C"},
            ]
        )
    )
    events = child(window, QListWidget, "eventsList")
    lines = [events.item(i).text() for i in range(events.count())]
    assert len(lines) == 6
    assert "Paused: GPU at 84 °C" in lines[0]
    assert "ffn.0.3, ffn.1.7" in lines[1]
    assert "disk full" in lines[2]
    assert "refused: computed on weights that have since changed" in lines[3]
    assert "accepted" in lines[4]
    assert "Started working" in lines[5]
    assert lines[5][0].isdigit()  # it has an "at": its local time leads the line

    window.add_events(
        EVENTS.validate_python(
            [{"id": i, "kind": "preferences"} for i in range(10, 10 + MAX_EVENTS)]
        )
    )
    assert events.count() == MAX_EVENTS
    assert events.item(0).text() == "Preferences changed"


def test_runs_of_accepted_contributions_are_one_line(qtbot):
    window = make_dashboard(qtbot)

    def accepted(i: int) -> dict[str, Any]:
        return {"id": i, "kind": "contribution", "uid": f"ffn.0.{i % 3}", "outcome": "accepted"}

    stale = {"id": 100, "kind": "contribution", "uid": "ffn.0.1", "outcome": "stale"}
    # a benchmark's steps are its page's progress bar; only its end is in the log
    step = {"id": 200, "kind": "benchmark", "what": "matmul fp16", "done": 1, "total": 4}
    window.add_events(
        EVENTS.validate_python(
            [*map(accepted, range(1, 21)), stale, *map(accepted, range(121, 141)), step]
        )
    )
    events = child(window, QListWidget, "eventsList")
    lines = [events.item(i).text() for i in range(events.count())]
    assert lines == [
        "20 contributions accepted (experts ffn.0.0, ffn.0.1, ffn.0.2)",
        "Contribution to expert ffn.0.1 refused: computed on weights that have since changed;"
        " the new ones are fetched",
        "20 contributions accepted (experts ffn.0.0, ffn.0.1, ffn.0.2)",
    ]


def test_the_event_log_touches_only_what_changed(qtbot):
    """Each poll used to clear the list and make every line again (about once a second
    while working); after ~14 minutes PySide6 died in none_dealloc, the tray with it.
    Now a new event adds its line, a growing run is re-worded in place, and the other
    lines keep their items."""
    window = make_dashboard(qtbot)
    events = child(window, QListWidget, "eventsList")

    def accepted(i: int) -> dict[str, Any]:
        return {"id": i, "kind": "contribution", "uid": "ffn.0.1", "outcome": "accepted"}

    window.add_events(EVENTS.validate_python([{"id": 1, "kind": "preferences"}, accepted(2)]))
    oldest, run = events.item(1), events.item(0)
    window.add_events(EVENTS.validate_python([accepted(3)]))  # the run grows
    assert events.count() == 2
    assert events.item(0) is run
    assert events.item(0).text() == "2 contributions accepted (experts ffn.0.1)"
    assert events.item(1) is oldest
    window.add_events(EVENTS.validate_python([{"id": 4, "kind": "error", "message": "x"}]))
    assert events.count() == 3
    assert events.item(1) is run
    assert events.item(2) is oldest
    window.add_events(EVENTS.validate_python([accepted(3)]))  # nothing new: nothing done
    assert events.item(0).text().endswith("x")
    # a long session, an event a poll: the list stays bounded and in step
    for i in range(10, 10 + 3 * MAX_EVENTS):
        kind = "preferences" if i % 2 else "contribution"
        window.add_events(
            EVENTS.validate_python(
                [accepted(i) if kind == "contribution" else {"id": i, "kind": kind}]
            )
        )
    lines = [events.item(i).text() for i in range(events.count())]
    assert len(lines) == len(event_lines(window._events)) <= MAX_EVENTS
    assert lines == [row.text for row in event_rows(window._events)]


def test_describe_event_says_what_happened():
    def say(event: dict[str, Any]) -> str:
        (parsed,) = EVENTS.validate_python([event])
        return describe_event(parsed)

    project = "0123456789abcdef0123456789abcdef"
    assert say({"kind": "project", "project": project, "joined": True}) == (
        f"Project changed to {project}"
    )
    assert say({"kind": "project", "project": project, "joined": False}) == "Project left"
    assert say({"kind": "experts", "experts": []}) == "No experts assigned"
    assert say({"kind": "state", "run": True, "reason": ""}) == "Started working"
    assert say({"kind": "benchmark", "what": "done", "done": 3, "total": 3}) == (
        "Benchmark of this computer finished"
    )


def test_an_empty_plot_says_why(qtbot):
    window = make_dashboard(qtbot)
    window.update_history(History())
    assert "nothing recorded yet" in window._temperature_plot.plotItem.titleLabel.text
    t0 = 1_700_000_000
    window.update_history(History(temperatures=[MinuteReading(at=t0, cpu_temp_c=50.0)]))
    assert window._temperature_plot.plotItem.titleLabel.text == "Temperature"
    assert "no sensor on this computer" in window._utilization_plot.plotItem.titleLabel.text


def test_a_number_out_of_range_is_refused_in_words_not_clamped(qtbot):
    apply = Recorder()
    dialog = make_dialog(qtbot, apply=apply)
    dialog.show()
    box = child(dialog, QDoubleSpinBox, "field_duty_cycle")  # 0-100 %, at 50
    before = box.value()
    box.setFocus()
    box.selectAll()
    QTest.keyClicks(box, "500")
    assert box.lineEdit().text().startswith("500")  # what was typed stays while typing
    QTest.keyClick(box, Qt.Key.Key_Return)  # leaving the field: refused, said why
    error = child(dialog, QLabel, "error_duty_cycle")
    assert error.isVisible()
    assert error.text().startswith("500 is not allowed: from ")
    assert box.value() == before  # not 100, not 50 by a dropped keystroke: unchanged
    # Enter also pressed Save: it stopped at the refusal (nothing sent, still open)
    assert apply.calls == []
    assert dialog.isVisible()
    box.setValue(40.0)  # a good value clears it
    assert error.isHidden()


def test_an_empty_plot_has_the_axes_it_will_have(qtbot):
    window = make_dashboard(qtbot)
    window.update_history(History())
    (x_low, x_high), (y_low, y_high) = window._temperature_plot.plotItem.viewRange()
    assert x_high - x_low == pytest.approx(3600, rel=0.01)  # the last hour, not 1970's 0..1
    assert abs(x_high - time.time()) < 120
    assert (y_low, y_high) == pytest.approx((20, 100), abs=0.5)  # degrees, not 0-0.8


def test_the_hour_under_way_ends_now_and_counts_read_as_numbers(qtbot):
    """The tokens-per-hour plot drew the current hour into the future, once ranged
    -400..400 over hours of 0 tokens, and labelled 4e+06."""
    window = make_dashboard(qtbot)
    now = time.time()
    hour = int(now - now % 3600)
    window.update_history(
        History(
            hours=[
                HourOfWork(hour=hour - 3600, working_s=0.0, samples=0),
                HourOfWork(hour=hour, working_s=60.0, samples=0),
            ]
        )
    )
    data = window.expose_data()
    assert data["samples_per_hour"]["x"][1] <= hour + (now - hour) / 2 + 1  # half-way to now
    low, high = window._work_plot.getViewBox().viewRange()[1]
    assert low == 0.0
    assert high > 0
    assert [count_text(v) for v in (4e6, 1500.0, 120.0, 0.0)] == ["4M", "1.5k", "120", "0"]


def test_the_limits_dialog_opens_as_tall_as_its_sections_or_the_screen_allow(qtbot):
    """It opened at 386 px with a scroll bar over sections 733 px tall."""
    dialog = make_dialog(qtbot)
    scroll = dialog.findChild(QScrollArea)
    assert scroll is not None
    qtbot.wait(50)
    inside = scroll.widget()
    assert inside is not None
    content = inside.sizeHint().height()
    room = dialog.screen().availableGeometry().height() * 0.9
    assert scroll.height() >= min(content, room - 60)
    if content + 60 < room:
        assert not scroll.verticalScrollBar().isVisible()


def test_the_first_minute_of_work_is_not_zero_minutes():
    """A volunteer read "Given so far: 0 min" after a minute of work."""
    given = lifetime_text(Lifetime(working_s=45.0, samples=9_000, since=1_700_000_000))
    assert given.startswith("45 s of work")
    assert lifetime_text(Lifetime(working_s=150.0, since=1_700_000_000)).startswith("2 min")
