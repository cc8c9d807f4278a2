"""macOS: idle time from IOKit's HIDIdleTime (via ioreg)."""

from __future__ import annotations

import re

from core.node.probes.base import PortableProbes, command_output


class MacProbes(PortableProbes):
    def idle_seconds(self) -> float | None:
        out = command_output(["ioreg", "-c", "IOHIDSystem"])
        match = re.search(r'"HIDIdleTime" = (\d+)', out) if out is not None else None
        return int(match.group(1)) / 1e9 if match else None
