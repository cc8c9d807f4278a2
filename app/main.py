"""Entry point of the tray app (``moehome-tray``).

The tray is a client of the node's control API only: it never imports torch, trio or
libp2p (tests/unit/test_architecture.py checks the imports, tests/processes/test_light_commands.py
what a real process loads). It starts the node as a child process
and keeps it running (app/supervisor.py); a crash of the node never takes the tray down.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import shlex
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.desktop_entry import install_desktop_entry
from app.icons import assets_dir, state_icon
from app.launcher import CHILD_ENV
from app.link import NodeLink
from app.single_instance import SHOW, SingleInstance
from app.supervisor import NodeSupervisor, node_command
from app.tray import Tray, settings_at
from app.url_handler import InviteLinkFilter, register_windows_protocol
from core.control import ControlError, find_node
from core.logs import rotate_log
from core.paths import config_dir, data_dir

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return version("moehome")
    except PackageNotFoundError:
        return "0+unknown"


def tray_command() -> list[str]:
    """How the login item, the desktop entry and moehome:// links start the tray: through
    its launcher, which starts it again after a crash (app/launcher.py)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "app.launcher"]


def _node_answers() -> bool:
    try:
        client = find_node(data_dir())
    except ControlError:
        return False
    try:
        client.status()
        return True
    except ControlError:
        return False
    finally:
        client.close()


def _quit_on_signals(tray: Tray) -> None:
    """SIGTERM (logout, a service manager) and Ctrl-C quit like the menu's Quit, so the
    node we started is stopped too. Qt's loop runs C++ code; a timer gives Python a
    moment now and then to run its signal handlers."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: QTimer.singleShot(0, tray.quit))
    heartbeat = QTimer(tray)
    heartbeat.timeout.connect(lambda: None)
    heartbeat.start(500)


def _quit_when_unwatched(tray: Tray) -> None:
    """Run by the launcher (app/launcher.py): quit, and stop the node, when the launcher
    is gone (killed: nobody would start us again, nor stop us at logout)."""
    watcher = os.environ.get(CHILD_ENV, "")
    if not watcher.isdigit():
        return

    def check() -> None:
        if os.getppid() != int(watcher):
            log.warning("the launcher is gone: quitting")
            tray.quit()

    timer = QTimer(tray)
    timer.timeout.connect(check)
    timer.start(1000)


def _keep_crash_traces(path: Path) -> None:
    """A fatal error of Qt or Python (a segfault, ``none_dealloc``) kills the tray
    without a word: have Python write every thread's stack to ``path`` when it does, so
    the next start can point at it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(path, 2**20)
    try:
        stream = path.open("a")  # open for the program's life: the handler writes to it
    except OSError as exc:
        log.info("no crash traces: %s", exc)
        return
    faulthandler.enable(file=stream, all_threads=True)
    if _goes_nowhere(sys.stderr):
        # Python's own fatal errors (none_dealloc) are written to the standard error
        # stream, not to faulthandler's file: where nobody reads it (a desktop entry,
        # login), it goes to the same file
        try:
            os.dup2(stream.fileno(), 2)
        except OSError as exc:
            log.info("fatal errors not kept: %s", exc)


def _goes_nowhere(stream: object) -> bool:
    """Whether a stream is missing (pythonw) or the null device."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return os.path.samestat(os.fstat(fd), os.stat(os.devnull))
    except (AttributeError, OSError, ValueError):
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moehome-tray", description="moehome tray app")
    parser.add_argument("--selftest", action="store_true", help="build the tray, check it, exit")
    parser.add_argument("--version", action="version", version=f"moehome {_version()}")
    parser.add_argument(
        "--node-args", default="", help="extra arguments for `moehome node` (quoted as one)"
    )
    parser.add_argument(
        "--no-node", action="store_true", help="do not start a node; show the one running"
    )
    parser.add_argument("--no-wizard", action="store_true", help="skip the first-start wizard")
    parser.add_argument(
        "--install-desktop-entry",
        action="store_true",
        help="put moehome in this desktop's application menu (Linux) and exit",
    )
    parser.add_argument(
        "invite",
        nargs="?",
        default="",
        help="an invite (moehome://join/...) to look at; joining it takes a click",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.install_desktop_entry:
        path = install_desktop_entry(tray_command(), assets_dir() / "moehome.svg")
        sys.stdout.write(f"moehome is in the application menu: {path}\n")
        return 0
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    _keep_crash_traces(data_dir() / "tray-crash.log")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("moehome")
    app.setQuitOnLastWindowClosed(False)  # closing a window must not end the tray
    app.setWindowIcon(state_icon("working", ""))
    instance = SingleInstance(data_dir())
    if not args.selftest and not instance.claim():
        # one tray per user: hand the invite (or "show yourself") to the running one
        handed = instance.send(args.invite or SHOW)
        log.info("moehome is already running%s", "" if handed else ", but does not answer")
        return 0 if handed else 1
    link = NodeLink(data_dir())
    supervisor = (
        None
        if args.no_node
        else NodeSupervisor(
            node_command(shlex.split(args.node_args)),
            node_is_running=_node_answers,
            log_path=data_dir() / "node.log",
        )
    )
    tray = Tray(app, link, supervisor, settings_at(config_dir()), tray_command=tray_command())
    if args.selftest:
        ok = not tray.icon.icon().isNull() and tray.menu.actions() != []
        names = {a.objectName() for a in tray.menu.actions()}
        ok = ok and {"pauseAction", "resumeAction", "quitAction", "limitsAction"} <= names
        heavy = sorted({"torch", "trio", "libp2p"} & set(sys.modules))  # never in the tray
        if heavy:
            sys.stdout.write(f"tray selftest: loaded {', '.join(heavy)}\n")
        ok = ok and not heavy
        sys.stdout.write(f"tray selftest: {'ok' if ok else 'FAILED'}\n")
        return 0 if ok else 1
    if not QSystemTrayIcon.isSystemTrayAvailable():
        log.warning("no system tray on this desktop: opening the dashboard instead")
        tray.open_dashboard()
    tray.icon.show()
    if supervisor is not None:
        supervisor.start()
    link.start()
    instance.message.connect(tray.handle_message)
    # moehome:// links: macOS opens the running app with them; Windows starts the tray
    # with one (registered at each start: the bundle may have moved)
    link_filter = InviteLinkFilter(tray.handle_message)
    app.installEventFilter(link_filter)
    if sys.platform == "win32":
        try:
            register_windows_protocol(tray_command(), assets_dir() / "generated" / "moehome.ico")
        except OSError as exc:
            log.warning("moehome:// links are not registered: %s", exc)
    if not args.no_wizard:
        tray.first_start()
    if args.invite:
        tray.handle_message(args.invite)
    _quit_on_signals(tray)
    _quit_when_unwatched(tray)
    code = app.exec()
    link.stop()
    instance.release()
    return code


if __name__ == "__main__":
    sys.exit(main())
