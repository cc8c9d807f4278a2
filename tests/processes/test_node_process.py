"""`moehome node` as its own process, driven by the CLI as a volunteer would: status,
pause, resume, snooze, preferences (validated by the node, kept across a restart), and
the throttle reacting to the machine (fake probes read from a file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from core.namespaces import moehome_validator
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from net import Identity, Peer
from tests.child_processes import stop_processes
from tests.swarm.test_project import small_manifest

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "/ip4/127.0.0.1/tcp/0"  # the node listens on every interface unless told


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", "--quiet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def status_of(env: dict[str, str]) -> dict[str, Any]:
    out = await trio.to_thread.run_sync(cli, env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def until_state(env: dict[str, str], wanted: str, limit: float = 20.0) -> dict[str, Any]:
    with trio.fail_after(limit):
        while (status := await status_of(env))["state"] != wanted:
            await trio.sleep(0.2)
    return status


async def start_node(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "core.cli",
        "--quiet",
        "node",
        "--no-benchmark",
        "-l",
        LOOPBACK,
        *args,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = await trio.to_thread.run_sync(proc.stdout.readline)
    assert line.startswith("/ip4/"), line
    return proc


@pytest.mark.slow
async def test_the_node_process_obeys_the_cli(tmp_path):
    prepared = prepare(small_manifest(tmp_path), OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 55}))
    env = {
        **os.environ,
        "MOEHOME_DATA_DIR": str(tmp_path / "data"),
        "MOEHOME_CONFIG_DIR": str(tmp_path / "config"),
    }
    async with trio.open_nursery() as nursery:
        owner: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(serve_project, owner, prepared)
        args = ("--project", pid, "-b", owner.addrs()[0], "--fake-probes", str(machine))
        procs = [await start_node(env, *args)]
        try:
            status = await until_state(env, "working")
            assert len(status["experts"]) >= 1
            assert status["readings"]["gpu_temp_c"] == 55

            out = await trio.to_thread.run_sync(cli, env, "pause")
            assert "paused by you" in out.stdout
            await until_state(env, "paused", 2)
            await trio.to_thread.run_sync(cli, env, "resume")
            await until_state(env, "working", 2)

            out = await trio.to_thread.run_sync(cli, env, "snooze", "90m")
            assert out.stdout.startswith("snoozed: until"), out.stdout
            await trio.to_thread.run_sync(cli, env, "resume")

            bad = await trio.to_thread.run_sync(cli, env, "prefs", "resume_below_c=90")
            assert bad.returncode == 1
            assert "resume_below_c (90.0) must be below pause_above_c" in bad.stderr
            ok = await trio.to_thread.run_sync(
                cli, env, "prefs", "pause_above_c=70", "resume_below_c=60"
            )
            assert ok.returncode == 0, ok.stderr
            assert "pause_above_c        70.0" in ok.stdout

            # the GPU heats past the volunteer's new limit: paused within 2 s, and why
            machine.write_text(json.dumps({"idle_seconds": 3600, "gpu_temp_c": 72}))
            status = await until_state(env, "paused", 2)
            assert status["reason_code"] == "gpu_hot"
            assert "72 °C, resumes at 60 °C" in status["reason"]
        finally:
            stop_processes(procs)
        # preferences survive a restart
        procs = [await start_node(env, *args)]
        try:
            prefs = await trio.to_thread.run_sync(cli, env, "prefs")
            assert "pause_above_c        70.0" in prefs.stdout
        finally:
            stop_processes(procs)
        nursery.cancel_scope.cancel()
