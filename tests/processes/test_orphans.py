"""A process started for another one ends with it (core/orphans.py): a volunteer host of
the emulated swarm whose run is killed with SIGKILL, which cannot stop it, stops by
itself. Before, two hosts of a killed 32-volunteer benchmark kept half a core each busy
until they were killed by hand."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from core.demo import emulated_host
from tests.child_processes import stop_processes
from tests.swarm.test_emulated_host import spec_for
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]

#: a run that starts one host and waits for it: the host never serves (no swarm shows
#: its project), so it would look for the manifest for FIRST_LOOK_S, then end
RUN = """
import json, sys
import trio
from core.demo.emulated_host import HostSpec, start_host

async def main() -> None:
    async with trio.open_nursery() as nursery:
        await start_host(nursery, HostSpec(**json.loads(sys.argv[1])))

trio.run(main)
"""


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_volunteer_host_stops_when_the_run_that_started_it_is_killed(tmp_path: Path) -> None:
    spec = spec_for([], "a project no swarm shows", tmp_path)
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, json.dumps(asdict(spec))], cwd=ROOT, stderr=subprocess.PIPE
    )
    hosts: list[psutil.Process] = []
    try:

        def host() -> psutil.Process | None:
            hosts[:] = [
                child
                for child in psutil.Process(run.pid).children()
                if "core.demo.emulated_host" in child.cmdline()
            ]
            return hosts[0] if hosts else None

        started = until(host, 60, "the run started its host")
        assert run.poll() is None
        run.send_signal(signal.SIGKILL)  # the run cannot stop its host now
        run.wait(timeout=10)
        # sooner than the host would end on its own: it was killed as it started, so it
        # still imports (seconds, more on a loaded machine), then would look for the
        # manifest for FIRST_LOOK_S before giving up; the stderr line below says why
        assert emulated_host.FIRST_LOOK_S >= 60
        until(lambda: gone(started), 45, "the host stopped with its run")
        assert run.stderr is not None  # the host's too: closed now that both are gone
        said = run.stderr.read().decode()
        assert "the run that started this host is gone: stopping" in said, said[-2000:]
    finally:
        stop_processes([run])
        for left in hosts:  # no longer the run's child: nothing else would stop it
            if not gone(left):
                left.kill()
