"""The limits dialog: when and how hard the node may use this computer.

The dialog edits the node's preferences (GET /v1/preferences) and hands the edited values
to a caller-supplied ``apply`` function that sends them to the node. The node validates
them and is the only authority on what is allowed: the spin boxes' ranges are read off the
node's own model (:func:`core.control.limits.preference_limits`, never a copy of its
numbers), and every problem the node reports is shown next to the field it names, so the
user reads the node's own words.
"""

from __future__ import annotations

import logging
import math
import os
import re
import typing
from collections.abc import Callable
from typing import Any, Final

from PySide6.QtCore import Qt, QTime, Signal, SignalInstance
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QDialog,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QTimeEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.control.limits import NumberRange, preference_limits
from core.control.preferences import Day, Preferences, Window

log = logging.getLogger(__name__)

DAYS: Final[tuple[Day, ...]] = typing.get_args(Day)
TIME_FORMAT: Final = "HH:mm"  # Qt's spelling of the node's "HH:MM"

_DEFAULT_MEMORY_CAP_GB: Final = 8.0  # shown when the user first ticks "limit"

_FIELD_AT_START: Final = re.compile(r"([a-z_]+)\b")
_ERROR_STYLE: Final = "color: #e0403a;"  # a red readable on both light and dark windows

_TOOLTIPS: Final[dict[str, str]] = {
    "idle_only": "Work only while nobody is using this computer.",
    "idle_minutes": "How long the keyboard and mouse must be untouched before work starts.",
    "schedule": (
        "Times of the week when work is allowed. No windows means any time. "
        "A window whose end is before its start runs past midnight."
    ),
    "pause_on_battery": "Stop working when the laptop runs on battery.",
    "listen_on_network": (
        "Serving needs it: the trainers of the project connect to this computer. "
        "Off, only programs on this computer can. Applies when moehome starts again."
    ),
    "relay_for_others": (
        "When this computer can be reached directly, carry connections to volunteers "
        "whose router blocks them: each one is bounded in time and bytes, so it can "
        "never carry the swarm's traffic. Applies when moehome starts again."
    ),
    "map_port": (
        "Ask the router (UPnP) to forward moehome's port to this computer, so that "
        "trainers reach it directly instead of through a relay. The port is closed "
        "again when moehome stops. Applies when moehome starts again."
    ),
    "exclusive_apps": (
        "Process names, one per line (e.g. steam.exe). While any of them runs, the node pauses."
    ),
    "pause_above_c": (
        "Pause when the GPU reaches this temperature; resume only once it has cooled "
        "to the resume temperature."
    ),
    "resume_below_c": "After a heat pause, resume once the GPU is below this temperature.",
    "cpu_pause_above_c": (
        "Pause when the CPU reaches this temperature; resume only once it has cooled "
        "to the CPU resume temperature."
    ),
    "cpu_resume_below_c": "After a heat pause, resume once the CPU is below this temperature.",
    "duty_cycle": (
        "Share of the time the node computes. Lower values keep the GPU cooler and quieter."
    ),
    "gpus": "Which GPUs the node may use: all of them, or a comma-separated list of indexes.",
    "memory_cap_gb": (
        "Largest amount of memory the experts may fill: the GPU's, or the computer's RAM "
        "when there is no GPU. Unticked: a share of what is free."
    ),
    "cpu_threads": (
        "How many processor threads the node computes with. Unticked: as many as the "
        "processor has. Lower it on a computer without a GPU to keep it responsive."
    ),
}


#: The signals by which a field's widgets say they were edited.
_EDIT_SIGNALS: Final = ("valueChanged", "toggled", "textChanged", "changed")


