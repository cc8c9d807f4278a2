"""The tray against a real node process (fake probes read from a file): the menu's
actions, found by object name, pause, resume and snooze the node and the status line
follows within 2 s; the limits dialog shows the node's validation error; a node killed
with SIGKILL shows as "not running", is restarted, and the tray recovers; Quit stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from PySide6.QtWidgets import QApplication, QDoubleSpinBox, QLabel, QPushButton

from app.link import NodeLink
from app.supervisor import NodeSupervisor, node_command
from app.tray import (
    MENU_CHARACTERS,
    Tray,
    menu_text,
    remaining,
    seconds_until_tomorrow,
    settings_at,
    status_line,
)
from core.control.models import Event, NetworkStatus, Status
from tests.child_processes import stop_processes
from tests.gui.fakes import NoAutostart
from tests.screenshots import HISTORY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.owner_process", str(tmp_path / "owner")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, line
    yield line[0], line[1]
    stop_processes([proc])


def state(tray: Tray) -> str | None:
    """The node's state as the tray shows it; None while the node does not answer."""
    return None if tray.status is None else tray.status.state


def reason_code(tray: Tray) -> str | None:
    return None if tray.status is None else tray.status.reason_code


@pytest.mark.slow
def test_the_tray_drives_a_real_node(qtbot, tmp_path, monkeypatch, owner):
    address, project = owner
    monkeypatch.setenv("MOEHOME_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 55}))
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data", interval=0.2)
    node_args = ["--project", project, "-b", address, "--fake-probes", str(machine)]
    supervisor = NodeSupervisor(
        node_command([*node_args, "--no-benchmark", "-l", "/ip4/127.0.0.1/tcp/0"]),
        node_is_running=lambda: False,
    )
    tray = Tray(app, link, supervisor, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    supervisor.start()
    link.start()
    try:
        qtbot.waitUntil(lambda: state(tray) == "working", timeout=60_000)
        assert tray.find_action("statusAction").text().startswith("Working: serving")
        assert tray.find_action("pauseAction").isVisible()
        assert not tray.find_action("resumeAction").isVisible()

        tray.find_action("pauseAction").trigger()
        qtbot.waitUntil(lambda: tray.status_action.text() == "Paused by you", timeout=2000)
        assert tray.find_action("resumeAction").isVisible()
        tray.find_action("resumeAction").trigger()
        qtbot.waitUntil(lambda: state(tray) == "working", timeout=2000)

        tray.find_action("snooze3hAction").trigger()
        qtbot.waitUntil(lambda: reason_code(tray) == "snoozed", timeout=2000)
        status = tray.find_action("statusAction")
        assert status.text() in ("Snoozed — 3 h 00 min left", "Snoozed — 2 h 59 min left")
        tray.find_action("resumeAction").trigger()
        qtbot.waitUntil(lambda: state(tray) == "working", timeout=2000)

        # limits: the node's validation message shows next to the field
        tray.find_action("limitsAction").trigger()
        dialog = tray.limits
        assert dialog is not None
        spin = dialog.findChild(QDoubleSpinBox, "field_resume_below_c")
        save = dialog.findChild(QPushButton, "saveButton")
        assert spin is not None
        assert save is not None
        spin.setValue(90)
        save.click()
        error = dialog.findChild(QLabel, "error_resume_below_c")
        assert error is not None
        assert "must be below “Pause GPU above”" in error.text()
        assert dialog.isVisible()
        dialog.close()

        # the GPU gets hot: paused, and the volunteer is told why
        machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 90}))
        qtbot.waitUntil(lambda: reason_code(tray) == "gpu_hot", timeout=2000)
        qtbot.waitUntil(lambda: any("too hot" in m for _, m in tray.notifications), timeout=5000)
        machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 60}))
        qtbot.waitUntil(lambda: state(tray) == "working", timeout=2000)

        # the node dies: "not running" at once, restarted, and the tray follows it again
        first_pid = supervisor.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: tray.status is None, timeout=3000)
        assert tray.status_action.text() == "Node not running"
        assert not tray.find_action("pauseAction").isVisible()
        qtbot.waitUntil(lambda: state(tray) == "working", timeout=60_000)
        assert supervisor.pid not in (None, first_pid)
        assert any("restart" in title for title, _ in tray.notifications)
    finally:
        pid = supervisor.pid
        tray.quit()  # asks the node to stop, waits for it
    assert supervisor.pid is None
    if pid is not None:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (
            Status(state="working", reason="", experts={"a": 0, "b": 0}),
            "Working: serving 2 experts",
        ),
        (Status(state="working", reason="", experts={"a": 0}), "Working: serving 1 expert"),
        (
            Status(state="paused", reason="the GPU is too hot: 90 °C"),
            "Paused: the GPU is too hot: 90 °C",
        ),
        (None, "Node not running"),
        (Status(state="no project", reason="join a project"), "No project: join a project"),
    ],
)
def test_status_line(status, line):
    assert status_line(status) == line


