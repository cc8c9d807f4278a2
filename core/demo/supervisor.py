"""Starting and stopping the demo's processes: each part is the ``moehome`` command in a
process of its own, watched, and stopped (SIGTERM, then SIGKILL) on the way out."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from core.errors import UserFacingError
from core.forkserver import ForkedProcess, ForkServer, can_fork_here

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a 2-core machine starting ten Python processes with torch is slow


def moehome_command() -> list[str]:
    """How to start ``moehome`` from here: the bundled executable, or this Python."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "core.cli"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the aggregator's: its address goes in the manifest,
    which must be signed before the aggregator starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _namespace_of(prefix: Sequence[str]) -> str | None:
    """The network namespace of a prefix that runs a command in one (the network lab's
    ``ip netns exec NAME``: the fork server moves its child there itself); else None."""
    words = list(prefix)
    if len(words) == 4 and words[:3] == ["ip", "netns", "exec"]:
        return words[3]
    return None


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str] | ForkedProcess
    role: str = ""
    public_key: str = ""
    lines: list[str] = field(default_factory=list)
    #: the lab host it runs in (``moehome demo --nat``), e.g. "a/0"; "" on loopback
    where: str = ""


class Swarm:
    """The demo's processes: started in their own session (a Ctrl-C in the terminal
    reaches only the demo, which then stops them in order), stopped on the way out.
    ``fork``: they are forked from a server that imported torch, transformers and
    libp2p once (:mod:`core.forkserver`; a prefix other than the network lab's
    ``ip netns exec``: started as before), where the platform allows it."""

    def __init__(self, root: Path, *, fork: bool = True) -> None:
        self.root = root
        self.procs: list[Proc] = []
        self._log_files: list[Any] = []
        self._fork_server = (
            ForkServer(root / "fork-server-log.txt") if fork and can_fork_here() else None
        )

    def folder(self, name: str) -> Path:
        path = self.root / name
        (path / "data").mkdir(parents=True, exist_ok=True)
        (path / "config").mkdir(parents=True, exist_ok=True)
        return path

    def start(
        self,
        name: str,
        args: list[str],
        *,
        threads: int | None = 1,
        role: str = "",
        prefix: Sequence[str] = (),
    ) -> Proc:
        """Start ``moehome <args>``; ``prefix`` runs it through another command (e.g.
        ``ip netns exec <namespace>`` in the network lab)."""
        folder = self.folder(name)
        env = {
            **os.environ,
            "MOEHOME_DATA_DIR": str(folder / "data"),
            "MOEHOME_CONFIG_DIR": str(folder / "config"),
        }
        if threads is not None:  # ten processes on a few cores: one thread each
            env["OMP_NUM_THREADS"] = str(threads)
        log_file = open(folder / "log.txt", "a")  # noqa: SIM115 - closed in stop_all
        self._log_files.append(log_file)
        args = ["--data-dir", str(folder / "data"), *args]
        popen: subprocess.Popen[str] | ForkedProcess
        netns = _namespace_of(prefix)
        if self._fork_server is not None and (not prefix or netns):
            popen = self._fork_server.start(args, env=env, stderr=log_file, netns=netns)
        else:
            popen = subprocess.Popen(
                [*prefix, *moehome_command(), *args],
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
        proc = Proc(name, popen, role)
        self.procs.append(proc)
        return proc

    async def first_line(self, proc: Proc, prefix: str = "/ip4/") -> str:
        """The first stdout line starting with ``prefix`` (an address, mostly)."""
        assert proc.popen.stdout is not None
        with trio.fail_after(START_TIMEOUT_S):
            while True:
                line = await trio.to_thread.run_sync(
                    proc.popen.stdout.readline, abandon_on_cancel=True
                )
                if not line:
                    code = proc.popen.wait()
                    raise UserFacingError(
                        f"{proc.name} exited with code {code}; see {self.root / proc.name}/log.txt"
                    )
                proc.lines.append(line)
                if line.startswith(prefix):
                    return line.strip()

    async def run_to_end(self, name: str, args: list[str], prefix: Sequence[str] = ()) -> str:
        proc = self.start(name, args, prefix=prefix)
        assert proc.popen.stdout is not None
        out = await trio.to_thread.run_sync(proc.popen.stdout.read)
        code = await trio.to_thread.run_sync(proc.popen.wait)
        if code:
            raise UserFacingError(f"{name} failed ({code}); see {self.root / name}/log.txt")
        return out

    def kill(self, proc: Proc) -> None:
        """SIGKILL: a volunteer whose machine vanished (no goodbye to anyone)."""
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait()

    def stop_all(self) -> None:
        """SIGTERM in reverse start order (volunteers withdraw their experts), then
        SIGKILL whatever is still running after 15 s."""
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.popen.terminate()
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()
        if self._fork_server is not None:
            self._fork_server.close()
        for f in self._log_files:
            f.close()