class RangeSpinBox(QDoubleSpinBox):
    """A spin box that refuses a number outside its range instead of clamping it: Qt's own
    box drops the keystroke that leaves the range (500 typed in 0-100 becomes 50) or
    snaps to the bound. Here the typed number stays while it is typed; when the field is
    left, the box goes back to its last value and ``refused`` says what was typed."""

    #: A sentence: the typed number and the range.
    refused = Signal(str)
    #: The value changed (Qt's valueChanged also fires, unchanged, when Enter is pressed).
    edited = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._last = self.value()
        #: The last refusal, until the value is edited: Save stops on it (Enter refuses,
        #: then presses the dialog's default button).
        self.refusal = ""
        self.valueChanged.connect(self._on_value)

    def _on_value(self, value: float) -> None:
        if value != self._last:
            self._last = value
            self.refusal = ""
            self.edited.emit()

    def _number(self, text: str) -> float | None:
        core = text.strip()
        if self.suffix() and core.endswith(self.suffix().strip()):
            core = core[: -len(self.suffix().strip())].strip()
        try:
            return float(core.replace(self.locale().decimalPoint(), "."))
        except ValueError:
            return None

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:
        result: Any = super().validate(text, pos)  # PySide6 gives a tuple or a bare state
        state = result[0] if isinstance(result, tuple) else result
        if state == QValidator.State.Invalid and self._number(text) is not None:
            # out of range, but a number: keep it on screen (refused on leaving)
            return (QValidator.State.Intermediate, text, pos)
        if isinstance(result, tuple):
            return (result[0], result[1], result[2])
        return (state, text, pos)

    def fixup(self, text: str) -> str:
        value = self._number(text)
        if value is not None and not self.minimum() <= value <= self.maximum():
            low, high = self.textFromValue(self.minimum()), self.textFromValue(self.maximum())
            self.refusal = (
                f"{value:g} is not allowed: from {low} to {high}{self.suffix()}; "
                f"it stays at {self.textFromValue(self.value())}{self.suffix()}"
            )
            self.refused.emit(self.refusal)
        return text


def spin_range(rule: NumberRange, decimals: int, scale: float = 1.0) -> tuple[float, float]:
    """The node's range in a spin box's units (``scale``: 100 for a share shown in percent)
    and precision: the smallest and largest values the box can show that the node accepts.
    An open end (duty cycle > 0) becomes the box's smallest step inside it, so that every
    value the box lets through is one the node takes."""
    factor = 10.0**decimals
    # Rounded first so that float noise (0.07 * 100 = 7.000000000000001) is no step.
    low, high = round(rule.low * scale * factor, 6), round(rule.high * scale * factor, 6)
    low_steps, high_steps = math.ceil(low), math.floor(high)
    if rule.low_open and low_steps == low:
        low_steps += 1
    if rule.high_open and high_steps == high:
        high_steps -= 1
    return low_steps / factor, high_steps / factor


_PLAIN: Final[list[tuple[re.Pattern[str], str]]] = [
    (re.compile(r"^Input should be less than or equal to (\S+)$"), r"must be at most \1"),
    (re.compile(r"^Input should be greater than or equal to (\S+)$"), r"must be at least \1"),
    (re.compile(r"^Input should be less than (\S+)$"), r"must be below \1"),
    (re.compile(r"^Input should be greater than (\S+)$"), r"must be above \1"),
    (re.compile(r"^String should match pattern .*$"), "use the form HH:MM (00:00 to 23:59)"),
    (re.compile(r"^Input should be a valid number.*$"), "must be a number"),
    (re.compile(r"^Value error, (.*)$"), r"\1"),
]


def plain_message(message: str) -> str:
    """pydantic's wording, as a form says it (table-tested)."""
    for pattern, replacement in _PLAIN:
        if pattern.match(message):
            return pattern.sub(replacement, message)
    return message


def _split_problem(problem: str) -> tuple[str, str]:
    """("schedule.0.start", "String should match ...") from "schedule.0.start: String ..."."""
    field, sep, message = problem.partition(": ")
    if not sep or not field or " " in field:
        return "", problem
    return field, message


def _parse_time(text: str) -> QTime:
    # A Window's times match HH:MM (the model checks), so Qt always reads them.
    return QTime.fromString(text, TIME_FORMAT)


