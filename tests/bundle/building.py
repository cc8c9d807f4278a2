"""The bundle's build for its test, started with the test session when the whole suite
runs in one process (``pytest`` without ``-n``): PyInstaller needs about three minutes
of one core, and the suite's quick tests (unit, property, most swarm and GUI tests:
mostly one process) leave the other core idle for about as long. So the build runs
beside them at the lowest priority the system offers (its own session and autogroup at
nice 19, SCHED_IDLE, idle I/O class), and is stopped (SIGSTOP) for the length of every
test marked slow: those run many processes and measure rates and routing. In the one
fresh-clone run with the build beside them, the demo tests ran 20-40% slower and a
routing margin broke (two vCPUs may share one physical core, which no priority helps);
this machine's own speed varies that much too, so the cause is not proven, but a slow
test now meets the machine as it did before the build moved here. The bundle test runs
last and waits for what is left of the build.

On two workers (``make test``: tests/parallel.py) the bundle's test goes first and
builds in the foreground of its worker while the other worker runs tests: there is no
idle core to borrow when two workers share two cores. Run alone (``pytest
tests/bundle``), the test starts the build in the foreground too. With
MOEHOME_BUNDLE naming a bundle built before (the GPU variant: installer/README.md), the
test runs that one and nothing is built."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Where the bundle's tests are (their node ids start so).
BUNDLE_TESTS = "tests/bundle/"
#: A bundle's folder, built before: the test runs it instead of building one.
BUNDLE_VARIABLE = "MOEHOME_BUNDLE"


def prebuilt_bundle() -> Path | None:
    folder = os.environ.get(BUNDLE_VARIABLE)
    return Path(folder).resolve() if folder else None


def bundle_report(bundle: Path) -> dict[str, Any]:
    """What installer/build.py reports of a bundle, read from its folder."""
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file() and not f.is_symlink())
    return {
        "bundle": str(bundle),
        "bundle_mb": round(size / 2**20, 1),
        "executables": sorted(
            p.name for p in bundle.iterdir() if p.is_file() and p.name.startswith("moehome")
        ),
    }


def _lowest_priority() -> None:  # pragma: no cover - runs in the child, before exec
    """In the build's process (a new session, so an autogroup of its own): every
    scheduler's way of saying "only when idle"; each is best effort."""
    with contextlib.suppress(OSError):
        # with autogroups, nice weighs only within a session: lower the group itself
        Path("/proc/self/autogroup").write_text("19")
    with contextlib.suppress(OSError):
        os.nice(19)
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


@dataclass
class BundleBuild:
    """``installer/build.py`` running into ``folder``; its report is its stdout's last
    line."""

    folder: Path
    popen: subprocess.Popen[bytes]
    background: bool

    #: pids of the builds started in this session (each leads a process session of its
    #: own when it runs in the background)
    started: ClassVar[set[int]] = set()

    @staticmethod
    def start(*, background: bool) -> BundleBuild:
        folder = Path(tempfile.mkdtemp(prefix="moehome-bundle-"))
        low = background and sys.platform.startswith("linux")
        with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "installer" / "build.py"),
                    "--dist",
                    str(folder / "dist"),
                    "--work",
                    str(folder / "work"),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=err,
                start_new_session=low,
                # pytest has started no thread at collection, when a background build starts
                preexec_fn=_lowest_priority if low else None,
            )
        if low:
            # inherited by the build's own subprocesses (PyInstaller's hook runners),
            # which start after this: the build renders icons first
            with contextlib.suppress(psutil.Error, AttributeError):
                psutil.Process(popen.pid).ionice(psutil.IOPRIO_CLASS_IDLE)
        BundleBuild.started.add(popen.pid)
        return BundleBuild(folder, popen, background)

    def pause(self) -> None:
        """Stop the build's processes where they are (SIGSTOP), for a test that must have
        the machine to itself."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self.background and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)  # its session: PyInstaller's helpers too

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the build has ended."""
        code = self.popen.wait(timeout=timeout)
        return (
            code,
            (self.folder / "stdout").read_text(errors="replace"),
            (self.folder / "stderr").read_text(errors="replace"),
        )

    def remove(self) -> None:
        """Stop the build if it still runs (a session cut short), and delete its ~1 GB."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.background:  # its session: PyInstaller's helpers too
                    os.killpg(self.popen.pid, 9)
                else:
                    self.popen.kill()
            self.popen.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


#: the build started with the session, when the bundle test runs after others
BUNDLE_BUILD = pytest.StashKey[BundleBuild]()


def children_but_the_bundle_build() -> list[psutil.Process]:
    """This process's children and theirs, but the bundle's build and its helpers,
    which run beside the other tests."""
    builds = BundleBuild.started

    def of_a_build(child: psutil.Process) -> bool:
        try:
            return child.pid in builds or os.getsid(child.pid) in builds
        except OSError:  # gone meanwhile
            return True

    return [c for c in psutil.Process().children(recursive=True) if not of_a_build(c)]
