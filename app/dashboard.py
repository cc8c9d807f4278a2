"""The dashboard window: what the node is doing now, and what it did over the last hours.

It only displays dicts that the caller fetched from the node's control API
(``/v1/status``, ``/v1/history``, ``/v1/events``); it never talks to the node itself.
Nodes of older versions, or a node that is not running, send fewer keys: every missing
value shows as "—" rather than raising.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

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

# Mid-luminance colours that stay readable on both a dark and a light background.
_GPU_COLOUR: Final = "#f28e2b"  # orange
_CPU_COLOUR: Final = "#4c9be8"  # blue
_UTIL_COLOUR: Final = "#3fb27f"  # green
_BAR_COLOUR: Final = "#59a14f"

_STATES: Final[dict[str, str]] = {
    "working": "Working",
    "paused": "Paused",
    "starting": "Starting",
    "no project": "No project",
    "error": "Error",
    "not running": "Node not running",
}


def _number(value: Any) -> float | None:
    """A finite number, or None for a missing, null or non-numeric value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> str:
    number = _number(value)
    return DASH if number is None else f"{int(number):,}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"


def _local_time(at: Any) -> tuple[str, str] | None:
    """(short, full) local time of a unix timestamp, or None without a usable one."""
    number = _number(at)
    if number is None:
        return None
    try:
        moment = datetime.fromtimestamp(number)
    except (OverflowError, OSError, ValueError):
        return None
    short = "%H:%M:%S" if moment.date() == datetime.now().date() else "%Y-%m-%d %H:%M"
    return moment.strftime(short), moment.strftime("%Y-%m-%d %H:%M:%S")


