"""The dashboard window: what the node is doing now, and what it did over the last hours.

It only displays the models that the caller fetched from the node's control API
(``/v1/status``, ``/v1/history``, ``/v1/events``; see :mod:`core.control.models`); it
never talks to the node itself. A value the node does not have (a sensor this computer
lacks, a node that is not running) shows as "—".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, assert_never

import numpy as np
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from core.control.models import (
    BenchmarkEvent,
    ContributionCounts,
    ContributionEvent,
    Credit,
    CreditDay,
    DeviceStatus,
    ErrorEvent,
    Event,
    ExpertsEvent,
    History,
    Lifetime,
    MinuteReading,
    PreferencesEvent,
    ProjectEvent,
    Readings,
    StateEvent,
    Status,
)
from core.protocol.refusals import in_words

# isort: split
# pyqtgraph binds to whichever Qt binding is already loaded (else the first it finds, which
# could be PyQt6); the app is PySide6 only, so PySide6 must be imported first.
import pyqtgraph as pg  # type: ignore[import-untyped]  # pyqtgraph ships no type hints

log = logging.getLogger(__name__)

DASH: Final = "—"
MAX_EVENTS: Final = 200
# Rows of the temperature history are a minute apart; a longer gap means the node was off,
# and a line drawn across it would invent readings.
_GAP_S: Final = 150.0
_HOUR_S: Final = 3600.0
_DAY_S: Final = 86_400.0

# Mid-luminance colours that stay readable on both a dark and a light background.
_GPU_COLOUR: Final = "#f28e2b"  # orange
_CPU_COLOUR: Final = "#4c9be8"  # blue
_UTIL_COLOUR: Final = "#3fb27f"  # green
_BAR_COLOUR: Final = "#59a14f"
_CREDIT_COLOUR: Final = "#b07aa1"  # purple

_STATES: Final[dict[str, str]] = {
    "working": "Working",
    "paused": "Paused",
    "starting": "Starting",
    "waiting": "Waiting",
    "no project": "No project",
    "error": "Error",
    "not running": "Node not running",
}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes or not seconds:
        return f"{minutes} min"
    return f"{seconds} s"  # not "0 min" after the first minute's work


def _local_time(at: float) -> tuple[str, str] | None:
    """(short, full) local time of a unix timestamp, or None without a usable one (an
    event's ``at`` is 0 when the node did not stamp it)."""
    if at <= 0:
        return None
    try:
        moment = datetime.fromtimestamp(at)
    except (OverflowError, OSError, ValueError):
        return None
    short = "%H:%M:%S" if moment.date() == datetime.now().date() else "%Y-%m-%d %H:%M"
    return moment.strftime(short), moment.strftime("%Y-%m-%d %H:%M:%S")


def paused_text(reason: str) -> str:
    """ "Paused: <reason>", or the reason alone when it says it ("Paused by you", not
    "Paused: paused by you")."""
    if not reason:
        return "Paused"
    if reason.startswith("paused"):
        return reason[0].upper() + reason[1:]
    return f"Paused: {reason}"


def describe_event(event: Event) -> str:
    """A sentence a volunteer can read, for one event of the node's event log."""
    if isinstance(event, StateEvent):
        if event.run:
            # the node's reason for working is "working": no "Started working: working"
            extra = event.reason if event.reason not in ("", "working") else ""
            return f"Started working: {extra}" if extra else "Started working"
        return paused_text(event.reason)
    if isinstance(event, ExpertsEvent):
        if event.experts:
            return "Now serving experts " + ", ".join(event.experts)
        return "No experts assigned"
    if isinstance(event, ContributionEvent):
        if event.outcome == "accepted":
            return f"Contribution to expert {event.uid} accepted"
        return f"Contribution to expert {event.uid} refused: {in_words(event.outcome)}"
    if isinstance(event, ProjectEvent):
        # Leaving names the project left: only a join changes to a project.
        if event.joined and event.project:
            return f"Project changed to {event.project}"
        return "Project left"
    if isinstance(event, PreferencesEvent):
        return "Preferences changed"
    if isinstance(event, BenchmarkEvent):
        return "Benchmark of this computer finished"
    if isinstance(event, ErrorEvent):
        return f"Error: {event.message or 'unknown'}"
    assert_never(event)


def event_lines(events: list[Event]) -> list[tuple[str, Event]]:
    """The log's lines, newest first: a run of accepted contributions (one every few
    seconds while working) is one line with its count, so the rest stays in sight. Each
    line comes with the event whose time it shows (the run's newest)."""
    return [(sentence, shown) for sentence, shown, _ in _lines_with_oldest(events)]


def _lines_with_oldest(events: list[Event]) -> list[tuple[str, Event, Event]]:
    lines: list[tuple[str, Event, Event]] = []
    run: list[ContributionEvent] = []

    def close_run() -> None:
        if not run:
            return
        if len(run) == 1:
            lines.append((describe_event(run[0]), run[0], run[0]))
        else:
            experts = sorted({e.uid for e in run})
            shown = ", ".join(experts[:4]) + (
                ", \N{HORIZONTAL ELLIPSIS}" if len(experts) > 4 else ""
            )
            lines.append((f"{len(run)} contributions accepted (experts {shown})", run[0], run[-1]))
        run.clear()

    for event in events:
        if isinstance(event, BenchmarkEvent) and event.what != "done":
            continue  # its steps are the benchmark page's progress bar, not the log's
        if isinstance(event, ContributionEvent) and event.outcome == "accepted":
            run.append(event)
            continue
        close_run()
        lines.append((describe_event(event), event, event))
    close_run()
    return lines


@dataclass(frozen=True)
class EventRow:
    """A line of the event log as shown: ``key`` stays the same while a line only
    changes its words (a run of accepted contributions that grows keeps its oldest)."""

    key: int
    text: str
    tooltip: str
    error: bool


def event_rows(events: list[Event]) -> list[EventRow]:
    """``event_lines`` with their times, as the log shows them, newest first."""
    rows = []
    for sentence, shown, oldest in _lines_with_oldest(events):
        when = _local_time(shown.at)
        rows.append(
            EventRow(
                key=oldest.id,
                text=f"{when[0]}  {sentence}" if when else sentence,
                tooltip=when[1] if when else "",
                error=isinstance(shown, ErrorEvent),
            )
        )
    return rows


TEMPERATURE_TITLE: Final = "Temperature"
UTILIZATION_TITLE: Final = "GPU utilization"


def plot_title(
    title: str, rows: list[MinuteReading], *readings: Callable[[MinuteReading], float | None]
) -> str:
    """The plot's title, saying why it is empty when it is."""
    if not rows:
        return f"{title} (nothing recorded yet: a reading every minute)"
    if not any(read(row) is not None for row in rows for read in readings):
        return f"{title} (no sensor on this computer reports it)"
    return title


CREDIT_TITLE: Final = "Credit per day"
CREDIT_MEAN: Final = (
    "Credit: what the project's aggregators signed that this computer's checked "
    "contributions earned (nothing for refused ones; a ban takes back its period's)."
)


def credit_text(credit: Credit) -> str:
    """The credit figure: today, in all, the rank; what bans took back; how many of the
    project's aggregators answered (each states the credit of its own experts)."""
    if credit.checked_at is None:
        return DASH
    parts = [f"{credit.today:,.0f} today", f"{credit.total:,.0f} in all"]
    if credit.rank is not None:
        parts.append(f"#{credit.rank} of {credit.ranked} on the project's leaderboard")
    if credit.revoked > 0:
        parts.append(f"{credit.revoked:,.0f} taken back by bans")
    text = "  ·  ".join(parts)
    if credit.aggregators < credit.aggregators_listed:
        text += f"  ({credit.aggregators} of {credit.aggregators_listed} aggregators answered)"
    return text


def credit_title(days: list[CreditDay]) -> str:
    """The credit plot's title, saying why it is empty when it is, and what it cannot
    place (the days an aggregator no longer lists one by one, summed)."""
    earlier = sum(d.credit for d in days if d.day < 0)
    if not any(d.credit > 0 for d in days if d.day >= 0):
        if earlier > 0:
            return f"{CREDIT_TITLE} ({earlier:,.0f} earned before the last 90 days)"
        return f"{CREDIT_TITLE} (none yet: the project's aggregators sign it as rounds close)"
    if earlier > 0:
        return f"{CREDIT_TITLE} (and {earlier:,.0f} before these days)"
    return CREDIT_TITLE


def day_ticks(days: list[int], most: int = 7) -> list[tuple[float, str]]:
    """Labels of a plot of UTC days: under the middle of each shown day, at most
    ``most`` of them, spread over the first to the last day."""
    first, last = min(days), max(days)
    step = -(-(last - first + 1) // most)
    return [
        ((day + 0.5) * _DAY_S, datetime.fromtimestamp(day * _DAY_S, UTC).strftime("%b %d"))
        for day in range(first, last + 1, step)
    ]


TOKENS_MEAN: Final = (
    "A token computed: one token of the project's text through one of this computer's "
    "experts, forward or backward."
)


def lifetime_text(lifetime: Lifetime) -> str:
    """Everything this computer gave, in one line (kept across restarts)."""
    if lifetime.since is None:
        return DASH
    started = datetime.fromtimestamp(lifetime.since).strftime("%Y-%m-%d")
    return (
        f"{_duration(lifetime.working_s)} of work  ·  {lifetime.samples:,} tokens  ·  "
        f"{lifetime.contributions_accepted:,} contributions accepted  (since {started})"
    )


def count_text(value: float) -> str:
    """An axis label a person reads: 4M, 1.5k, 120 (not 4e+06)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


class _CountAxis(pg.AxisItem):  # type: ignore[misc]  # pyqtgraph is untyped
    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802 - pyqtgraph's name
        return [count_text(v * scale) for v in values]


class DashboardWindow(QWidget):
    """A top-level window with the node's figures, plots of the history and the event log.

    Feed it with ``update_status``, ``update_history`` and ``add_events``; ``expose_data``
    returns what the plots show, for tests and diagnostics.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("dashboard")
        self.setWindowTitle("moehome — dashboard")
        self.resize(900, 700)
        self._events: list[Event] = []  # newest first
        self._seen_ids: set[int] = set()
        self._row_keys: list[int] = []  # the key of each line the list shows, in order

        self._state = QLabel(DASH)
        self._state.setObjectName("dashboardState")
        self._state.setTextFormat(Qt.TextFormat.PlainText)  # reasons come from the node
        font = self._state.font()
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        self._state.setFont(font)
        self._state.setWordWrap(True)

        figures = QGridLayout()
        self._figures: dict[str, QLabel] = {}
        for row, (name, caption) in enumerate(
            [
                ("figureContributions", "Contributions"),
                ("figureExperts", "Experts"),
                ("figurePeers", "Peers"),
                ("figureSamples", "Tokens computed"),
                ("figureLifetime", "Given so far"),
                ("figureCredit", "Credit"),
                ("figureDevice", "Device"),
                ("figureNetwork", "Network"),
                ("figureReadings", "Now"),
            ]
        ):
            value = QLabel(DASH)
            value.setObjectName(name)
            value.setTextFormat(Qt.TextFormat.PlainText)
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            figures.addWidget(QLabel(caption + ":"), row, 0)
            figures.addWidget(value, row, 1)
            self._figures[name] = value
        figures.setColumnStretch(1, 1)

        self._temperature_plot = self._plot("temperaturePlot", TEMPERATURE_TITLE, "°C")
        self._utilization_plot = self._plot("utilizationPlot", UTILIZATION_TITLE, "%")
        self._utilization_plot.setXLink(self._temperature_plot)
        self._utilization_plot.setYRange(0, 100)
        self._work_plot = self._plot("workPlot", "Tokens computed per hour", "tokens")
        legend = self._temperature_plot.getPlotItem().addLegend()
        self._legends = [legend]
        self._gpu_curve = self._temperature_plot.plot(
            name="GPU", pen=pg.mkPen(_GPU_COLOUR, width=2)
        )
        self._cpu_curve = self._temperature_plot.plot(
            name="CPU", pen=pg.mkPen(_CPU_COLOUR, width=2)
        )
        self._util_curve = self._utilization_plot.plot(pen=pg.mkPen(_UTIL_COLOUR, width=2))
        self._bars = _empty_bars(_HOUR_S * 0.8, _BAR_COLOUR)
        self._work_plot.addItem(self._bars)
        self._credit_plot = self._plot("creditPlot", CREDIT_TITLE, "credit")
        self._credit_bars = _empty_bars(_DAY_S * 0.8, _CREDIT_COLOUR)
        self._credit_plot.addItem(self._credit_bars)
        self._credit_plot.setToolTip(CREDIT_MEAN)
        self._credit_days: list[CreditDay] | None = None  # what the bars show

        self._events_list = QListWidget()
        self._events_list.setObjectName("eventsList")
        self._events_list.setWordWrap(True)

        # what this computer did per hour beside what the project credited it per day
        given = QSplitter(Qt.Orientation.Horizontal)
        given.addWidget(self._work_plot)
        given.addWidget(self._credit_plot)
        plots = QSplitter(Qt.Orientation.Vertical)
        for widget in (self._temperature_plot, self._utilization_plot, given):
            plots.addWidget(widget)
        plots.addWidget(self._events_list)
        plots.setStretchFactor(0, 3)
        plots.setStretchFactor(1, 2)
        plots.setStretchFactor(2, 2)
        plots.setStretchFactor(3, 2)

        layout = QVBoxLayout(self)
        layout.addWidget(self._state)
        layout.addLayout(figures)
        layout.addWidget(plots, 1)
        self._apply_palette()
        self.update_history(History())  # the axes and words of an empty history, at once
        self._show_credit_days([])

    # -- plots and colours ----------------------------------------------------------------

    def _plot(self, name: str, title: str, unit: str) -> Any:
        plot = pg.PlotWidget(
            axisItems={
                "bottom": pg.DateAxisItem(orientation="bottom"),
                "left": _CountAxis(orientation="left"),
            }
        )
        plot.setObjectName(name)
        plot.setTitle(title)
        plot.setLabel("left", unit)
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setMinimumHeight(120)
        plot.setMenuEnabled(False)
        return plot

    def _plots(self) -> tuple[Any, ...]:
        return (
            self._temperature_plot,
            self._utilization_plot,
            self._work_plot,
            self._credit_plot,
        )

    def _apply_palette(self) -> None:
        """Use the window's own colours so the plots follow a light or dark theme."""
        palette = self.palette()
        background = palette.color(QPalette.ColorRole.Base)
        foreground = palette.color(QPalette.ColorRole.WindowText)
        for plot in self._plots():
            plot.setBackground(background)
            item = plot.getPlotItem()
            for side in ("left", "bottom"):
                axis = item.getAxis(side)
                axis.setPen(pg.mkPen(foreground))
                axis.setTextPen(pg.mkPen(foreground))
            item.titleLabel.setText(item.titleLabel.text, color=QColor(foreground))
        for legend in self._legends:
            legend.setLabelTextColor(foreground)
            # setLabelTextColor restyles only later items; restyle the existing ones too.
            for _sample, label in legend.items:
                label.setText(label.text, color=QColor(foreground))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802  (Qt's name)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            self._apply_palette()
        super().changeEvent(event)

    # -- status ---------------------------------------------------------------------------

    def update_status(self, status: Status | None) -> None:
        """Show the node's /v1/status; ``None``: the node is not running."""
        if status is None:
            self._state.setText(_STATES["not running"])
            self._state.setToolTip("")
            for label in self._figures.values():
                label.setText(DASH)
                label.setToolTip("")
            return  # the credit plot keeps the last days it was shown
        text = _STATES.get(status.state, status.state)
        if status.state == "paused":
            text = paused_text(status.reason)
        elif status.reason and status.reason != status.state:
            text = f"{text}: {status.reason}"
        project = status.project_name or status.project
        if project:
            text = f"{text}  ·  project {project}"
        text = f"{text}  ·  up {_duration(status.uptime_s)}"
        self._state.setText(text)
        self._state.setToolTip(status.reason_code)

        self._figures["figureContributions"].setText(self._contributions(status.contributions))
        experts_label = self._figures["figureExperts"]
        if status.experts:
            experts_label.setText(", ".join(sorted(status.experts)))
            experts_label.setToolTip(
                "\n".join(
                    f"{uid}: version {version}" for uid, version in sorted(status.experts.items())
                )
            )
        else:
            experts_label.setText("none")
            experts_label.setToolTip("")
        self._figures["figurePeers"].setText(f"{status.peers:,}")
        self._figures["figureSamples"].setText(f"{status.samples_done:,} since the node started")
        self._figures["figureSamples"].setToolTip(TOKENS_MEAN)
        self._figures["figureLifetime"].setText(lifetime_text(status.lifetime))
        self._figures["figureLifetime"].setToolTip(TOKENS_MEAN)
        credit = status.credit
        self._figures["figureCredit"].setText(credit_text(credit))
        self._figures["figureCredit"].setToolTip(
            f"{CREDIT_MEAN}\nProof: {credit.proof} (check it on any computer: "
            f"moehome credit verify {credit.proof})"
            if credit.proof
            else CREDIT_MEAN
        )
        if credit.checked_at is not None:
            self._show_credit_days(credit.days)
        self._figures["figureDevice"].setText(self._device(status.device))
        self._figures["figureReadings"].setText(self._readings(status.readings))
        network = status.network
        self._figures["figureNetwork"].setText(_sentence(network.reachability) or DASH)
        self._figures["figureNetwork"].setToolTip(_sentence(network.advice))

    def _show_credit_days(self, days: list[CreditDay]) -> None:
        """Bars of credit per UTC day, each spanning its day. (The status comes every
        second; the statements change every few minutes: redrawn only then.)"""
        if days == self._credit_days:
            return
        self._credit_days = list(days)
        listed = [d for d in days if d.day >= 0]
        self._credit_bars.setOpts(
            x=np.asarray([(d.day + 0.5) * _DAY_S for d in listed], dtype=float),
            height=np.asarray([d.credit for d in listed], dtype=float),
            width=_DAY_S * 0.8,
        )
        self._credit_plot.setTitle(credit_title(days))
        # a bar is a UTC day: its label under its middle ("Nov 18"), not midnights in
        # local time on either side of it; a label every few days when there are many
        axis = self._credit_plot.getPlotItem().getAxis("bottom")
        axis.setTicks([day_ticks([d.day for d in listed])] if listed else None)
        if listed:
            self._credit_plot.enableAutoRange(axis="x")
            top = max(d.credit for d in listed)
            self._credit_plot.setYRange(0.0, max(top * 1.1, 1.0), padding=0)
        else:  # the axes it will have: the last two weeks
            now = time.time()
            self._credit_plot.setXRange(now - 14 * _DAY_S, now + _DAY_S, padding=0)
            self._credit_plot.setYRange(0.0, 10.0, padding=0)

    @staticmethod
    def _contributions(contributions: ContributionCounts) -> str:
        refused = sum(contributions.refused.values())
        text = (
            f"{contributions.accepted:,} accepted / {contributions.sent:,} sent"
            f"  ·  {refused:,} refused"
        )
        if contributions.given_up:
            text += f"  ·  {contributions.given_up:,} given up"
        return text

    @staticmethod
    def _device(device: DeviceStatus) -> str:
        parts: list[str] = []
        if device.computes_on:
            parts.append(device.computes_on)
        elif device.device == "cpu":  # an older node names only torch's device
            parts.append("the processor (no GPU found)")
        elif device.device:
            parts.append(device.device)
        if device.memory_used_gb is not None and device.memory_budget_gb is not None:
            parts.append(
                f"using {device.memory_used_gb:.2f} GB (the experts may fill "
                f"{device.memory_budget_gb:.2f} GB)"
            )
        elif device.memory:
            parts.append(device.memory)
        if device.network_rtt_ms is not None:
            parts.append(f"network {device.network_rtt_ms:.0f} ms")
        text = "  ·  ".join(parts) if parts else DASH
        # a GPU left unused: on a line of its own, whole
        return f"{text}\n\N{WARNING SIGN} {_sentence(device.warning)}" if device.warning else text

    @staticmethod
    def _readings(readings: Readings) -> str:
        parts: list[str] = []
        if readings.gpu_temp_c is not None:
            parts.append(f"GPU {readings.gpu_temp_c:.0f} °C")
        if readings.gpu_utilization is not None:
            parts.append(f"GPU busy {readings.gpu_utilization * 100:.0f} %")
        if readings.gpu_power_w is not None:
            parts.append(f"{readings.gpu_power_w:.0f} W")
        if readings.cpu_temp_c is not None:
            parts.append(f"CPU {readings.cpu_temp_c:.0f} °C")
        if readings.idle_seconds is not None:
            parts.append(f"idle {_duration(readings.idle_seconds)}")
        if readings.on_battery is not None:
            parts.append("on battery" if readings.on_battery else "on mains")
        return "  ·  ".join(parts) if parts else DASH

    # -- history --------------------------------------------------------------------------

    def update_history(self, history: History) -> None:
        """Plot the node's /v1/history: per-minute temperatures and per-hour samples."""
        # Sorted by time: the gap detection below compares neighbours.
        rows = sorted(history.temperatures, key=lambda row: row.at)
        self._set_curve(self._gpu_curve, self._column(rows, lambda r: r.gpu_temp_c, 1.0))
        self._set_curve(self._cpu_curve, self._column(rows, lambda r: r.cpu_temp_c, 1.0))
        self._set_curve(self._util_curve, self._column(rows, lambda r: r.gpu_utilization, 100.0))
        # an empty plot must say why: a computer without such a sensor (or not yet a minute)
        self._temperature_plot.setTitle(
            plot_title(TEMPERATURE_TITLE, rows, lambda r: r.gpu_temp_c, lambda r: r.cpu_temp_c)
        )
        self._utilization_plot.setTitle(
            plot_title(UTILIZATION_TITLE, rows, lambda r: r.gpu_utilization)
        )

        # A bar spans its hour, not straddles it; the hour under way only up to now (it
        # was drawn into the future).
        now = time.time()
        spans = [(entry.hour, min(entry.hour + _HOUR_S, now)) for entry in history.hours]
        centres = [(start + end) / 2 for start, end in spans]
        widths = [max(end - start, 60.0) * 0.8 for start, end in spans]
        heights = [float(entry.samples) for entry in history.hours]
        self._bars.setOpts(
            x=np.asarray(centres, dtype=float),
            height=np.asarray(heights),
            width=np.asarray(widths, dtype=float) if widths else _HOUR_S * 0.8,
        )
        tooltip = ""
        if history.hours:
            worked = sum(entry.working_s for entry in history.hours)
            tooltip = f"Worked {_duration(worked)} over the last {len(history.hours)} hours"
        self._work_plot.setToolTip(tooltip)
        # An empty plot gets the axes it will have, not pyqtgraph's 0..1 (a date axis of
        # tenths of a second in 1970 and a 0-0.8 °C scale); data brings autorange back.
        temperatures = any(r.gpu_temp_c is not None or r.cpu_temp_c is not None for r in rows)
        utilization = any(r.gpu_utilization is not None for r in rows)
        empty_ranges = (
            (self._temperature_plot, temperatures, (20.0, 100.0), 3600.0),
            (self._utilization_plot, utilization, (0.0, 100.0), 3600.0),
            (self._work_plot, bool(history.hours), (0.0, 1000.0), 24 * 3600.0),
        )
        for plot, has_data, (low, high), span in empty_ranges:
            if has_data:
                plot.enableAutoRange()
            else:
                plot.setXRange(now - span, now, padding=0)
                plot.setYRange(low, high, padding=0)
        if heights:  # counts start at 0 (hours of 0 tokens autoranged to -400..400)
            self._work_plot.enableAutoRange(axis="x")
            self._work_plot.setYRange(0.0, max(max(heights) * 1.1, 10.0), padding=0)

    @staticmethod
    def _column(
        rows: Iterable[MinuteReading],
        value: Callable[[MinuteReading], float | None],
        scale: float,
    ) -> tuple[list[float], list[float]]:
        """(times, values) of one reading; minutes without it are left out."""
        xs: list[float] = []
        ys: list[float] = []
        for row in rows:
            y = value(row)
            if y is None:
                continue
            xs.append(float(row.at))
            ys.append(y * scale)
        return xs, ys

    @staticmethod
    def _set_curve(curve: Any, data: tuple[list[float], list[float]]) -> None:
        xs, ys = data
        x = np.asarray(xs, dtype=float)
        y = np.asarray(ys, dtype=float)
        # Break the line where readings are missing for longer than a couple of minutes.
        connect = np.ones(len(x), dtype=bool)
        if len(x) > 1:
            connect[:-1] = np.diff(x) <= _GAP_S
        curve.setData(x=x, y=y, connect=connect)

    # -- events ---------------------------------------------------------------------------

    def add_events(self, events: list[Event]) -> None:
        """Add events to the log (duplicates by id are ignored); newest first, 200 kept.

        Only what changed is touched: new lines are inserted, a grown run of
        contributions is re-worded in place, lines past the limit are taken out. (The
        list used to be cleared and refilled on every poll, about once a second while
        working: after ~14 minutes PySide6 died in ``none_dealloc``, the tray with it.)"""
        new = [e for e in events if e.id not in self._seen_ids]
        if not new:
            return
        self._events.extend(new)
        self._events.sort(key=lambda event: event.id, reverse=True)
        del self._events[MAX_EVENTS:]
        # Forget dropped ids: one of those arriving again is older than all kept events,
        # so it sorts past the end and is dropped again.
        self._seen_ids = {event.id for event in self._events}
        self._show_lines(event_rows(self._events))

    def _show_lines(self, rows: list[EventRow]) -> None:
        """Make the list show ``rows`` (newest first), reusing the items of lines it
        shows already (same key)."""
        widget = self._events_list
        wanted = {row.key for row in rows}
        for index in reversed(range(widget.count())):
            if self._row_keys[index] not in wanted:
                widget.takeItem(index)
                del self._row_keys[index]
        for index, row in enumerate(rows):
            if index < len(self._row_keys) and self._row_keys[index] == row.key:
                item = widget.item(index)
            else:
                item = QListWidgetItem()
                widget.insertItem(index, item)
                self._row_keys.insert(index, row.key)
            if item.text() != row.text:
                item.setText(row.text)
                item.setToolTip(row.tooltip)
            if row.error:
                item.setForeground(QColor("#e0403a"))

    # -- for tests ------------------------------------------------------------------------

    def expose_data(self) -> dict[str, Any]:
        """What the plots show: x (unix time) and y per curve, bar centres and heights."""

        def curve(item: Any) -> dict[str, list[float]]:
            x, y = item.getData()
            return {
                "x": [] if x is None else [float(v) for v in x],
                "y": [] if y is None else [float(v) for v in y],
            }

        bar_x, bar_heights = self._bars.getData()
        credit_x, credit_heights = self._credit_bars.getData()
        return {
            "gpu_temp_c": curve(self._gpu_curve),
            "cpu_temp_c": curve(self._cpu_curve),
            "gpu_utilization_pct": curve(self._util_curve),
            "samples_per_hour": {
                "x": [] if bar_x is None else [float(v) for v in bar_x],
                "heights": [] if bar_heights is None else [float(v) for v in bar_heights],
            },
            "credit_per_day": {
                "x": [] if credit_x is None else [float(v) for v in credit_x],
                "heights": [] if credit_heights is None else [float(v) for v in credit_heights],
            },
        }


def _empty_bars(width: float, colour: str) -> Any:
    return pg.BarGraphItem(
        x=np.zeros(0),
        height=np.zeros(0),
        width=width,
        brush=pg.mkBrush(colour),
        pen=pg.mkPen(colour),
    )


def _sentence(text: str) -> str:
    """A status phrase as a sentence: capital first, full stop last."""
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
