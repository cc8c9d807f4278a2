"""Linux: idle time from X11's XScreenSaver extension when an X11 session is there, else from
the desktop over D-Bus (Wayland GNOME, KDE), else from systemd-logind (no user session at all
means nobody to disturb). GPUs: NVML and the amdgpu sysfs (see ``base``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Sequence

from core.node.probes.base import GpuReader, PortableProbes, command_output
from core.node.probes.dbus_idle import DbusIdle

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


_X11 = tuple[ctypes.CDLL, ctypes.CDLL, int]


class LinuxProbes(PortableProbes):
    def __init__(
        self,
        *,
        dbus_address: str | None = None,
        gpu_readers: Sequence[GpuReader] | None = None,
    ) -> None:
        """``dbus_address``: the session bus (default: ``DBUS_SESSION_BUS_ADDRESS``)."""
        super().__init__(gpu_readers)
        self._x11 = _open_x11()
        self._dbus = DbusIdle(dbus_address)

    def idle_seconds(self) -> float | None:
        if self._x11 is not None:
            idle = _x11_idle(self._x11)
            if idle is not None:
                return idle
        idle = self._dbus.idle_seconds()
        if idle is not None:
            return idle
        return _logind_idle()

    def close(self) -> None:
        self._dbus.close()


def _open_x11() -> _X11 | None:
    if not os.environ.get("DISPLAY"):
        return None
    # Under Wayland, DISPLAY is XWayland's, whose idle counter only sees input to X11
    # windows: it would call a user typing in a Wayland window idle.
    if os.environ.get("WAYLAND_DISPLAY") or os.environ.get("XDG_SESSION_TYPE") == "wayland":
        return None
    xlib_name, xss_name = ctypes.util.find_library("X11"), ctypes.util.find_library("Xss")
    if not xlib_name or not xss_name:
        return None
    try:
        xlib, xss = ctypes.CDLL(xlib_name), ctypes.CDLL(xss_name)
        xlib.XOpenDisplay.restype = ctypes.c_void_p
        xlib.XDefaultRootWindow.restype = ctypes.c_ulong
        display = xlib.XOpenDisplay(None)
        if not display:
            return None
        xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(_XScreenSaverInfo)
        return xlib, xss, display
    except (OSError, AttributeError) as exc:
        log.debug("X11 idle probe unavailable: %s", exc)
        return None


def _x11_idle(x11: _X11) -> float | None:
    xlib, xss, display = x11
    info = xss.XScreenSaverAllocInfo()
    if not info:
        return None
    try:
        root = xlib.XDefaultRootWindow(ctypes.c_void_p(display))
        if not xss.XScreenSaverQueryInfo(ctypes.c_void_p(display), ctypes.c_ulong(root), info):
            return None
        return float(info.contents.idle) / 1000.0
    finally:
        xlib.XFree(info)


def _logind_idle() -> float | None:
    """Idle time of the graphical session from logind, or None without sessions/logind."""
    out = command_output(
        ["loginctl", "show-session", "auto", "-p", "IdleHint", "-p", "IdleSinceHintMonotonic"]
    )
    if out is None:
        return None
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if values.get("IdleHint") != "yes":
        return 0.0
    try:
        since_us = int(values.get("IdleSinceHintMonotonic", "0") or 0)
    except ValueError:
        return None
    if not since_us:
        return None
    # logind stamps CLOCK_MONOTONIC, which time.monotonic() reads on Linux (/proc/uptime
    # would count suspended time too).
    now_us = time.monotonic_ns() // 1000
    return max(0.0, (now_us - since_us) / 1e6)
