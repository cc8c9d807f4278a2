"""Waiting for something to happen: poll a condition until a deadline, never a fixed
sleep (a sleep long enough on a busy CI machine is a waste everywhere else, and one
short enough here fails there)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import trio


async def eventually(
    condition: Callable[[], Any | Awaitable[Any]], timeout: float = 10.0, *, step: float = 0.02
) -> float:
    """Wait until ``condition()`` (a function or a coroutine function) is true; return
    the seconds it took. Fails with trio.TooSlowError after ``timeout``."""
    started = trio.current_time()
    with trio.fail_after(timeout):
        while True:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return trio.current_time() - started
            await trio.sleep(step)
