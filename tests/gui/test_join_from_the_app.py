"""A volunteer joins from the app alone: a fresh tray (new folders, its real node as a child
process), a running `moehome demo`, the demo's invite pasted into the wizard. The node
finds the project, joins, serves, and its contributions are accepted. Then the tray is
killed (no chance to say goodbye) and its node ends within seconds; a second tray hands
its invite to the first and exits."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QApplication

from app.link import NodeLink
from app.supervisor import NodeSupervisor, node_command
from app.tray import Tray, settings_at
from core.control.invite import parse_invite
from tests.child_processes import gone, node_pid, stop_processes
from tests.gui.fakes import NoAutostart
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "/ip4/127.0.0.1/tcp/0"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def start_demo(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    """`moehome demo` with one volunteer of its own and a trainer that runs until stopped;
    its invite, read from what it prints."""
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "core.cli",
            "demo",
            "--workdir",
            str(workdir),
            "--volunteers",
            "1",
            "--steps",
            "100000",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "80"},  # a narrow terminal must not break the invite
    )
    assert demo.stderr is not None
    stderr = demo.stderr
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:  # all along: a full pipe would stop the demo
        for line in stderr:
            lines.put(line)
        lines.put("")

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 180  # the swarm's processes start torch on 2 cores
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        assert line, "the demo ended before it printed an invite"
        if line.startswith("invite: "):
            return demo, line.removeprefix("invite: ").strip()
    pytest.fail("no invite from the demo within 180 s")


def node_env(tmp_path: Path) -> dict[str, str]:
    return {
        "MOEHOME_DATA_DIR": str(tmp_path / "volunteer" / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "volunteer" / "config"),
    }


def test_a_fresh_tray_joins_the_demo_from_its_invite(qtbot: Any, tmp_path, monkeypatch):
    demo, invite = start_demo(tmp_path / "demo")
    try:
        assert parse_invite(invite).peers  # the demo's bootstrap peer is in it
        for name, value in node_env(tmp_path).items():
            monkeypatch.setenv(name, value)  # the node the tray starts reads them
        machine = tmp_path / "machine.json"  # nobody at the keyboard, a cool GPU
        machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 55}))
        app = QApplication.instance()
        assert isinstance(app, QApplication)
        link = NodeLink(tmp_path / "volunteer" / "data")
        supervisor = NodeSupervisor(
            node_command(["--no-benchmark", "-l", LOOPBACK, "--fake-probes", str(machine)]),
            node_is_running=lambda: False,
        )
        tray = Tray(
            app, link, supervisor, settings_at(tmp_path / "volunteer" / "config"), NoAutostart()
        )
        supervisor.start()
        link.start()
        try:
            tray.first_start()
            wizard = tray.wizard
            assert wizard is not None
            wizard.next()
            page = wizard.project_page
            qtbot.waitUntil(lambda: tray.status is not None, timeout=60_000)
            page.picker.invite_edit.setText(invite)
            qtbot.waitUntil(page.isComplete, timeout=90_000)
            shown = page.picker.summary.text()
            assert "demo-lm" in shown
            assert "Owner's key:" in shown
            assert "Trains: 16 SwiGLU (Mixtral-style) experts in 2 layers" in shown
            wizard.next()
            qtbot.waitUntil(lambda: wizard.currentPage() is wizard.benchmark_page, timeout=90_000)

            def serving_and_accepted() -> bool:
                status = tray.status
                return (
                    status is not None
                    and bool(status.experts)
                    and status.contributions.accepted > 0
                )

            qtbot.waitUntil(serving_and_accepted, timeout=240_000)
            assert tray.status is not None
            assert tray.status.project == parse_invite(invite).project
            assert tray.status.state == "working"
        finally:
            tray.quit()
            link.stop()
    finally:
        demo.send_signal(signal.SIGINT)  # the demo stops every process it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            demo.wait(timeout=120)
        stop_processes([demo])


def test_a_killed_tray_takes_its_node_along_and_a_second_tray_hands_over(tmp_path):
    env = {**os.environ, **node_env(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    node_args = f"--node-args=--no-benchmark -l {LOOPBACK}"
    log = tmp_path / "tray.log"
    with log.open("w") as out:
        tray = subprocess.Popen(
            [sys.executable, "-m", "app.main", "--no-wizard", node_args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        data = tmp_path / "volunteer" / "data"
        started_node = until(lambda: node_pid(data), 60, "the tray did not start a node")
        # a second tray (a web page handing over an invite) gives it to the first, exits
        invite = f"moehome://join/{'0f' * 16}"
        second = subprocess.run(
            [sys.executable, "-m", "app.main", "--no-wizard", invite],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 0, second.stderr
        until(lambda: f"handed over: {invite}" in log.read_text(), 20, "nothing handed over")
        assert tray.poll() is None  # the first one still runs
        tray.send_signal(signal.SIGKILL)  # no goodbye: the node must notice by itself
        tray.wait(timeout=10)
        until(lambda: gone(started_node), 10, "the node outlived the killed tray")
    finally:
        stop_processes([tray])
