"""Waiting for something to happen: poll a condition until a deadline, never a fixed
sleep (a sleep long enough on a busy CI machine is a waste everywhere else, and one
short enough here fails there)."""

from __future__ import annotations

import inspect
import time
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


def until(condition: Callable[[], Any], timeout: float, why: str, *, step: float = 0.1) -> Any:
    """The same for tests outside trio (a GUI process, a child to outlive): poll
    ``condition()`` until it is true and return it; fail with ``why`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"after {timeout:g} s: {why}")
        time.sleep(step)
    return result
