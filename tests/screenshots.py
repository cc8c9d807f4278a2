"""Screenshots of the tray's menu and windows, for a person to look at: run under a real
X server (Xvfb) by tests/gui/test_screenshots.py, in the light and the dark palette.

    python -m tests.screenshots <out dir>
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QPoint, QSettings
from PySide6.QtGui import QColor, QPalette
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QPushButton, QWidget

from app.dashboard import DashboardWindow
from app.limits import LimitsDialog
from app.link import NodeLink
from app.tray import Tray
from core.control.models import (
    ContributionCounts,
    ContributionEvent,
    DeviceStatus,
    Event,
    ExpertsEvent,
    History,
    HourOfWork,
    MinuteReading,
    Readings,
    StateEvent,
    Status,
)
from core.control.preferences import Preferences, Window

NOW = time.time()
STATUS = Status(
    state="working",
    reason="working",
    reason_code="",
    project="0f" * 16,
    project_name="tiny-lm",
    experts={"ffn0.0.1": 3, "ffn0.1.0": 3},
    contributions=ContributionCounts(sent=41, accepted=39, given_up=0, refused={"stale": 2}),
    samples_done=182_340,
    device=DeviceStatus(device="cuda:0", memory="NVIDIA RTX 4070 (11.2 GB free)"),
    readings=Readings(gpu_temp_c=67.0, gpu_utilization=0.83, cpu_temp_c=54.0),
    peers=23,
    uptime_s=5400,
)
HISTORY = History(
    hours=[
        HourOfWork(hour=int(NOW) - (12 - h) * 3600, working_s=3000.0, samples=9000 + 700 * h)
        for h in range(12)
    ],
    temperatures=[
        MinuteReading(
            at=int(NOW) - (180 - m) * 60,
            gpu_temp_c=55 + 15 * (m % 40) / 40,
            cpu_temp_c=45 + 8 * (m % 25) / 25,
            gpu_utilization=0.6 + 0.3 * (m % 7) / 7,
        )
        for m in range(180)
    ],
)
EVENTS: list[Event] = [
    ExpertsEvent(id=1, at=NOW - 3000, experts=["ffn0.0.1", "ffn0.1.0"]),
    StateEvent(id=2, at=NOW - 2000, run=False, reason="you are using the computer"),
    StateEvent(id=3, at=NOW - 1500, run=True, reason="working"),
    ContributionEvent(id=4, at=NOW - 600, uid="ffn0.0.1", outcome="accepted"),
]


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, "#202124"),
        (QPalette.ColorRole.WindowText, "#e8eaed"),
        (QPalette.ColorRole.Base, "#2b2c2f"),
        (QPalette.ColorRole.Text, "#e8eaed"),
        (QPalette.ColorRole.Button, "#303134"),
        (QPalette.ColorRole.ButtonText, "#e8eaed"),
        (QPalette.ColorRole.Highlight, "#8ab4f8"),
    ):
        palette.setColor(role, QColor(colour))
    return palette


def shoot(widget: QWidget, path: Path) -> None:
    widget.show()
    if not QTest.qWaitForWindowExposed(widget, 5000):  # the X server mapped it
        raise RuntimeError(f"{widget.objectName() or widget} was never shown")
    QApplication.processEvents()
    if not widget.grab().save(str(path)):
        raise RuntimeError(f"could not save {path}")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    light = app.palette()
    for theme, palette in (("light", light), ("dark", dark_palette())):
        app.setPalette(palette)
        dashboard = DashboardWindow()
        dashboard.setPalette(palette)
        dashboard.resize(1000, 720)
        dashboard.update_status(STATUS)
        dashboard.update_history(HISTORY)
        dashboard.add_events(EVENTS)
        shoot(dashboard, out / f"dashboard-{theme}.png")
        dashboard.close()

        link = NodeLink(out / "no-node")
        tray = Tray(app, link, None, QSettings(str(out / "tray.ini"), QSettings.Format.IniFormat))
        tray._show(STATUS)
        tray.menu.popup(QPoint(40, 40))
        shoot(tray.menu, out / f"menu-{theme}.png")
        tray.menu.hide()

        limits = LimitsDialog(
            Preferences(  # the defaults, and a volunteer's own choices for every widget
                duty_cycle=0.8,
                schedule=[Window(days=["mon", "tue", "wed"], start="18:00", end="08:00")],
                exclusive_apps=["steam.exe", "obs"],
                memory_cap_gb=6.0,
            ),
            lambda changes: ["resume_below_c: resume_below_c (90.0) must be below pause_above_c"],
        )
        limits.resize(820, 900)
        limits.show()
        save = limits.findChild(QPushButton, "saveButton")
        assert save is not None
        save.click()
        shoot(limits, out / f"limits-{theme}.png")
        limits.close()
    sys.stdout.write("\n".join(sorted(p.name for p in out.glob("*.png"))) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
