"""Entry point of the tray app (``moehome-tray``).

The tray is a client of the node's control API only: it never imports torch, trio or
libp2p (tests/test_architecture.py checks this). Until the node's control API exists it
shows the icon, the version and a Quit action.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QApplication, QMenu, QSystemTrayIcon

log = logging.getLogger(__name__)

ICON_PATH = Path(__file__).resolve().parent.parent / "assets" / "icons" / "moehome.svg"


def _version() -> str:
    try:
        return version("moehome")
    except PackageNotFoundError:
        return "0+unknown"


def build_tray(app: QApplication) -> QSystemTrayIcon:
    icon = QIcon(str(ICON_PATH))
    if icon.isNull():
        raise RuntimeError(f"tray icon missing or unreadable: {ICON_PATH}")
    app.setWindowIcon(icon)
    tray = QSystemTrayIcon(icon, app)
    tray.setObjectName("tray")
    tray.setToolTip(f"moehome {_version()}")
    menu = QMenu()
    menu.setObjectName("trayMenu")
    status = QAction(f"moehome {_version()}: the node is not connected yet", menu)
    status.setObjectName("statusAction")
    status.setEnabled(False)
    menu.addAction(status)
    menu.addSeparator()
    quit_action = QAction("Quit", menu)
    quit_action.setObjectName("quitAction")
    quit_action.triggered.connect(app.quit)
    menu.addAction(quit_action)
    tray.setContextMenu(menu)
    tray.setProperty("menu_ref", menu)  # the tray does not own its menu; keep it alive
    return tray


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moehome-tray", description="moehome tray app")
    parser.add_argument("--selftest", action="store_true", help="build the tray, check it, exit")
    args = parser.parse_args(argv)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("moehome")
    app.setQuitOnLastWindowClosed(False)
    tray = build_tray(app)
    if args.selftest:
        ok = not tray.icon().isNull() and tray.contextMenu() is not None
        sys.stdout.write(f"tray selftest: {'ok' if ok else 'FAILED'}\n")
        return 0 if ok else 1
    tray.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