def test_remaining_and_tomorrow():
    import datetime as dt

    assert remaining(1000 + 3 * 3600, 1000) == "3 h 00 min"
    assert remaining(1000 + 14 * 60 + 10, 1000) == "14 min"
    assert remaining(0, 1000) == "0 min"
    now = dt.datetime(2026, 11, 21, 22, 30)
    assert seconds_until_tomorrow(now) == 8.5 * 3600


@pytest.mark.slow
def test_sigterm_to_the_tray_stops_its_node(tmp_path):
    """Logging out sends SIGTERM: the tray quits like Quit and its node goes with it."""
    from core.control import ControlError, find_node

    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(tmp_path / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
        "QT_QPA_PLATFORM": "offscreen",
    }
    tray = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.main",
            "--no-wizard",
            "--node-args=--no-benchmark -l /ip4/127.0.0.1/tcp/0",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        node_pid = None
        while node_pid is None and time.monotonic() < deadline:
            try:
                client = find_node(tmp_path / "data")
                node_pid = client.status().pid
                client.close()
            except ControlError:
                time.sleep(0.2)
        assert node_pid is not None, "the tray did not start a node"
        tray.send_signal(signal.SIGTERM)
        assert tray.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(node_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the node outlived the tray")
    finally:
        stop_processes([tray])


def test_the_tray_shows_what_the_node_says(qtbot, tmp_path):
    """Statuses, a node that stops answering and events, without a node: the menu's texts,
    the tooltip, which actions show, and the notifications."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")  # never started: the test feeds the tray itself
    tray = Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    assert tray.status is None
    assert tray.status_action.text() == "Node not running"
    assert tray.icon.toolTip() == "moehome — Node not running"

    with qtbot.waitSignal(tray.shown) as shown:
        tray._on_status(Status(state="working", reason="", experts={"a": 0, "b": 1}, pid=42))
    assert isinstance(shown.args[0], Status)
    assert tray.status_action.text() == "Working: serving 2 experts"
    assert tray.icon.toolTip() == "moehome — Working: serving 2 experts"
    assert tray.node_pid == 42
    assert tray.pause_action.isVisible()
    assert not tray.resume_action.isVisible()
    assert not tray.network_action.isVisible()  # the node said nothing of its network

    behind_nat = NetworkStatus(
        reach="relayed",
        reachability="reachable through a relay: your router blocks direct connections",
        advice="nothing is needed; to make connections direct, forward TCP port 4001",
    )
    tray._on_status(Status(state="working", reason="", network=behind_nat))
    assert tray.network_action.isVisible()
    assert tray.network_action.text() == "Network: reachable through a relay"
    assert tray.network_action.toolTip().startswith("nothing is needed")

    until = time.time() + 3 * 3600
    tray._on_status(
        Status(state="paused", reason="snoozed", reason_code="snoozed", snoozed_until=until)
    )
    # one line says it all (there were two: "Paused: snoozed" and the time left)
    assert tray.status_action.text() in (
        "Snoozed — 3 h 00 min left",
        "Snoozed — 2 h 59 min left",
    )
    assert tray.resume_action.isVisible()
    assert not tray.pause_action.isVisible()

    with qtbot.waitSignal(tray.shown) as shown:
        tray._on_not_running("the node does not answer (connection refused)")
    assert shown.args == [None]
    assert tray.status is None
    assert tray.not_running_why == "the node does not answer (connection refused)"
    assert tray.status_action.text() == "Node not running"
    assert not tray.pause_action.isVisible()
    assert not tray.resume_action.isVisible()
    assert not tray.network_action.isVisible()
    assert not tray.snooze_menu.isEnabled()

    events = TypeAdapter(list[Event]).validate_python(
        [
            {"id": 1, "kind": "state", "run": False, "reason": "too hot", "reason_code": "gpu_hot"},
            {"id": 2, "kind": "error", "message": "the manifest is not signed"},
            {"id": 3, "kind": "contribution", "uid": "ffn.0.1", "outcome": "accepted"},
        ]
    )
    tray._on_events(events)
    told = (
        "moehome cannot serve its project",
        "the manifest is not signed. It keeps trying; Project\N{HORIZONTAL ELLIPSIS} in the "
        "menu changes or leaves the project.",
    )
    assert tray.notifications == [("moehome paused", "Paused: too hot"), told]
    # the same problem again (a retried join) is not told twice
    tray._on_events(events[1:2])
    assert tray.notifications == [("moehome paused", "Paused: too hot"), told]


def test_a_pause_without_a_project_can_be_undone_from_the_menu(qtbot, tmp_path):
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")
    tray = Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    paused = Status(state="no project", reason="join a project", reason_code="paused", pid=7)
    with qtbot.waitSignal(tray.shown):
        tray._on_status(paused)
    assert tray.resume_action.isVisible()
    assert not tray.pause_action.isVisible()
    with qtbot.waitSignal(tray.shown):
        tray._on_status(paused.model_copy(update={"reason_code": ""}))
    assert tray.pause_action.isVisible()
    assert not tray.resume_action.isVisible()


def test_show_log_opens_the_nodes_log_and_crashes_are_told_once(qtbot, tmp_path):
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")
    tray = Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    opened: list[Path] = []

    def open_file(path: Path) -> bool:  # what the desktop would open
        opened.append(path)
        return True

    tray.open_file = open_file  # type: ignore[method-assign]
    tray.find_action("showLogAction").trigger()
    assert opened == []
    assert "no log yet" in tray.notifications[-1][1]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "node.log").write_text("Traceback ...\n")
    tray.find_action("showLogAction").trigger()
    assert opened == [tmp_path / "data" / "node.log"]

    told = len(tray.notifications)
    tray._on_crash(1, 1.0)  # the first of a series: told, with what to do
    assert "Show log" in tray.notifications[-1][1]
    for delay in (2.0, 4.0, 8.0):  # the same node failing again: not told again
        tray._on_crash(1, delay)
    assert len(tray.notifications) == told + 1


def test_an_invite_before_the_node_answers_waits_for_it(qtbot, tmp_path):
    """`moehome-tray <invite>` starts the node and gets the invite at once: it is looked
    up when the node first answers, not refused as "no node is running"."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")
    tray = Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    invite = f"moehome://join/{'0f' * 16}"
    tray.handle_message(invite)
    assert tray.project_dialog is None
    with qtbot.waitSignal(tray.shown):
        tray._on_status(Status(state="no project", reason="join a project", pid=3))
    assert tray.project_dialog is not None
    assert tray.project_dialog.picker.invite_edit.text() == invite
    tray.project_dialog.close()


