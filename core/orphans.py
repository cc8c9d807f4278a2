"""A process started for another one ends with it.

The tray's node (``moehome node --exit-with-parent``) and the emulated swarm's volunteer
hosts (core/demo/emulated_host.py) serve the process that started them and nobody else.
A parent that is killed (SIGKILL, a crash, a benchmark stopped by hand) cannot stop
them: measured, two hosts of a killed 32-volunteer benchmark kept half a core each busy
until killed by hand. So they watch their parent and stop when it is gone.
"""

from __future__ import annotations

import os

import psutil
import trio


async def until_orphaned(parent: int | None = None, every: float = 0.5) -> None:
    """Return once the process that started this one is gone: this process was handed
    to another parent, or the parent no longer runs (psutil compares start times, so a
    pid used again by another program is not taken for the parent). ``parent``: its pid
    as known when this process started (a parent that died while this one was still
    importing has handed it on already: the parent at the call would be the new one);
    None: the parent at the call. Looked at every ``every`` seconds."""
    first = os.getppid() if parent is None else parent
    try:
        watched: psutil.Process | None = psutil.Process(first)
    except psutil.Error:
        watched = None
    while True:
        if os.getppid() != first or watched is None or not watched.is_running():
            return
        await trio.sleep(every)
