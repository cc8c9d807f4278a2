"""macOS: idle time from IOKit's HIDIdleTime (via ioreg)."""

from __future__ import annotations

import re
import subprocess

from core.node.probes.base import PortableProbes


class MacProbes(PortableProbes):
    def idle_seconds(self) -> float | None:
        try:
            out = subprocess.run(
                ["ioreg", "-c", "IOHIDSystem"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r'"HIDIdleTime" = (\d+)', out.stdout)
        return int(match.group(1)) / 1e9 if match else None
