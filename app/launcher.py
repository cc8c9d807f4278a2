"""`moehome-tray`: the tray, watched. A fatal error of Qt or of Python inside the tray
(a segfault, ``none_dealloc``) kills it without a word, and its node with it; the
volunteer would find the icon gone and nothing working. So the tray runs as a child of
this small process (no Qt, a few MB), which starts it again after a crash: up to
``MOST_RESTARTS`` times in ``WITHIN_S``, each after ``PAUSE_S``. A tray that quits, or
is told to (SIGTERM at logout, Ctrl-C), is not started again: the signal is passed on
and its exit code is ours. The child quits by itself when this process is gone
(``app.main``), as the node quits when the tray is.

``python -m app.main`` runs the tray itself, unwatched.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

log = logging.getLogger("moehome.launcher")

#: Set in the child's environment: the tray runs watched (and watches its watcher).
CHILD_ENV: Final = "MOEHOME_TRAY_WATCHED"
MOST_RESTARTS: Final = 5
WITHIN_S: Final = 600.0
PAUSE_S: Final = 2.0
#: What a crash ends with: a fatal signal (POSIX) ...
_CRASH_SIGNALS: Final = frozenset(
    getattr(signal, name)
    for name in ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")
    if hasattr(signal, name)
)
#: ... or a Windows exception code (0xC0000005, an access violation; abort() gives 3)
_WINDOWS_EXCEPTION: Final = 0xC0000000


def crashed(returncode: int) -> bool:
    """Whether a tray that ended with ``returncode`` crashed (rather than quit, or was
    told to: SIGTERM, SIGINT, SIGKILL are someone's wish)."""
    if returncode < 0:
        return -returncode in _CRASH_SIGNALS
    if sys.platform == "win32":
        return returncode >= _WINDOWS_EXCEPTION or returncode == 3
    return returncode == 128 + signal.SIGABRT  # a shell's way of saying it


def watch(
    argv: Sequence[str],
    *,
    again: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    most: int = MOST_RESTARTS,
    within_s: float = WITHIN_S,
    pause_s: float = PAUSE_S,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``argv`` until it ends without crashing; after a crash run ``again`` (the same
    command without what only the first start should do, like an invite). Returns the
    child's exit code (128 + the signal that ended it)."""
    child: list[subprocess.Popen[bytes]] = []

    def pass_on(signum: int, _frame: object) -> None:
        if child and child[-1].poll() is None:
            child[-1].send_signal(signum)

    passed = [getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n)]
    before = {signum: signal.signal(signum, pass_on) for signum in passed}
    try:
        crashes: list[float] = []
        command = list(argv)
        while True:
            child[:] = [subprocess.Popen(command, env=env)]
            code = child[0].wait()
            if not crashed(code):
                return code if code >= 0 else 128 - code
            now = clock()
            crashes = [t for t in crashes if now - t < within_s] + [now]
            if len(crashes) > most:
                log.error("the tray crashed %d times in %.0f s: not started again", most, within_s)
                return code if code >= 0 else 128 - code
            log.warning("the tray crashed (exit %d): starting it again in %.0f s", code, pause_s)
            time.sleep(pause_s)
            command = list(again if again is not None else argv)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def child_command() -> list[str]:
    """The tray itself: this bundle's executable, or ``python -m app.main``."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "app.main"]


#: Options that make the tray do one thing and exit: not worth watching.
_ONE_SHOT: Final = ("--selftest", "--version", "--install-desktop-entry", "-h", "--help")


def _is_invite(arg: str) -> bool:
    return arg.startswith("moehome:") or re.fullmatch(r"[0-9a-f]{32}", arg) is not None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(CHILD_ENV) or any(a in _ONE_SHOT for a in args):
        from app.main import main as tray_main  # the tray itself (Qt)

        return tray_main(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # an invite is handed over once, not again after a crash
    again = [a for a in args if not _is_invite(a)]
    env = {**os.environ, CHILD_ENV: str(os.getpid())}
    return watch(child_command() + args, again=child_command() + again, env=env)


if __name__ == "__main__":
    sys.exit(main())
