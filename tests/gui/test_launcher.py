"""`moehome-tray` runs the tray as a child and starts it again after a crash (a fatal
error of Qt or Python killed it, and its node, without a word: issue 36's walk); a tray
that quits or is told to is not started again, and a tray whose launcher is killed quits
and takes its node along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from app.launcher import CHILD_ENV, crashed, watch
from tests.child_processes import gone, kill_children_running, node_pid, stop_processes
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX exit codes")
@pytest.mark.parametrize(
    ("code", "crash"),
    [
        (0, False),  # Quit
        (1, False),  # an error it reported (another tray does not answer)
        (-signal.SIGABRT, True),  # Python's fatal errors (none_dealloc) abort
        (-signal.SIGSEGV, True),
        (-signal.SIGBUS, True),
        (-signal.SIGTERM, False),  # logout, `kill`: someone's wish
        (-signal.SIGINT, False),
        (-signal.SIGKILL, False),
        (134, True),  # SIGABRT as a shell reports it
    ],
)
def test_what_counts_as_a_crash(code, crash):
    assert crashed(code) is crash


def counting_child(runs: Path, *, crash_first: int, exit_code: int = 0) -> list[str]:
    """A child that notes each start (with its arguments) and crashes the first
    ``crash_first`` times."""
    script = (
        "import os, sys; from pathlib import Path; "
        f"p = Path({str(runs)!r}); "
        "n = len(p.read_text().splitlines()) if p.exists() else 0; "
        "p.write_text((p.read_text() if p.exists() else '') + ' '.join(sys.argv[1:]) + '\\n'); "
        f"os.abort() if n < {crash_first} else sys.exit({exit_code})"
    )
    return [sys.executable, "-c", script]


def test_a_crashed_tray_is_started_again_without_its_invite(tmp_path):
    runs = tmp_path / "runs"
    command = counting_child(runs, crash_first=2)
    invite = "moehome://join/" + "0f" * 16
    code = watch([*command, "--no-wizard", invite], again=[*command, "--no-wizard"], pause_s=0)
    assert code == 0
    assert runs.read_text().splitlines() == [f"--no-wizard {invite}", "--no-wizard", "--no-wizard"]


def test_a_tray_that_keeps_crashing_is_given_up_and_an_exit_code_is_passed_on(tmp_path):
    always = counting_child(tmp_path / "always", crash_first=100)
    assert watch(always, most=2, pause_s=0) == 128 + signal.SIGABRT
    assert len((tmp_path / "always").read_text().splitlines()) == 3  # the first, 2 again
    quits = counting_child(tmp_path / "quits", crash_first=0, exit_code=3)
    assert watch(quits, pause_s=0) == 3
    assert len((tmp_path / "quits").read_text().splitlines()) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_real_tray_comes_back_after_a_crash_and_goes_with_its_launcher(tmp_path):
    data = tmp_path / "data"
    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(data),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
        "QT_QPA_PLATFORM": "offscreen",
    }
    env.pop(CHILD_ENV, None)
    with (tmp_path / "tray.log").open("w") as log:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.launcher",
                "--no-wizard",
                "--node-args=--no-benchmark -l /ip4/127.0.0.1/tcp/0",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        first_node = until(lambda: node_pid(data), 60, "the tray did not start a node")
        (tray,) = psutil.Process(launcher.pid).children()
        tray.send_signal(signal.SIGABRT)  # as Python's fatal errors end
        second_node = until(
            lambda: (pid := node_pid(data)) != first_node and pid,
            90,
            "the tray was not started again with a node",
        )
        assert gone(first_node)
        (again,) = psutil.Process(launcher.pid).children()
        assert again.pid != tray.pid
        assert launcher.poll() is None
        launcher.send_signal(signal.SIGKILL)  # no goodbye: the tray must notice by itself
        launcher.wait(timeout=10)
        until(lambda: gone(again.pid), 20, "the tray outlived its launcher")
        until(lambda: gone(second_node), 20, "the node outlived the tray")
        assert "the tray crashed" in (tmp_path / "tray.log").read_text()
    finally:
        stop_processes([launcher])
        kill_children_running("app.main")
