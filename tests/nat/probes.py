"""Tiny socket programs run inside lab namespaces (plain python3, no moehome)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from net.testing.lab import LabHost

#: listens on argv[1], prints "ready", then answers each connection with the address it
#: came from, as "ip port"
ECHO_SOURCE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
print("ready", flush=True)
while True:
    c, a = s.accept(); c.sendall(f"{a[0]} {a[1]}".encode()); c.close()
"""

#: connects from port argv[3] (0: any) to argv[1]:argv[2]; prints what the server saw,
#: or "unreachable <error>"
ASK_SOURCE = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.settimeout(2)
s.bind(("0.0.0.0", int(sys.argv[3])))
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(100).decode())
except OSError as e:
    print("unreachable", e)
"""

#: simultaneous open: binds argv[3], waits until time argv[4], connects to
#: argv[1]:argv[2] (three tries); prints "connected" or "failed <error>"
PUNCH_SOURCE = """
import socket, sys, time
def sock():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", int(sys.argv[3]))); s.settimeout(2); return s
s = sock(); time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
error = None
for _ in range(3):
    try:
        s.connect((sys.argv[1], int(sys.argv[2]))); print("connected", flush=True); break
    except OSError as e:
        error = e; s.close(); time.sleep(0.2); s = sock()
else:
    print("failed", error)
"""


def start_echo(host: LabHost, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        host.command([sys.executable, "-c", ECHO_SOURCE, str(port)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def ask(host: LabHost, ip: str, port: int, from_port: int = 0) -> str:
    done = subprocess.run(
        host.command([sys.executable, "-c", ASK_SOURCE, ip, str(port), str(from_port)]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip()


def punch(host: LabHost, ip: str, port: int, from_port: int, at: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        host.command([sys.executable, "-c", PUNCH_SOURCE, ip, str(port), str(from_port), str(at)]),
        stdout=subprocess.PIPE,
        text=True,
    )


class Lines:
    """A child's standard output, line by line, read in a thread: wait for a line that
    matches, within a deadline, without blocking on a child that says nothing."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, wanted: Callable[[str], bool], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout} s; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended (rc {self.proc.wait()}); saw {self.seen}")
            self.seen.append(line)
            if wanted(line):
                return line


#: The port lab peers listen on (each in its own namespace).
PEER_PORT = 4001
ROOT = Path(__file__).resolve().parents[2]


def start_peer(
    host: LabHost,
    bootstrap: list[str],
    port: int = PEER_PORT,
    *,
    observe_s: float = 30,
    map_port: bool = False,
    relay_circuit_mib: float | None = None,
    dead_after_s: int | None = None,
) -> tuple[subprocess.Popen[str], Lines, str]:
    """A bare swarm peer in ``host``'s namespace; returns it, its output and its address
    on the lab's network. ``observe_s``: how often it asks where it is seen from;
    ``map_port``: it asks its router to forward its port; ``dead_after_s``: how soon it
    drops a connection that died silently (30 s by default)."""
    cmd = [sys.executable, "-m", "core.cli", "--quiet", "peer", "--ephemeral"]
    cmd += ["-l", f"/ip4/0.0.0.0/tcp/{port}", "--recheck-s", "1", "--observe-s", str(observe_s)]
    if map_port:
        cmd.append("--map-port")
    if relay_circuit_mib is not None:
        cmd += ["--relay-circuit-mib", str(relay_circuit_mib)]
    if dead_after_s is not None:
        cmd += ["--dead-after-s", str(dead_after_s)]
    for addr in bootstrap:
        cmd += ["-b", addr]
    proc = subprocess.Popen(host.command(cmd), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    lines = Lines(proc)
    addr = lines.wait_for(lambda line: line.startswith(f"/ip4/{host.ip}/"), 30)
    return proc, lines, addr
