"""What the throttle needs to know about the machine, behind one interface: a backend per
OS (``linux``, ``windows``, ``macos``) and a fake for tests (``FakeProbes``).

``probe_for_this_os()`` picks the backend."""

from __future__ import annotations

import sys

from core.node.probes.base import Probes, Reading
from core.node.probes.fake import FakeProbes, FileProbes


def probe_for_this_os() -> Probes:
    if sys.platform.startswith("linux"):
        from core.node.probes.linux import LinuxProbes

        return LinuxProbes()
    if sys.platform == "win32":
        from core.node.probes.windows import WindowsProbes

        return WindowsProbes()
    if sys.platform == "darwin":
        from core.node.probes.macos import MacProbes

        return MacProbes()
    from core.node.probes.base import PortableProbes

    return PortableProbes()


__all__ = ["FakeProbes", "FileProbes", "Probes", "Reading", "probe_for_this_os"]
