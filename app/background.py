"""Blocking node commands (finding a project can take a minute) run on a worker thread;
their result comes back to the GUI thread, so no window freezes while the node looks.

Widgets take a :data:`Runner`: :func:`run_in_thread` in the app, :func:`run_now` in tests
(the same code path, without threads to wait for)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)
T = TypeVar("T")

#: run(work, on_result, on_error): call ``work``; hand its value to ``on_result``, or its
#: exception to ``on_error``, on the GUI thread.
Runner = Callable[[Callable[[], Any], Callable[[Any], None], Callable[[Exception], None]], None]


def run_now(
    work: Callable[[], T], on_result: Callable[[T], None], on_error: Callable[[Exception], None]
) -> None:
    """Synchronously (tests, and calls known to be quick)."""
    try:
        value = work()
    except Exception as exc:  # noqa: BLE001 - handed to the caller's handler
        on_error(exc)
        return
    on_result(value)


class _Mailbox(QObject):
    # (callback, value): emitted on the worker thread, delivered on the GUI thread
    # (the mailbox lives there, so Qt queues the call)
    deliver = Signal(object, object)

    def __init__(self) -> None:
        super().__init__()
        self.deliver.connect(lambda callback, value: callback(value))


_mailbox: _Mailbox | None = None


def run_in_thread(
    work: Callable[[], T], on_result: Callable[[T], None], on_error: Callable[[Exception], None]
) -> None:
    """On a daemon thread (a node that never answers cannot hold up quitting); the
    callbacks run on the GUI thread. Call from the GUI thread."""
    global _mailbox
    if _mailbox is None:
        _mailbox = _Mailbox()
    mailbox = _mailbox

    def target() -> None:
        try:
            value = work()
        except Exception as exc:  # noqa: BLE001 - handed to the caller's handler
            mailbox.deliver.emit(on_error, exc)
            return
        mailbox.deliver.emit(on_result, value)

    threading.Thread(target=target, name="moehome-command", daemon=True).start()
