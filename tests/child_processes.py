"""Helpers for tests that run moehome commands as separate processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from typing import Any


def stop_processes(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """Terminate what still runs, wait for it, and close the pipes (no fd leaks)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=10)
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe:
                pipe.close()