def describe_event(event: dict[str, Any]) -> str:
    """A sentence a volunteer can read, for one event of the node's event log."""
    kind = event.get("kind")
    if kind == "state":
        reason = str(event.get("reason") or "")
        if event.get("run"):
            return f"Started working: {reason}" if reason else "Started working"
        return f"Paused: {reason}" if reason else "Paused"
    if kind == "experts":
        experts = event.get("experts")
        if isinstance(experts, list) and experts:
            return "Now serving experts " + ", ".join(str(uid) for uid in experts)
        return "No experts assigned"
    if kind == "contribution":
        uid = event.get("uid", "?")
        outcome = event.get("outcome")
        if outcome == "accepted":
            return f"Contribution to expert {uid} accepted"
        if outcome is None:
            return f"Contribution to expert {uid} sent"
        return f"Contribution to expert {uid} refused ({outcome})"
    if kind == "project":
        name = event.get("project_name") or event.get("project")
        return f"Project changed to {name}" if name else "Project left"
    if kind == "preferences":
        return "Preferences changed"
    if kind == "benchmark":
        return "Benchmark of this computer finished"
    if kind == "error":
        return f"Error: {event.get('message') or 'unknown'}"
    return f"{kind} event" if kind else "Event"


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
        self._events: list[tuple[tuple[int, int], dict[str, Any]]] = []
        self._seen_ids: set[int] = set()
        self._arrivals = 0
        self._max_id = -1

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
                ("figureSamples", "Samples"),
                ("figureDevice", "Device"),
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

        self._temperature_plot = self._plot("temperaturePlot", "Temperature", "°C")
        self._utilization_plot = self._plot("utilizationPlot", "GPU utilization", "%")
        self._utilization_plot.setXLink(self._temperature_plot)
        self._utilization_plot.setYRange(0, 100)
        self._work_plot = self._plot("workPlot", "Samples per hour", "samples")
        legend = self._temperature_plot.getPlotItem().addLegend()
        self._legends = [legend]
        self._gpu_curve = self._temperature_plot.plot(
            name="GPU", pen=pg.mkPen(_GPU_COLOUR, width=2)
        )
        self._cpu_curve = self._temperature_plot.plot(
            name="CPU", pen=pg.mkPen(_CPU_COLOUR, width=2)
        )
        self._util_curve = self._utilization_plot.plot(pen=pg.mkPen(_UTIL_COLOUR, width=2))
        self._bars = pg.BarGraphItem(
            x=np.zeros(0),
            height=np.zeros(0),
            width=_HOUR_S * 0.8,
            brush=pg.mkBrush(_BAR_COLOUR),
            pen=pg.mkPen(_BAR_COLOUR),
        )
        self._work_plot.addItem(self._bars)

        self._events_list = QListWidget()
        self._events_list.setObjectName("eventsList")
        self._events_list.setWordWrap(True)

        plots = QSplitter(Qt.Orientation.Vertical)
        for widget in (self._temperature_plot, self._utilization_plot, self._work_plot):
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

    # -- plots and colours ----------------------------------------------------------------

    def _plot(self, name: str, title: str, unit: str) -> Any:
        plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem(orientation="bottom")})
        plot.setObjectName(name)
        plot.setTitle(title)
        plot.setLabel("left", unit)
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setMinimumHeight(120)
        plot.setMenuEnabled(False)
        return plot

    def _apply_palette(self) -> None:
        """Use the window's own colours so the plots follow a light or dark theme."""
        palette = self.palette()
        background = palette.color(QPalette.ColorRole.Base)
        foreground = palette.color(QPalette.ColorRole.WindowText)
        for plot in (self._temperature_plot, self._utilization_plot, self._work_plot):
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

    def update_status(self, status: dict[str, Any]) -> None:
        """Show the node's /v1/status; any key may be missing."""
        status = _dict(status)
        state = status.get("state")
        text = _STATES.get(state, str(state)) if isinstance(state, str) and state else DASH
        reason = status.get("reason")
        if isinstance(reason, str) and reason and reason != state:
            text = f"{text}: {reason}"
        project = status.get("project_name") or status.get("project")
        if project:
            text = f"{text}  ·  project {project}"
        uptime = _number(status.get("uptime_s"))
        if uptime is not None:
            text = f"{text}  ·  up {_duration(uptime)}"
        self._state.setText(text)
        self._state.setToolTip(str(status.get("reason_code") or ""))

        self._figures["figureContributions"].setText(
            self._contributions(status.get("contributions"))
        )
        experts = status.get("experts")
        experts_label = self._figures["figureExperts"]
        if isinstance(experts, dict) and experts:
            experts_label.setText(", ".join(str(uid) for uid in sorted(experts)))
            experts_label.setToolTip(
                "\n".join(f"{uid}: version {version}" for uid, version in sorted(experts.items()))
            )
        else:
            experts_label.setText("none" if isinstance(experts, dict) else DASH)
            experts_label.setToolTip("")
        self._figures["figurePeers"].setText(_count(status.get("peers")))
        self._figures["figureSamples"].setText(_count(status.get("samples_done")))
        self._figures["figureDevice"].setText(self._device(status.get("device")))
        self._figures["figureReadings"].setText(self._readings(status.get("readings")))

    @staticmethod
    def _contributions(value: Any) -> str:
        contributions = _dict(value)
        if not contributions:
            return DASH
        accepted = _count(contributions.get("accepted"))
        sent = _count(contributions.get("sent"))
        refused_codes = _dict(contributions.get("refused"))
        refused = sum(int(n) for n in refused_codes.values() if _number(n) is not None)
        text = f"{accepted} accepted / {sent} sent  ·  {refused:,} refused"
        given_up = _number(contributions.get("given_up"))
        if given_up:
            text += f"  ·  {int(given_up):,} given up"
        return text

    @staticmethod
    def _device(value: Any) -> str:
        device = _dict(value)
        parts: list[str] = []
        if device.get("device"):
            parts.append(str(device["device"]))
        if device.get("memory"):
            parts.append(str(device["memory"]))
        rtt = _number(device.get("network_rtt_ms"))
        if rtt is not None:
            parts.append(f"network {rtt:.0f} ms")
        return "  ·  ".join(parts) if parts else DASH

    @staticmethod
    def _readings(value: Any) -> str:
        readings = _dict(value)
        parts: list[str] = []
        gpu_temp = _number(readings.get("gpu_temp_c"))
        if gpu_temp is not None:
            parts.append(f"GPU {gpu_temp:.0f} °C")
        util = _number(readings.get("gpu_utilization"))
        if util is not None:
            parts.append(f"GPU busy {util * 100:.0f} %")
        power = _number(readings.get("gpu_power_w"))
        if power is not None:
            parts.append(f"{power:.0f} W")
        cpu_temp = _number(readings.get("cpu_temp_c"))
        if cpu_temp is not None:
            parts.append(f"CPU {cpu_temp:.0f} °C")
        idle = _number(readings.get("idle_seconds"))
        if idle is not None:
            parts.append(f"idle {_duration(idle)}")
        on_battery = readings.get("on_battery")
        if isinstance(on_battery, bool):
            parts.append("on battery" if on_battery else "on mains")
        return "  ·  ".join(parts) if parts else DASH

    # -- history --------------------------------------------------------------------------

    def update_history(self, history: dict[str, Any]) -> None:
        """Plot the node's /v1/history: per-minute temperatures and per-hour samples."""
        history = _dict(history)
        raw = history.get("temperatures")
        rows = (
            [row for row in raw if isinstance(row, list | tuple) and row]
            if isinstance(raw, list)
            else []
        )
        # Sorted by time: the gap detection below compares neighbours.
        rows.sort(key=lambda row: _number(row[0]) or 0.0)
        self._set_curve(self._gpu_curve, self._column(rows, 1, 1.0))
        self._set_curve(self._cpu_curve, self._column(rows, 2, 1.0))
        self._set_curve(self._util_curve, self._column(rows, 3, 100.0))

        hours = history.get("hours")
        centres: list[float] = []
        heights: list[float] = []
        for entry in hours if isinstance(hours, list) else []:
            entry = _dict(entry)
            hour = _number(entry.get("hour"))
            samples = _number(entry.get("samples"))
            if hour is None or samples is None:
                continue
            centres.append(hour + _HOUR_S / 2)  # a bar spans its hour, not straddles it
            heights.append(samples)
        self._bars.setOpts(x=np.asarray(centres, dtype=float), height=np.asarray(heights))
        tooltip = ""
        if hours and isinstance(hours, list):
            worked = sum(_number(_dict(e).get("working_s")) or 0.0 for e in hours)
            tooltip = f"Worked {_duration(worked)} over the last {len(hours)} hours"
        self._work_plot.setToolTip(tooltip)

    @staticmethod
    def _column(
        rows: Iterable[list[Any] | tuple[Any, ...]], index: int, scale: float
    ) -> tuple[list[float], list[float]]:
        """(times, values) of one column; rows where either is missing are left out."""
        xs: list[float] = []
        ys: list[float] = []
        for row in rows:
            if len(row) <= index:
                continue
            x, y = _number(row[0]), _number(row[index])
            if x is None or y is None:
                continue
            xs.append(x)
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

    def add_events(self, events: list[dict[str, Any]]) -> None:
        """Add events to the log (duplicates by id are ignored); newest first, 200 kept."""
        for event in events:
            if not isinstance(event, dict):
                continue
            event_id = event.get("id")
            self._arrivals += 1
            if isinstance(event_id, int) and not isinstance(event_id, bool):
                if event_id in self._seen_ids:
                    continue
                self._seen_ids.add(event_id)
                self._max_id = max(self._max_id, event_id)
                key = (event_id, self._arrivals)
            else:
                # Without an id, an event counts as newer than all those received before it.
                key = (self._max_id, self._arrivals)
            self._events.append((key, event))
        self._events.sort(key=lambda pair: pair[0], reverse=True)
        del self._events[MAX_EVENTS:]
        # Forget dropped ids: one of those arriving again is older than all kept events,
        # so it sorts past the end and is dropped again.
        self._seen_ids = {key[0] for key, e in self._events if key[0] == e.get("id")}

        self._events_list.clear()
        for _key, event in self._events:
            sentence = describe_event(event)
            when = _local_time(event.get("at"))
            item = QListWidgetItem(f"{when[0]}  {sentence}" if when else sentence)
            if when:
                item.setToolTip(when[1])
            if event.get("kind") == "error":
                item.setForeground(QColor("#e0403a"))
            self._events_list.addItem(item)

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
        return {
            "gpu_temp_c": curve(self._gpu_curve),
            "cpu_temp_c": curve(self._cpu_curve),
            "gpu_utilization_pct": curve(self._util_curve),
            "samples_per_hour": {
                "x": [] if bar_x is None else [float(v) for v in bar_x],
                "heights": [] if bar_heights is None else [float(v) for v in bar_heights],
            },
        }
