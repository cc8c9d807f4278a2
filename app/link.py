"""The tray's line to the node: a status poll and an event long-poll, each on its own
thread so that a slow or dead node never freezes the menu; results arrive as Qt signals
(queued onto the GUI thread). Commands are short synchronous calls with a tight timeout.

The node writes a fresh token and address each time it starts, so the link finds the
node again (from the files in the data folder) whenever a call fails."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Signal

from core.control import ControlClient, ControlError, NodeNotRunning, find_node
from core.control.models import Event, Status

log = logging.getLogger(__name__)
T = TypeVar("T")


class NodeLink(QObject):
    # Models travel as ``object``: Qt hands a Python object across threads as it is.

    #: The node's status snapshot (a :class:`Status`), about once a second.
    status = Signal(object)
    #: The node does not answer (the text says why); emitted on each failed poll.
    unreachable = Signal(str)
    #: New events from the node's stream (a ``list[Event]``).
    events = Signal(object)

    def __init__(self, data_dir: Path, *, interval: float = 1.0, timeout: float = 3.0) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.interval = interval
        self.timeout = timeout
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._client: ControlClient | None = None
        self._last_event = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for target in (self._poll_status, self._poll_events):
            thread = threading.Thread(target=target, name=f"moehome-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self._threads.clear()
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------ commands

    def call(self, action: Callable[[ControlClient], T]) -> T:
        """Run one command against the node; NodeNotRunning / ControlError on failure."""
        client = self._connect()
        try:
            return action(client)
        except NodeNotRunning:
            self._forget(client)
            raise

    def problems(self, action: Callable[[ControlClient], Any], general: str = "") -> list[str]:
        """Run a command the node validates: [] when it took it, else its problems
        ("field: message"; a failure without them becomes one, prefixed ``general``)."""
        try:
            self.call(action)
        except ControlError as exc:
            return exc.problems or [f"{general}{exc}"]
        return []

    def try_call(self, action: Callable[[ControlClient], Any]) -> str | None:
        """Like call(), for menu actions: returns the error message instead of raising."""
        try:
            self.call(action)
        except ControlError as exc:
            log.info("node command failed: %s", exc)
            return str(exc)
        return None

    # ------------------------------------------------------------ threads

    def _connect(self) -> ControlClient:
        with self._lock:
            if self._client is None:
                self._client = find_node(self.data_dir)  # NodeNotRunning without files
            return self._client

    def _forget(self, client: ControlClient) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    def _poll_status(self) -> None:
        while not self._stop.is_set():
            try:
                status: Status = self.call(lambda c: c.status())
                self.status.emit(status)
            except ControlError as exc:
                self.unreachable.emit(str(exc))
            except Exception as exc:  # noqa: BLE001 - a bad answer must not end the poll
                log.warning("status poll failed: %s", exc)
                self.unreachable.emit(f"unexpected answer from the node: {exc}")
            self._stop.wait(self.interval)

    def _poll_events(self) -> None:
        while not self._stop.is_set():
            try:
                new: list[Event] = self.call(lambda c: c.events(self._last_event, wait=2.0))
            except ControlError:
                self._stop.wait(self.interval)
                continue
            except Exception as exc:  # noqa: BLE001
                log.warning("event poll failed: %s", exc)
                self._stop.wait(self.interval)
                continue
            if new:
                self._last_event = max(e.id for e in new)
                self.events.emit(new)

    def node_restarted(self) -> None:
        """A new node process numbers its events from 1 again."""
        self._last_event = 0
