"""Starting the demo's processes from one that has already imported torch, transformers
and libp2p: each process still runs ``moehome <args>`` (the same command line, its own
process, session, environment, stdout and log), but is forked from a server that paid
for the imports once, instead of importing them again (4-8 s of two loaded cores each:
about a third of a short demo went on imports).

Linux only, and only for the demo's processes on this computer's loopback: forking a
process that loaded Apple's frameworks is unsafe, Windows cannot fork, a frozen bundle
and the network lab (``ip netns exec``) start their processes as before.

Protocol, over a SOCK_SEQPACKET pair (a message per packet, file descriptors with it):
the demo sends ``{"id", "module", "args", "env", "cwd", "netns"}`` with the child's stdout and
stderr; the server answers ``{"id", "pid"}`` once it forked, and ``{"id", "code"}``
when the child exited (``code`` as ``Popen.returncode``: negative for a signal). When
the demo's end closes (the demo ended, or was killed), the server stops its children
(SIGTERM, then SIGKILL) and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: What the demo's roles import: loaded once, in the server, before the first fork.
PRELOAD = (
    "torch",
    "trio",
    "core.cli.main",
    "core.roles.peer",
    "core.roles.owner",
    "core.roles.aggregator",
    "core.roles.export",
    "core.roles.credit",
    "core.roles.owner_status",
    "core.node.node",
    "core.trainer.train",
    "core.families.use",
)
#: A message's largest size: an environment of a few KB, with room to spare.
MAX_MESSAGE = 1 << 20
#: How often the server looks for children that exited, between requests.
REAP_EVERY_S = 0.05
#: After SIGTERM, how long the server's children have before SIGKILL.
STOP_GRACE_S = 10.0


def can_fork_here() -> bool:
    """Whether the demo's processes may be forked from a server on this platform."""
    return sys.platform == "linux" and not getattr(sys, "frozen", False)


class ForkedProcess:
    """A process the server forked, with what the demo uses of ``subprocess.Popen``."""

    def __init__(self, args: Sequence[str], stdout: IO[str]) -> None:
        self.args = list(args)
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None
        self._pid: int | None = None
        self._forked = threading.Event()
        self._exited = threading.Event()

    @property
    def pid(self) -> int:
        if not self._forked.wait(timeout=120):
            raise RuntimeError(f"the fork server did not start {self.args}")
        assert self._pid is not None
        return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # it exited; its code is on the way
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _forked_as(self, pid: int) -> None:
        self._pid = pid
        self._forked.set()

    def _exited_with(self, code: int) -> None:
        self.returncode = code
        self._forked.set()
        self._exited.set()


class ForkServer:
    """The server process, and the demo's end of it (a thread reads its answers)."""

    def __init__(
        self, log_path: Path, preload: Sequence[str] = PRELOAD, env: Mapping[str, str] | None = None
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self._lock = threading.Lock()
        self._children: dict[int, ForkedProcess] = {}
        self._next_id = 0
        self.log_path = log_path
        with open(log_path, "a") as log_file:
            self._server = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), *preload],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
                env=dict(os.environ if env is None else env),
            )
        theirs.close()
        self._reader = threading.Thread(target=self._read_answers, name="fork-server", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The server's own process."""
        return self._server.pid

    def start(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        stderr: IO[Any],
        cwd: Path | None = None,
        module: str = "core.cli",
        netns: str | None = None,
    ) -> ForkedProcess:
        """``python -m <module> <args>`` forked by the server: stdout a pipe to read,
        stderr ``stderr`` (a file), stdin /dev/null, a session of its own; ``netns``:
        in that named network namespace (``ip netns``'), as ``ip netns exec`` runs it."""
        read_end, write_end = os.pipe()
        child = ForkedProcess([sys.executable, "-m", module, *args], open(read_end))  # noqa: SIM115 - the caller closes it, as Popen's
        request: dict[str, Any] = {
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd or Path.cwd()),
            "netns": netns,
        }
        try:
            with self._lock:
                self._next_id += 1
                request["id"] = self._next_id
                self._children[self._next_id] = child
                socket.send_fds(
                    self._socket, [json.dumps(request).encode()], [write_end, stderr.fileno()]
                )
        except OSError:  # the server is gone: this child never starts
            child._exited_with(-signal.SIGKILL)
        finally:
            os.close(write_end)
        return child

    def close(self) -> None:
        """The server stops what still runs, and exits."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_WR)
        try:
            self._server.wait(timeout=STOP_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        self._reader.join(timeout=5)
        self._socket.close()

    def _read_answers(self) -> None:
        while True:
            try:
                data = self._socket.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            answer = json.loads(data)
            with self._lock:
                child = self._children.get(answer["id"])
            if child is None:
                continue
            if "pid" in answer:
                child._forked_as(int(answer["pid"]))
            else:
                child._exited_with(int(answer["code"]))
                with self._lock:
                    del self._children[answer["id"]]
        # the server exited: what it started is stopped (it does so itself when it can)
        with self._lock:
            orphans = list(self._children.values())
            self._children.clear()
        if orphans:
            log.error("the demo's fork server exited; see %s", self.log_path)
        for child in orphans:
            if child._pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child._pid, signal.SIGKILL)
            child._exited_with(-signal.SIGKILL)


# --- the server's side ------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    children: dict[int, int] = {}  # pid -> request id
    while True:
        readable, _, _ = select.select([sock], [], [], REAP_EVERY_S)
        _reap(children, sock)
        if not readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        if not data:  # the demo's end closed
            _stop(children, sock)
            return
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _run_child(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        children[pid] = request["id"]
        sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _reap(children: dict[int, int], sock: socket.socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        request_id = children.pop(pid, None)
        if request_id is not None:
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"id": request_id, "code": code}).encode())


def _stop(children: dict[int, int], sock: socket.socket) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children, sock)
        time.sleep(REAP_EVERY_S)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _run_child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m <module> <args>`` in the request's
    session, folders and environment; exit with its code."""
    code = 1
    try:
        os.setsid()
        if request.get("netns"):
            _enter_network_namespace(request["netns"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((stdin, 0), (fds[0], 1), (fds[1], 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["args"]]  # runpy puts the module's path first
        _as_a_fresh_process()
        code = _run_module(request["module"])
    except BaseException:  # noqa: BLE001 - the child's failure is told on its stderr
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _as_a_fresh_process() -> None:
    """What the server's imports settled for it, settled again for this child as a
    process started anew would: torch's thread count (OpenMP read OMP_NUM_THREADS when
    the server loaded it) and the seeds of torch's and numpy's default generators (a
    fresh process draws its own; every child would otherwise draw the server's
    numbers). Python's ``random`` reseeds itself after a fork."""
    torch = sys.modules.get("torch")
    if torch is not None:
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


#: setns(2)'s flag for a network namespace
CLONE_NEWNET = 0x40000000


def _enter_network_namespace(name: str) -> None:
    """This (single-threaded, just forked) process moves into the named network
    namespace: what ``ip netns exec`` does for the network (its remount of /sys and its
    /etc/netns files are not needed here: nothing reads them)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _run_module(module: str) -> int:
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None:
            return 0
        if isinstance(exit_.code, int):
            return exit_.code
        sys.stderr.write(f"{exit_.code}\n")  # as the interpreter tells sys.exit("why")
        return 1
    return 0


def main(argv: Sequence[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    for module in argv[1:]:
        importlib.import_module(module)
    _serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
