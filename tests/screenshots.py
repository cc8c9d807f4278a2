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

from app.background import run_now
from app.dashboard import DashboardWindow
from app.limits import LimitsDialog
from app.link import NodeLink
from app.tray import ProjectDialog, Tray
from app.wizard import FirstStartWizard, WizardActions
from core.control.invite import Invite
from core.control.models import (
    ContributionCounts,
    ContributionEvent,
    Credit,
    CreditDay,
    DeviceStatus,
    Event,
    ExpertsEvent,
    History,
    HourOfWork,
    Lifetime,
    MinuteReading,
    ProjectSummary,
    Readings,
    StateEvent,
    Status,
)
from core.control.preferences import Preferences, Window

NOW = time.time()
PEER = "/ip4/198.18.0.7/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
FOUND = ProjectSummary(
    project="0f" * 16,
    name="tiny-lm",
    description="A small byte-level language model, trained by volunteers.",
    owner="1a2b-3c4d-5e6f-7a8b",
    experts=32,
    mixture_layers=2,
    expert_kind="ffn",
    expert_parameters=33_088,
)
OTHER_PROJECT = ProjectSummary(project="1e" * 16, name="demo-charlm", description="the demo")
INVITE = Invite(project="0f" * 16, peers=(PEER,)).link()
CPU_STATUS = Status(
    state="working",
    reason="working",
    project="0f" * 16,
    project_name="tiny-lm",
    experts={"ffn0.0.1": 3},
    contributions=ContributionCounts(sent=12, accepted=12),
    samples_done=20_480,
    device=DeviceStatus(
        device="cpu",
        computes_on="CPU",
        memory="CPU (6.1 GB of RAM free); experts may fill 3.05 GB (50% of free)",
        memory_budget_gb=3.05,
        memory_used_gb=0.49,
    ),
    readings=Readings(idle_seconds=610, on_battery=False),
    peers=5,
    uptime_s=900,
    lifetime=Lifetime(working_s=900, samples=20_480, contributions_accepted=12, since=NOW - 900),
)
STATUS = Status(
    state="working",
    reason="working",
    reason_code="",
    project="0f" * 16,
    project_name="tiny-lm",
    experts={"ffn0.0.1": 3, "ffn0.1.0": 3},
    contributions=ContributionCounts(sent=41, accepted=39, given_up=0, refused={"stale": 2}),
    samples_done=182_340,
    device=DeviceStatus(
        device="cuda:0",
        computes_on="NVIDIA GeForce RTX 4070 (CUDA)",
        memory="NVIDIA RTX 4070 (11.2 GB free)",
    ),
    readings=Readings(gpu_temp_c=67.0, gpu_utilization=0.83, cpu_temp_c=54.0),
    peers=23,
    uptime_s=5400,
    credit=Credit(
        total=1_930.0,
        today=212.0,
        aggregators=2,
        aggregators_listed=2,
        checked_at=NOW - 120,
        proof="~/.local/share/moehome/credit/0f0f.proof",
        rank=4,
        ranked=23,
        days=[
            CreditDay(
                day=int(NOW // 86_400) - 9 + d,
                credit=[90, 0, 140, 260, 180, 0, 310, 250, 288, 212][d],
            )
            for d in range(10)
            if d not in (1, 5)  # days off
        ],
    ),
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
        limits.resize(820, 980)
        limits.show()
        save = limits.findChild(QPushButton, "saveButton")
        assert save is not None
        save.click()
        shoot(limits, out / f"limits-{theme}.png")
        limits.close()

        # choosing a project: the invite pasted, the node's summary shown before joining
        wizard = FirstStartWizard(
            WizardActions(
                list_projects=lambda: [OTHER_PROJECT],
                find=lambda invite: FOUND,
                join=lambda invite: [],
                leave=list,
                start_benchmark=lambda: None,
                apply_limits=lambda changes: [],
                run=run_now,
            )
        )
        wizard.resize(720, 620)
        wizard.show()
        wizard.next()
        wizard.project_page.picker.set_invite_text(INVITE)
        shoot(wizard, out / f"wizard-project-{theme}.png")
        wizard.close()

        dialog = ProjectDialog(link, STATUS, run=run_now)
        dialog.picker._find = lambda invite: FOUND  # no node here: what it would answer
        dialog.picker._list_projects = lambda: [OTHER_PROJECT, FOUND]
        dialog.picker.refresh()
        dialog.picker.set_invite_text("moehome://join/" + "ab" * 15 + "?peer=%2Fip4")
        shoot(dialog, out / f"project-{theme}.png")
        dialog.close()

        # a computer without a GPU or sensors, and a fresh history
        cpu = DashboardWindow()
        cpu.setPalette(palette)
        cpu.resize(1000, 720)
        cpu.update_status(CPU_STATUS)
        cpu.update_history(
            History(
                hours=[HourOfWork(hour=int(NOW // 3600 * 3600), working_s=900, samples=20_480)],
                temperatures=[MinuteReading(at=int(NOW // 60 * 60) - 60 * m) for m in range(15)],
            )
        )
        shoot(cpu, out / f"dashboard-cpu-{theme}.png")
        cpu.close()
    sys.stdout.write("\n".join(sorted(p.name for p in out.glob("*.png"))) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
