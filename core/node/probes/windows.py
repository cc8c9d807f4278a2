"""Windows: idle time from GetLastInputInfo."""

from __future__ import annotations

import ctypes

from core.node.probes.base import PortableProbes


class _LastInputInfo(ctypes.Structure):
    _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]


class WindowsProbes(PortableProbes):
    def idle_seconds(self) -> float | None:
        windll = getattr(ctypes, "windll", None)
        if windll is None:
            return None
        info = _LastInputInfo()
        info.cbSize = ctypes.sizeof(info)
        if not windll.user32.GetLastInputInfo(ctypes.byref(info)):
            return None
        return float((windll.kernel32.GetTickCount() - info.dwTime) / 1000.0)
