"""`moehome demo` as a person runs it: Ctrl-C stops every process it started (the trainer
first evaluates, checkpoints and reports), and a second run with the same --workdir is the
same project, whose trainer resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from tests.child_processes import stop_processes
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def demo(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "core.cli", "demo", "--workdir", str(workdir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


async def test_ctrl_c_stops_the_swarm_and_a_second_run_resumes(tmp_path):
    workdir = tmp_path / "demo"
    # the first run ends by Ctrl-C, without the model's export (the second run makes it)
    first = demo(workdir, "--steps", "1000", "--volunteers", "2", "--no-sample")
    try:
        assert first.stderr is not None
        with trio.fail_after(240):  # starting ~7 processes with torch on 2 cores
            while True:
                line = await trio.to_thread.run_sync(first.stderr.readline)
                assert line, "the demo ended before training"
                if "step 0: validation loss" in line:
                    break
        # a few steps: enough that the experts' first new version came out of them
        aggregator_log = workdir / "aggregator" / "log.txt"
        await eventually(lambda: "version 1 from" in aggregator_log.read_text(), 120)
        children = psutil.Process(first.pid).children(recursive=True)
        assert len(children) >= 6  # bootstrap, owner, aggregator, 2 volunteers, trainer
        first.send_signal(signal.SIGINT)
        out, _ = await trio.to_thread.run_sync(lambda: first.communicate(timeout=120))
        assert first.returncode == 0, out
    finally:
        stop_processes([first])
    assert "(stopped before the last step)" in out
    steps = int(re.search(r"summary: (\d+) steps", out).group(1))  # type: ignore[union-attr]
    assert steps > 0
    deadline = time.monotonic() + 5
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, [c for c in children if c.is_running()]
        await trio.sleep(0.2)

    second = demo(workdir, "--steps", str(steps + 5), "--volunteers", "2", "--json")
    try:
        out, err = await trio.to_thread.run_sync(lambda: second.communicate(timeout=300))
    finally:
        stop_processes([second])
    assert second.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["resumed_at_step"] == steps
    assert summary["steps"] == steps + 5
    assert summary["samples"] == (steps + 5) * 16
    assert not summary["stopped_early"]
    assert summary["generated"], "the resumed run's model exported and sampled"
    assert Path(summary["page"]).is_file()


async def test_sigterm_stops_the_demo_and_all_it_started(tmp_path):
    # the demo's processes run in sessions of their own: a supervisor's SIGTERM (or the
    # terminal's SIGHUP, the same path) reaches them only through the demo
    workdir = tmp_path / "demo"
    run = demo(workdir, "--steps", "1000", "--volunteers", "1", "--no-sample")
    try:
        # the swarm is starting: the fork server, the bootstrap peer, the owner (publishing)
        # and the aggregator run
        children: list[psutil.Process] = []

        def started() -> bool:
            children[:] = psutil.Process(run.pid).children(recursive=True)
            return len(children) >= 4

        await eventually(started, 120, step=0.2)
        run.send_signal(signal.SIGTERM)
        _, err = await trio.to_thread.run_sync(lambda: run.communicate(timeout=60))
    finally:
        stop_processes([run])
    assert run.returncode == 1, err[-2000:]
    assert "stopped by SIGTERM or SIGHUP" in err
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
