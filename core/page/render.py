"""A project page from its checked data (core/page/collect.py): one self-contained HTML
file (styles inline, the loss chart as inline SVG, no script) and ``page.json`` beside
it, so that the folder can be put on any static web host as it is.

Every string that came from the swarm goes through Jinja2's autoescaping; every figure
the page shows carries ``data-figure`` (its name), so that a test can read it back."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from jinja2 import Environment, PackageLoader, select_autoescape

from core.files import replace_file

#: the chart's size in SVG units (it scales with the page)
CHART_W: Final = 720
CHART_H: Final = 260
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 16, 12, 36
#: a colour per trainer (the first six; more repeat)
_COLOURS: Final = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


@dataclass(frozen=True)
class Tick:
    at: float  # SVG coordinate
    label: str


@dataclass(frozen=True)
class Chart:
    lines: list[dict[str, str]]  # {trainer, colour, points: "x,y x,y ..."}
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    x_label: str


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values inside [low, high]: 1, 2 or 5 times a power of ten
    apart. Pure."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else []
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = min((m * power for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def loss_chart(curves: Sequence[dict[str, Any]]) -> Chart | None:
    """The loss over the hours since the first evaluation, one line per trainer; None
    without a point. Pure."""
    points = [p for c in curves for p in c["points"]]
    if not points:
        return None
    t0 = min(p[0] for p in points)
    hours = [(p[0] - t0) / 3600 for p in points]
    span = max(hours)
    unit, scale = ("minutes", 60.0) if span < 2 else ("hours", 1.0)
    x_max = max(span * scale, 1e-9)
    losses = [p[4] for p in points]
    y_low, y_high = min(losses), max(losses)
    if y_high - y_low < 1e-6:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    margin = (y_high - y_low) * 0.05
    y_low, y_high = y_low - margin, y_high + margin
    inner_w = CHART_W - _PAD_L - _PAD_R
    inner_h = CHART_H - _PAD_T - _PAD_B

    def x_of(value: float) -> float:
        return float(_PAD_L + inner_w * value / x_max)

    def y_of(loss: float) -> float:
        return float(_PAD_T + inner_h * (y_high - loss) / (y_high - y_low))

    lines = []
    for i, curve in enumerate(curves):
        coords = " ".join(
            f"{x_of((p[0] - t0) / 3600 * scale):.1f},{y_of(p[4]):.1f}" for p in curve["points"]
        )
        lines.append(
            {"trainer": curve["trainer"], "colour": _COLOURS[i % len(_COLOURS)], "points": coords}
        )
    return Chart(
        lines=lines,
        x_ticks=[Tick(x_of(v), f"{v:g}") for v in nice_ticks(0.0, x_max)],
        y_ticks=[Tick(y_of(v), f"{v:g}") for v in nice_ticks(y_low, y_high)],
        x_label=f"{unit} since the first evaluation",
    )


def short(peer: str) -> str:
    """A peer id as the page shows it (the whole one is in its title)."""
    return f"…{peer[-8:]}" if len(peer) > 10 else peer


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("core.page", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["short"] = short
    env.filters["when"] = when
    env.filters["grouped"] = lambda x, digits=0: f"{x:,.{digits}f}"
    return env


def render_html(data: dict[str, Any]) -> str:
    """The page's HTML for ``data`` (collect_page's result). Pure but for Jinja2."""
    status = data["status"]
    versions = [v for agg in status["aggregators"] for v in agg.get("versions", {}).values()]
    latest = [c["points"][-1][4] for c in data["loss"] if c["points"]]
    return (
        _environment()
        .get_template("index.html")
        .render(
            data=data,
            project=data["project"],
            status=status,
            chart=loss_chart(data["loss"]),
            chart_w=CHART_W,
            chart_h=CHART_H,
            pad=(_PAD_L, _PAD_R, _PAD_T, _PAD_B),
            latest_loss=min(latest) if latest else None,
            accepted=sum(agg.get("accepted", 0) for agg in status["aggregators"]),
            versions=(min(versions), max(versions)) if versions else None,
        )
    )


def write_page(data: dict[str, Any], folder: Path) -> Path:
    """``index.html`` and ``page.json`` in ``folder`` (each replaced whole: a web server
    serving the folder never hands out half a file); returns the page's path."""
    folder.mkdir(parents=True, exist_ok=True)
    replace_file(folder / "page.json", json.dumps(data, indent=1, sort_keys=True))
    page = folder / "index.html"
    replace_file(page, render_html(data))
    return page
