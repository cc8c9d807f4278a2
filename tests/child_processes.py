"""Helpers for tests that run moehome commands as separate processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from core.control import ControlError, find_node


def stop_processes(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """Terminate what still runs, wait for it, and close the pipes (no fd leaks)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=10)
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe:
                pipe.close()


def node_pid(data: Path) -> int | None:
    """The pid of the node answering for ``data``; None while none answers."""
    try:
        client = find_node(data)
        try:
            return client.status().pid
        finally:
            client.close()
    except ControlError:
        return None


def kill_children_running(module: str) -> None:
    """Kill this process's descendants that run ``python -m module`` (what a test left
    behind when it failed midway). One that ended meanwhile, or ended and waits for its
    parent to reap it (a zombie has no command line left to read), is passed over."""
    for child in psutil.Process().children(recursive=True):
        try:
            if module in child.cmdline():
                child.kill()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue


def gone(pid: int) -> bool:
    """Whether the process ``pid`` ended (a zombie waiting for its parent counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
