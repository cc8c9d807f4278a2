"""AMD GPUs on Linux: temperature, utilization and power from the amdgpu driver's sysfs files
(no library needed)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

# Sensors that describe the GPU die itself (others: "mem" for VRAM).
_GPU_TEMP_LABELS = frozenset({"edge", "junction"})


class AmdSysfs:
    """GPU temperature (°C, hottest GPU), utilization (0..1, busiest GPU) and power (W, all
    GPUs) of every amdgpu device under ``root`` (``/sys``; a fake tree in tests)."""

    def __init__(self, root: str | Path = "/sys") -> None:
        self._devices = _amdgpu_devices(Path(root))
        log.debug("amdgpu devices: %s", [str(d) for d in self._devices])

    def read(self) -> tuple[float | None, float | None, float | None]:
        temps: list[float] = []
        utils: list[float] = []
        powers: list[float] = []
        for device in self._devices:
            # Reading the sensors of a runtime-suspended GPU wakes it up (or fails) on some
            # kernels; a sleeping GPU is cold, idle and draws next to nothing anyway.
            if _read_text(device / "power" / "runtime_status") == "suspended":
                continue
            hwmons = sorted(device.glob("hwmon/hwmon*"))
            temp = _max_or_none(t for h in hwmons if (t := _gpu_temp(h)) is not None)
            if temp is not None:
                temps.append(temp)
            busy = _read_int(device / "gpu_busy_percent")
            if busy is not None:
                utils.append(min(max(busy / 100, 0.0), 1.0))
            power = _sum_or_none(p for h in hwmons if (p := _power_w(h)) is not None)
            if power is not None:
                powers.append(power)
        return _max_or_none(temps), _max_or_none(utils), _sum_or_none(powers)


def _amdgpu_devices(root: Path) -> list[Path]:
    devices: dict[Path, Path] = {}
    drm = root / "class" / "drm"
    try:
        cards = sorted(drm.iterdir())
    except OSError:
        return []
    for card in cards:
        # card0, card1...; not the connectors (card0-DP-1) nor the render nodes.
        if not re.fullmatch(r"card\d+", card.name):
            continue
        device = card / "device"
        try:
            if (device / "driver").resolve().name != "amdgpu":
                continue
            devices.setdefault(device.resolve(), device)
        except OSError:
            continue
    return list(devices.values())


def _gpu_temp(hwmon: Path) -> float | None:
    labelled = [
        t
        for label_file in hwmon.glob("temp*_label")
        if _read_text(label_file) in _GPU_TEMP_LABELS
        and (t := _read_int(hwmon / label_file.name.replace("_label", "_input"))) is not None
    ]
    millidegrees = max(labelled) if labelled else _read_int(hwmon / "temp1_input")
    return None if millidegrees is None else millidegrees / 1000


def _power_w(hwmon: Path) -> float | None:
    # power1_average on most GPUs; newer ones (RDNA3) only have power1_input.
    for name in ("power1_average", "power1_input"):
        microwatts = _read_int(hwmon / name)
        if microwatts is not None:
            return microwatts / 1e6
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _max_or_none(values: Iterable[float]) -> float | None:
    found = list(values)
    return max(found) if found else None


def _sum_or_none(values: Iterable[float]) -> float | None:
    found = list(values)
    return sum(found) if found else None
