"""Linux: idle time from X11's XScreenSaver extension when a display is there, else from
systemd-logind (no user session at all means nobody to disturb)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess

from core.node.probes.base import PortableProbes

log = logging.getLogger(__name__)


class _XScreenSaverInfo(ctypes.Structure):
    _fields_ = [
        ("window", ctypes.c_ulong),
        ("state", ctypes.c_int),
        ("kind", ctypes.c_int),
        ("til_or_since", ctypes.c_ulong),
        ("idle", ctypes.c_ulong),
        ("eventMask", ctypes.c_ulong),
    ]


class LinuxProbes(PortableProbes):
    def __init__(self) -> None:
        super().__init__()
        self._x11 = self._open_x11()

    def _open_x11(self) -> tuple[ctypes.CDLL, ctypes.CDLL, int] | None:
        if not os.environ.get("DISPLAY"):
            return None
        xlib_name, xss_name = ctypes.util.find_library("X11"), ctypes.util.find_library("Xss")
        if not xlib_name or not xss_name:
            return None
        try:
            xlib, xss = ctypes.CDLL(xlib_name), ctypes.CDLL(xss_name)
            xlib.XOpenDisplay.restype = ctypes.c_void_p
            display = xlib.XOpenDisplay(None)
            if not display:
                return None
            xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(_XScreenSaverInfo)
            return xlib, xss, display
        except OSError as exc:
            log.debug("X11 idle probe unavailable: %s", exc)
            return None

    def idle_seconds(self) -> float | None:
        if self._x11 is not None:
            xlib, xss, display = self._x11
            info = xss.XScreenSaverAllocInfo()
            xlib.XDefaultRootWindow.restype = ctypes.c_ulong
            root = xlib.XDefaultRootWindow(ctypes.c_void_p(display))
            xss.XScreenSaverQueryInfo(ctypes.c_void_p(display), ctypes.c_ulong(root), info)
            idle_ms = info.contents.idle
            xlib.XFree(info)
            return float(idle_ms) / 1000.0
        return _logind_idle()


def _logind_idle() -> float | None:
    """Idle time of the graphical session from logind, or None without sessions/logind."""
    try:
        out = subprocess.run(
            ["loginctl", "show-session", "auto", "-p", "IdleHint", "-p", "IdleSinceHintMonotonic"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    if values.get("IdleHint") != "yes":
        return 0.0
    since_us = int(values.get("IdleSinceHintMonotonic", "0") or 0)
    if not since_us:
        return None
    now_us = int(open("/proc/uptime").read().split()[0].replace(".", "")) * 10_000  # noqa: SIM115
    return max(0.0, (now_us - since_us) / 1e6)