class ScheduleRow(QWidget):
    """One weekly window: seven day boxes, start and end times, a remove button."""

    changed = Signal()
    remove_requested = Signal()

    def __init__(self, window: Window, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("scheduleRow")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.days: dict[str, QCheckBox] = {}
        for day in DAYS:
            box = QCheckBox(day.capitalize(), self)
            box.setObjectName(f"day_{day}")
            box.setChecked(day in window.days)
            box.toggled.connect(self.changed)
            layout.addWidget(box)
            self.days[day] = box
        self.start = self._time_edit("start", window.start)
        self.end = self._time_edit("end", window.end)
        layout.addWidget(QLabel("from", self))
        layout.addWidget(self.start)
        layout.addWidget(QLabel("to", self))
        layout.addWidget(self.end)
        self.remove = QToolButton(self)
        self.remove.setObjectName("removeWindow")
        self.remove.setText("Remove")
        self.remove.setToolTip("Remove this window")
        self.remove.clicked.connect(self.remove_requested)
        layout.addWidget(self.remove)
        layout.addStretch(1)

    def _time_edit(self, name: str, text: str) -> QTimeEdit:
        edit = QTimeEdit(self)
        edit.setObjectName(name)
        edit.setDisplayFormat(TIME_FORMAT)
        edit.setTime(_parse_time(text))
        edit.timeChanged.connect(self.changed)
        return edit

    def value(self) -> dict[str, Any]:
        return {
            "days": [day for day, box in self.days.items() if box.isChecked()],
            "start": self.start.time().toString(TIME_FORMAT),
            "end": self.end.time().toString(TIME_FORMAT),
        }


class ScheduleEditor(QWidget):
    """The weekly windows in which work is allowed; no windows means any time."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: list[ScheduleRow] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self._empty = QLabel("Any time (no windows)")
        self._empty.setObjectName("scheduleEmpty")
        layout.addWidget(self._empty)
        self._rows_layout = QVBoxLayout()
        self._rows_layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self._rows_layout)
        self.add_button = QPushButton("Add window")
        self.add_button.setObjectName("addScheduleWindow")
        self.add_button.setToolTip(
            "Add a time window; work is then allowed only inside the windows."
        )
        self.add_button.clicked.connect(lambda: self.add_window())
        add_row = QHBoxLayout()
        add_row.addWidget(self.add_button)
        add_row.addStretch(1)
        layout.addLayout(add_row)
        # As wide as a row even while empty, so that adding one never outgrows the dialog.
        template = ScheduleRow(Window(start="00:00", end="00:00"), None)
        self.setMinimumWidth(template.sizeHint().width())
        template.deleteLater()

    def row_count(self) -> int:
        return len(self._rows)

    def row(self, index: int) -> ScheduleRow:
        return self._rows[index]

    def add_window(self, window: Window | None = None) -> ScheduleRow:
        """Append a row; with no window, a sensible start: every night, 22:00 to 08:00."""
        if window is None:
            window = Window(start="22:00", end="08:00")  # every day
        row = ScheduleRow(window, self)
        row.changed.connect(self.changed)
        row.remove_requested.connect(lambda: self.remove_window(self._rows.index(row)))
        self._rows.append(row)
        self._rows_layout.addWidget(row)
        self._empty.setVisible(False)
        self.changed.emit()
        return row

    def remove_window(self, index: int) -> None:
        row = self._rows.pop(index)
        self._rows_layout.removeWidget(row)
        row.hide()
        row.deleteLater()
        self._empty.setVisible(not self._rows)
        self.changed.emit()

    def set_windows(self, windows: list[Window]) -> None:
        while self._rows:
            self.remove_window(len(self._rows) - 1)
        for window in windows:
            self.add_window(window)

    def windows(self) -> list[dict[str, Any]]:
        return [row.value() for row in self._rows]


class LimitsDialog(QDialog):
    """Edit the node's preferences; Save sends them through ``apply`` and shows its problems.

    ``apply(values)`` gets the form's values as a dict of preference changes (the body of
    ``set_preferences``) and returns the node's validation problems as "field: message"
    strings; an empty list means the node saved them, and the dialog then accepts.
    ``saved`` is emitted with the values the node accepted.
    """

    saved = Signal(dict)

    def __init__(
        self,
        preferences: Preferences,
        apply: Callable[[dict[str, Any]], list[str]],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._apply = apply
        self._errors: dict[str, QLabel] = {}
        self._captions: dict[str, str] = {}
        self._range_boxes: dict[str, list[RangeSpinBox]] = {}
        self.setObjectName("limitsDialog")
        self.setWindowTitle("moehome — limits")

        self._idle_only = QCheckBox("Only when the computer is idle")
        self._idle_minutes = self._spin("idle_minutes", " min", decimals=1, step=1.0)
        self._schedule = ScheduleEditor()
        self._pause_on_battery = QCheckBox("Pause on battery power")
        self._exclusive_apps = QPlainTextEdit()
        self._exclusive_apps.setPlaceholderText("steam.exe\nblender")
        self._exclusive_apps.setFixedHeight(80)
        self._pause_above_c = self._spin("pause_above_c", " °C")
        self._resume_below_c = self._spin("resume_below_c", " °C")
        self._cpu_pause_above_c = self._spin("cpu_pause_above_c", " °C")
        self._cpu_resume_below_c = self._spin("cpu_resume_below_c", " °C")
        # a share of the time, shown in percent
        self._duty_cycle = self._spin("duty_cycle", " %", decimals=1, step=5.0, scale=100.0)
        self._gpus_all = QCheckBox("All GPUs")
        self._gpus_all.setObjectName("gpusAll")
        self._gpus_list = QLineEdit()
        self._gpus_list.setObjectName("gpusList")
        self._gpus_list.setPlaceholderText("0, 1")
        self._gpus_all.toggled.connect(lambda checked: self._gpus_list.setEnabled(not checked))
        self._memory_limit = QCheckBox("Limit to")
        self._memory_limit.setObjectName("memoryLimit")
        self._memory_cap = self._spin("memory_cap_gb", " GB", decimals=1, step=1.0)
        self._memory_cap.setObjectName("memoryCap")
        self._memory_limit.toggled.connect(self._memory_cap.setEnabled)
        self._threads_limit = QCheckBox("Limit to")
        self._threads_limit.setObjectName("cpuThreadsLimit")
        self._cpu_threads = self._spin("cpu_threads", " threads", decimals=0, step=1.0)
        self._cpu_threads.setObjectName("cpuThreads")
        self._threads_limit.toggled.connect(self._cpu_threads.setEnabled)
        self._listen_on_network = QCheckBox("Let other computers connect (needed to serve)")
        self._listen_on_network.setObjectName("listenOnNetwork")
        self._relay_for_others = QCheckBox("Relay for volunteers behind a router")
        self._listen_on_network.toggled.connect(self._relay_for_others.setEnabled)
        self._map_port = QCheckBox("Ask the router to forward a port (UPnP)")
        self._listen_on_network.toggled.connect(self._map_port.setEnabled)

        gpus = QWidget()
        gpus_layout = QHBoxLayout(gpus)
        gpus_layout.setContentsMargins(0, 0, 0, 0)
        gpus_layout.addWidget(self._gpus_all)
        gpus_layout.addWidget(self._gpus_list, 1)
        memory = QWidget()
        memory_layout = QHBoxLayout(memory)
        memory_layout.setContentsMargins(0, 0, 0, 0)
        memory_layout.addWidget(self._memory_limit)
        memory_layout.addWidget(self._memory_cap, 1)
        threads = QWidget()
        threads_layout = QHBoxLayout(threads)
        threads_layout.setContentsMargins(0, 0, 0, 0)
        threads_layout.addWidget(self._threads_limit)
        threads_layout.addWidget(self._cpu_threads, 1)

        self._error_general = QLabel()
        self._error_general.setObjectName("error_general")
        self._style_error(self._error_general)

        when = self._section(
            "When to work",
            [
                ("idle_only", "Idle", self._idle_only),
                ("idle_minutes", "Idle for at least", self._idle_minutes),
                ("schedule", "Schedule", self._schedule),
                ("pause_on_battery", "Battery", self._pause_on_battery),
                ("exclusive_apps", "Pause while running", self._exclusive_apps),
            ],
        )
        temperature = self._section(
            "Temperature",
            [
                ("pause_above_c", "Pause GPU above", self._pause_above_c),
                ("resume_below_c", "Resume GPU below", self._resume_below_c),
                ("cpu_pause_above_c", "Pause CPU above", self._cpu_pause_above_c),
                ("cpu_resume_below_c", "Resume CPU below", self._cpu_resume_below_c),
            ],
        )
        resources = self._section(
            "Resources",
            [
                ("duty_cycle", "Duty cycle", self._duty_cycle),
                ("gpus", "GPUs", gpus),
                ("memory_cap_gb", "Memory", memory),
                ("cpu_threads", "Processor", threads),
            ],
        )
        network = self._section(
            "Network",
            [
                ("listen_on_network", "Reachable", self._listen_on_network),
                ("relay_for_others", "Relay", self._relay_for_others),
                ("map_port", "Router", self._map_port),
            ],
        )

        content = QWidget()
        content_layout = QVBoxLayout(content)
        for section in (when, temperature, resources, network):
            content_layout.addWidget(section)
        content_layout.addStretch(1)
        # The schedule can grow to many rows; scroll rather than outgrow the screen.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(content)
        # Scroll only vertically: the dialog is as wide as its widest row (the schedule's).
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(
            content.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width()
        )

        save = QPushButton("Save")
        save.setObjectName("saveButton")
        save.setDefault(True)
        save.clicked.connect(self._save)
        cancel = QPushButton("Cancel")
        cancel.setObjectName("cancelButton")
        cancel.clicked.connect(self.reject)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(cancel)
        buttons.addWidget(save)

        layout = QVBoxLayout(self)
        layout.addWidget(self._error_general)
        layout.addWidget(scroll, 1)
        layout.addLayout(buttons)

        self.set_values(preferences)
        self.show_problems([])
        # open tall enough for every section (it opened with a scroll bar), within the
        # screen; the schedule's rows beyond that scroll
        self._scroll, self._content = scroll, content
        self._fit_height()

    def _fit_height(self) -> None:
        around = self.sizeHint().height() - self._scroll.sizeHint().height()
        wanted = around + self._content.sizeHint().height()
        screen = self.screen()
        if screen is not None:
            wanted = min(wanted, int(screen.availableGeometry().height() * 0.9))
        self.resize(max(self.width(), self.sizeHint().width()), wanted)

    # -- building -------------------------------------------------------------------------

    @staticmethod
    def _spin(
        name: str, suffix: str, *, decimals: int = 1, step: float = 1.0, scale: float = 1.0
    ) -> QDoubleSpinBox:
        """A spin box for the node's preference ``name``, with exactly the node's range."""
        spin = RangeSpinBox()
        spin.setDecimals(decimals)  # first: Qt rounds the range to the decimals
        spin.setRange(*spin_range(preference_limits().ranges[name], decimals, scale))
        spin.setSingleStep(step)
        spin.setSuffix(suffix)
        return spin

    @staticmethod
    def _style_error(label: QLabel) -> None:
        label.setStyleSheet(_ERROR_STYLE)
        label.setWordWrap(True)
        label.setTextFormat(Qt.TextFormat.PlainText)  # node messages are text, never markup

    def _section(self, title: str, rows: list[tuple[str, str, QWidget]]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for name, caption, widget in rows:
            widget.setObjectName(f"field_{name}")
            widget.setToolTip(_TOOLTIPS[name])
            error = QLabel()
            error.setObjectName(f"error_{name}")
            self._style_error(error)
            self._errors[name] = error
            cell = QWidget()
            cell_layout = QVBoxLayout(cell)
            cell_layout.setContentsMargins(0, 0, 0, 0)
            cell_layout.setSpacing(2)
            cell_layout.addWidget(widget)
            cell_layout.addWidget(error)
            label = QLabel(caption)
            label.setToolTip(_TOOLTIPS[name])
            form.addRow(label, cell)
            self._captions[name] = caption
            self._clear_when_edited(name, widget)
            for part in [widget, *widget.findChildren(RangeSpinBox)]:
                if isinstance(part, RangeSpinBox):
                    self._range_boxes.setdefault(name, []).append(part)
                    part.refused.connect(
                        lambda message, label=error: self._set_error(label, [message])
                    )
        return box

    def _clear_when_edited(self, name: str, widget: QWidget) -> None:
        """An error goes as soon as its field is edited (the fix is checked on Save): the
        field's own, and a check across fields that names it."""
        for part in [widget, *widget.findChildren(QWidget)]:
            if isinstance(part.parent(), QAbstractSpinBox):
                continue  # a spin box's own line edit: its value is what counts
            names = ("edited",) if isinstance(part, RangeSpinBox) else _EDIT_SIGNALS
            for signal_name in names:
                signal = getattr(part, signal_name, None)
                if isinstance(signal, SignalInstance):
                    signal.connect(lambda *_args, name=name: self._field_edited(name))

    def _field_edited(self, name: str) -> None:
        caption = self._captions.get(name, name)
        for other, label in self._errors.items():
            if other == name or f"“{caption}”" in label.text():
                self._set_error(label, [])

    # -- values ---------------------------------------------------------------------------

    def set_values(self, preferences: Preferences) -> None:
        """Show ``preferences``."""
        self._idle_only.setChecked(preferences.idle_only)
        self._pause_on_battery.setChecked(preferences.pause_on_battery)
        for name, spin in self._temperature_spins().items():
            spin.setValue(getattr(preferences, name))
        self._idle_minutes.setValue(preferences.idle_minutes)
        self._duty_cycle.setValue(100.0 * preferences.duty_cycle)
        self._schedule.set_windows(preferences.schedule)
        self._exclusive_apps.setPlainText("\n".join(preferences.exclusive_apps))
        gpus = preferences.gpus
        every = gpus == "all"
        self._gpus_all.setChecked(every)
        self._gpus_list.setEnabled(not every)
        self._gpus_list.setText("" if gpus == "all" else ", ".join(str(g) for g in gpus))
        cap = preferences.memory_cap_gb
        self._memory_limit.setChecked(cap is not None)
        self._memory_cap.setEnabled(cap is not None)
        self._memory_cap.setValue(_DEFAULT_MEMORY_CAP_GB if cap is None else cap)
        threads = preferences.cpu_threads
        self._threads_limit.setChecked(threads is not None)
        self._cpu_threads.setEnabled(threads is not None)
        # shown when first ticked: half the threads, the other half for the volunteer
        self._cpu_threads.setValue(threads or max(1, (os.cpu_count() or 2) // 2))
        self._listen_on_network.setChecked(preferences.listen_on_network)
        self._relay_for_others.setChecked(preferences.relay_for_others)
        self._relay_for_others.setEnabled(preferences.listen_on_network)
        self._map_port.setChecked(preferences.map_port)
        self._map_port.setEnabled(preferences.listen_on_network)

    def values(self) -> dict[str, Any]:
        """What the form holds, in the shape of the node's preferences.

        GPU indexes that are not whole numbers are left out here; Save refuses to send
        them (see ``_local_problems``) so the user is told instead of silently ignored.
        """
        result: dict[str, Any] = {
            "idle_only": self._idle_only.isChecked(),
            "idle_minutes": float(self._idle_minutes.value()),
        }
        for name, spin in self._temperature_spins().items():
            result[name] = float(spin.value())
        # Rounded so that 55.5 % reads back as 0.555, not 0.5549999999999999.
        result["duty_cycle"] = round(self._duty_cycle.value() / 100.0, 6)
        result["schedule"] = self._schedule.windows()
        result["pause_on_battery"] = self._pause_on_battery.isChecked()
        apps: list[str] = []
        for line in self._exclusive_apps.toPlainText().splitlines():
            name = line.strip()
            if name and name not in apps:
                apps.append(name)
        result["exclusive_apps"] = apps
        if self._gpus_all.isChecked():
            result["gpus"] = "all"
        else:
            indexes, _bad = self._parse_gpus()
            result["gpus"] = indexes
        result["memory_cap_gb"] = (
            float(self._memory_cap.value()) if self._memory_limit.isChecked() else None
        )
        result["cpu_threads"] = (
            round(self._cpu_threads.value()) if self._threads_limit.isChecked() else None
        )
        result["listen_on_network"] = self._listen_on_network.isChecked()
        result["relay_for_others"] = self._relay_for_others.isChecked()
        result["map_port"] = self._map_port.isChecked()
        return result

    def schedule_editor(self) -> ScheduleEditor:
        return self._schedule

    def _temperature_spins(self) -> dict[str, QDoubleSpinBox]:
        return {
            "pause_above_c": self._pause_above_c,
            "resume_below_c": self._resume_below_c,
            "cpu_pause_above_c": self._cpu_pause_above_c,
            "cpu_resume_below_c": self._cpu_resume_below_c,
        }

    def _parse_gpus(self) -> tuple[list[int], list[str]]:
        indexes: list[int] = []
        bad: list[str] = []
        for token in self._gpus_list.text().replace(";", ",").split(","):
            token = token.strip()
            if not token:
                continue
            try:
                indexes.append(int(token))
            except ValueError:
                bad.append(token)
        return indexes, bad

    def _local_problems(self) -> list[str]:
        """Problems the node cannot report because the form cannot even express them: a
        number refused as out of range, GPU indexes that are no numbers."""
        problems = [
            f"{name}: {box.refusal}"
            for name, boxes in self._range_boxes.items()
            for box in boxes
            if box.refusal
        ]
        if not self._gpus_all.isChecked():
            _indexes, bad = self._parse_gpus()
            if bad:
                listed = ", ".join(repr(token) for token in bad)
                problems.append(
                    f"gpus: {listed} is not a GPU index; use whole numbers such as 0, 1"
                )
        return problems

    # -- saving ---------------------------------------------------------------------------

    def show_problems(self, problems: list[str]) -> None:
        """Put each "field: message" under its field; others at the top of the dialog."""
        by_field: dict[str, list[str]] = {name: [] for name in self._errors}
        general: list[str] = []
        for problem in problems:
            path, message = _split_problem(str(problem))
            parts = path.split(".") if path else []
            words = self.in_field_words(message)
            if parts and parts[0] in by_field:
                by_field[parts[0]].append(self._describe(parts, words))
            elif parts == ["preferences"]:
                # A check across fields is reported against the whole object, but its
                # message starts with the field it is about ("resume_below_c (90.0) must
                # be below ..."): show it there, where the user will change it.
                named = _FIELD_AT_START.match(message)
                if named and named.group(1) in by_field:
                    by_field[named.group(1)].append(words)
                else:
                    general.append(words)
            else:
                general.append(str(problem))
        for name, label in self._errors.items():
            self._set_error(label, by_field[name])
        self._set_error(self._error_general, general)

    def in_field_words(self, message: str) -> str:
        """The node's message with the dialog's words: each preference's name becomes its
        caption ("resume_below_c (90.0) must be below pause_above_c (83.0)" reads
        "“Resume GPU below” (90.0) must be below “Pause GPU above” (83.0)"), and
        pydantic's phrasing the short one a form uses."""
        text = plain_message(message)
        for name, caption in sorted(self._captions.items(), key=lambda item: -len(item[0])):
            text = re.sub(rf"\b{re.escape(name)}\b", f"“{caption}”", text)
        return text

    @staticmethod
    def _describe(parts: list[str], message: str) -> str:
        """The message, prefixed with where inside the field it applies (1-based windows)."""
        rest = parts[1:]
        if not rest:
            return message
        if parts[0] == "schedule" and rest[0].isdigit():
            where = [f"window {int(rest[0]) + 1}", *rest[1:]]
        else:
            where = [f"item {int(p) + 1}" if p.isdigit() else p for p in rest]
        return f"{', '.join(where)}: {message}"

    @staticmethod
    def _set_error(label: QLabel, messages: list[str]) -> None:
        label.setText("\n".join(messages))
        label.setVisible(bool(messages))

    def _save(self) -> None:
        local = self._local_problems()
        if local:
            self.show_problems(local)
            return
        values = self.values()
        try:
            problems = list(self._apply(values))
        except Exception as exc:  # the node may be unreachable: say so, keep the edits
            log.exception("sending preferences to the node failed")
            problems = [f"preferences: could not reach the node ({exc})"]
        self.show_problems(problems)
        if problems:
            log.info("the node refused the preferences: %s", problems)
            return
        self.saved.emit(values)
        self.accept()
