"""The node's event log: what happened, numbered, for the control API's long poll."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import trio

from core.control.models import Event


class EventLog:
    """The last ``keep`` events, numbered from 1; readers wait for the next one."""

    def __init__(self, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self._events: deque[Event] = deque(maxlen=keep)
        self._clock = clock
        self._next_id = 1
        self._new_event = trio.Event()

    def publish(self, event: Event) -> None:
        """Record ``event`` (its id and time are set here) and wake the waiting readers."""
        numbered = event.model_copy(update={"id": self._next_id, "at": round(self._clock(), 3)})
        self._events.append(numbered)
        self._next_id += 1
        self._new_event.set()
        self._new_event = trio.Event()

    def after(self, since: int) -> list[Event]:
        return [e for e in self._events if e.id > since]

    async def wait_after(self, since: int, wait: float) -> list[Event]:
        """Events after id ``since``; when there are none, waits up to ``wait`` s (at most
        30) for one."""
        newer = self.after(since)
        if not newer and wait > 0:
            with trio.move_on_after(min(wait, 30.0)):
                await self._new_event.wait()
            newer = self.after(since)
        return newer
