"""The tray runs the node as a child process and keeps it running: restarts after a crash
with growing pauses (1 s, 2 s, 4 s ... 60 s; back to 1 s after a minute of good health),
stops it cleanly on Quit; a node stopped cleanly by someone else (``moehome stop``) is
not restarted. The node ends with the tray (``--exit-with-parent``), also a killed one.
A node that is already running for the same data folder (one started by hand) is used as
it is, not doubled."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from core.logs import LOG_MAX_BYTES, rotate_log

log = logging.getLogger(__name__)

#: The exit code reported for a node that could not be started at all.
START_FAILED = 127
#: How often the node's log is checked against its cap (core/logs.py).
LOG_CHECK_MS = 30_000


def node_command(extra: Sequence[str] = ()) -> list[str]:
    """How to start the node: the bundled executable next to the tray's when frozen
    (PyInstaller), else this Python with the CLI module. The node ends with the tray,
    also when the tray is killed and cannot say so."""
    node = ["node", "--exit-with-parent", *extra]
    if getattr(sys, "frozen", False):
        exe = Path(sys.executable).with_name("moehome.exe" if os.name == "nt" else "moehome")
        return [str(exe), *node]
    return [sys.executable, "-m", "core.cli", *node]


class NodeSupervisor(QObject):
    #: The node process started (pid).
    started = Signal(int)
    #: The node process ended unexpectedly (exit code, seconds until the restart).
    crashed = Signal(int, float)
    #: The node ended cleanly without being asked by us (``moehome stop``): not restarted.
    stopped = Signal()

    def __init__(
        self,
        command: list[str],
        *,
        node_is_running: Callable[[], bool],
        log_path: Path | None = None,
        healthy_after: float = 60.0,
        most_delay: float = 60.0,
    ) -> None:
        super().__init__()
        self.command = command
        self.node_is_running = node_is_running  # a node answering for our data folder
        self.log_path = log_path
        self.healthy_after = healthy_after
        self.most_delay = most_delay
        self.restarts = 0
        self._delay = 1.0
        self._stopping = False
        self._process: QProcess | None = None
        self._restart = QTimer(self)
        self._restart.setSingleShot(True)
        self._restart.timeout.connect(self.start)
        self._healthy = QTimer(self)
        self._healthy.setSingleShot(True)
        self._healthy.timeout.connect(self._reset_delay)
        # the node's log is cut while it runs (it appends, so it writes on at the start)
        self._log_check = QTimer(self)
        self._log_check.timeout.connect(self._rotate_log)
        self._log_check.start(LOG_CHECK_MS)

    def _rotate_log(self) -> None:
        if self.log_path is not None and rotate_log(self.log_path):
            log.info("node log over %d MB: older lines in %s.1", LOG_MAX_BYTES >> 20, self.log_path)

    @property
    def pid(self) -> int | None:
        if self._process is None or self._process.state() == QProcess.ProcessState.NotRunning:
            return None
        return int(self._process.processId())

    def start(self) -> None:
        if self._stopping or self.pid is not None:
            return
        if self.node_is_running():
            log.info("a node is already running for this data folder: using it")
            return
        process = QProcess(self)
        process.setProgram(self.command[0])
        process.setArguments(self.command[1:])
        process.setProcessEnvironment(QProcessEnvironment.systemEnvironment())
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._rotate_log()
            process.setStandardOutputFile(str(self.log_path), QProcess.OpenModeFlag.Append)
            process.setStandardErrorFile(str(self.log_path), QProcess.OpenModeFlag.Append)
        process.finished.connect(self._finished)
        process.errorOccurred.connect(self._error)
        self._process = process
        process.start()
        if process.waitForStarted(10_000):
            log.info("node started (pid %s)", process.processId())
            self.started.emit(int(process.processId()))
            self._healthy.start(int(self.healthy_after * 1000))

    def stop(self, ask_nicely: Callable[[], None] | None = None, wait_s: float = 15.0) -> None:
        """Stop for good: ``ask_nicely`` (the control API's shutdown) or SIGTERM, then a
        kill if it has not ended within ``wait_s``."""
        self._stopping = True
        self._restart.stop()
        self._healthy.stop()
        process = self._process
        if process is None or process.state() == QProcess.ProcessState.NotRunning:
            return
        try:
            if ask_nicely is not None:
                ask_nicely()
            else:
                process.terminate()
        except Exception as exc:  # noqa: BLE001 - fall back to the signal
            log.info("could not ask the node to stop (%s); terminating it", exc)
            process.terminate()
        if not process.waitForFinished(int(wait_s * 1000)):
            log.warning("node did not stop within %.0f s: killing it", wait_s)
            process.kill()
            process.waitForFinished(5000)

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._healthy.stop()
        if self._stopping:
            return
        if code == 0 and status == QProcess.ExitStatus.NormalExit:
            # a clean stop someone asked for (`moehome stop`): a crash never exits with 0
            log.info("node stopped cleanly; not restarting it")
            self._stopping = True
            self.stopped.emit()
            return
        delay = self._delay
        self._delay = min(self._delay * 2, self.most_delay)
        self.restarts += 1
        log.warning("node ended (exit %s, %s); restarting in %.0f s", code, status.name, delay)
        # killed by a signal: its number, negative (as subprocess says it)
        signalled = status == QProcess.ExitStatus.CrashExit and code > 0 and code != START_FAILED
        self.crashed.emit(-int(code) if signalled else int(code), delay)
        self._restart.start(int(delay * 1000))

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and not self._stopping:
            log.error("cannot start the node: %s", " ".join(self.command))
            self._finished(START_FAILED, QProcess.ExitStatus.CrashExit)

    def _reset_delay(self) -> None:
        self._delay = 1.0