def test_the_dashboard_shows_the_history_as_it_opens(qtbot, tmp_path, monkeypatch):
    """Its plots were empty for a minute after it opened: the history was asked for
    before the window showed, and a hidden dashboard's history is not asked for."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    link = NodeLink(tmp_path / "data")
    tray = Tray(app, link, None, settings_at(tmp_path / "config"), NoAutostart(), ["x"])
    monkeypatch.setattr(link, "call", lambda action: HISTORY)
    tray._on_status(Status(state="working", reason="", pid=3))
    tray.open_dashboard()
    assert tray.dashboard is not None
    qtbot.addWidget(tray.dashboard)
    shown = tray.dashboard.expose_data()
    assert shown["samples_per_hour"]["heights"] == [h.samples for h in HISTORY.hours]
    assert shown["gpu_temp_c"]["y"]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("Working: serving 2 experts", "Working: serving 2 experts"),
        (
            "Waiting: the experts served here learn once other volunteers serve them too, "
            "which takes a while",
            "Waiting: the experts served here learn once other volunteers serve them"
            "\N{HORIZONTAL ELLIPSIS}",
        ),
    ],
)
def test_a_long_status_is_cut_at_a_word_in_the_menu(line, shown):
    assert menu_text(line) == shown
    assert len(menu_text(line)) <= MENU_CHARACTERS
