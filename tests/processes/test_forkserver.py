"""The demo's fork server (core/forkserver.py): a forked child is the process it
would have been started as (arguments, folder, environment, session, stdout, stderr,
exit code), signals reach it, and no child outlives the server or the demo's end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from core.forkserver import ForkedProcess, ForkServer
from tests.waiting import until

PROBE = "tests.forkserver_probe"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    started = ForkServer(tmp_path / "server-log.txt", preload=())
    try:
        yield started
    finally:
        started.close()


def start(server: ForkServer, tmp_path: Path, *args: str, **env: str) -> ForkedProcess:
    with open(tmp_path / "child-log.txt", "a") as log:
        return server.start(args, env={**os.environ, **env}, stderr=log, cwd=ROOT, module=PROBE)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_forked_child_is_the_process_it_was_asked_for(server, tmp_path):
    child = start(server, tmp_path, "exit", "3", PROBE_VALUE="seen")
    assert child.stdout is not None
    seen = json.loads(child.stdout.readline())
    assert child.wait(timeout=30) == 3
    assert child.poll() == 3
    child.stdout.close()
    assert seen["argv"] == ["exit", "3"]
    assert seen["cwd"] == str(ROOT)
    assert seen["probe_value"] == "seen"
    assert seen["own_session"]  # a Ctrl-C in the demo's terminal does not reach it
    assert seen["stdin"] == ""
    assert (tmp_path / "child-log.txt").read_text() == "to the log\n"
    assert child.pid != os.getpid()


def test_signals_reach_a_child_and_its_code_says_which(server, tmp_path):
    child = start(server, tmp_path, "sleep", "0")
    assert child.stdout is not None
    child.stdout.readline()
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM
    child.kill()  # after its end: nothing happens
    child.stdout.close()


def test_closing_the_server_stops_the_children_still_running(tmp_path):
    server = ForkServer(tmp_path / "server-log.txt", preload=())
    child = start(server, tmp_path, "sleep", "0")
    assert child.stdout is not None
    child.stdout.readline()
    pid = child.pid
    server.close()
    assert child.poll() == -signal.SIGTERM
    assert gone(pid)
    child.stdout.close()


def test_a_child_does_not_outlive_a_killed_server(server, tmp_path):
    child = start(server, tmp_path, "sleep", "0")
    assert child.stdout is not None
    child.stdout.readline()
    pid = child.pid
    os.kill(server.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    until(lambda: gone(pid), 10, "the orphan killed")
    child.stdout.close()
    # and a child asked for afterwards never starts
    late = start(server, tmp_path, "exit", "0")
    assert late.wait(timeout=10) == -signal.SIGKILL
    assert late.stdout is not None
    assert late.stdout.read() == ""
    late.stdout.close()


@pytest.mark.slow
def test_a_child_of_a_server_that_loaded_torch_takes_its_own_threads_and_seed(tmp_path):
    # OpenMP read the server's environment when torch loaded: the child sets its own
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    server = ForkServer(tmp_path / "server-log.txt", preload=("torch",), env=env)
    try:
        threads, seeds = {}, []
        for wanted in ("1", ""):
            with open(os.devnull, "w") as log:
                child = server.start(
                    ["exit", "0"],
                    env={**env, **({"OMP_NUM_THREADS": wanted} if wanted else {})},
                    stderr=log,
                    cwd=ROOT,
                    module=PROBE,
                )
            assert child.stdout is not None
            seen = json.loads(child.stdout.readline())
            threads[wanted] = seen["torch_threads"]
            seeds.append(seen["torch_seed"])
            assert child.wait(timeout=60) == 0
            child.stdout.close()
        assert threads["1"] == 1
        # each draws its own random numbers, as a process started anew does
        assert seeds[0] != seeds[1]
        if (os.cpu_count() or 1) > 1:  # the server's own count where none is asked for
            assert threads[""] > 1, threads
    finally:
        server.close()
