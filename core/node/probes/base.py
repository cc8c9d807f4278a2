"""The probe interface and the parts every OS shares (psutil; NVML when present)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """One look at the machine. None: this probe has nothing to say here."""

    idle_seconds: float | None = None
    gpu_temp_c: float | None = None
    gpu_utilization: float | None = None  # 0..1
    gpu_power_w: float | None = None
    cpu_temp_c: float | None = None
    on_battery: bool | None = None
    processes: frozenset[str] = field(default_factory=frozenset)


class Probes(Protocol):
    def read(self) -> Reading: ...


class Nvml:
    """GPU temperature, utilization and power through NVML (nvidia-ml-py), if present."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception as exc:  # noqa: BLE001 - no NVIDIA driver is a normal case
            log.debug("NVML unavailable: %s", exc)
            self._nvml = None

    def read(self) -> tuple[float | None, float | None, float | None]:
        if self._nvml is None or not self._handles:
            return None, None, None
        nv = self._nvml
        try:
            temps = [nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) for h in self._handles]
            utils = [nv.nvmlDeviceGetUtilizationRates(h).gpu / 100 for h in self._handles]
            power = [nv.nvmlDeviceGetPowerUsage(h) / 1000 for h in self._handles]
        except Exception as exc:  # noqa: BLE001 - a driver hiccup must not stop the node
            log.info("NVML read failed: %s", exc)
            return None, None, None
        return float(max(temps)), float(max(utils)), float(sum(power))


class PortableProbes:
    """What psutil and NVML tell on any OS; idle time is unknown (None)."""

    def __init__(self) -> None:
        self._nvml = Nvml()

    def idle_seconds(self) -> float | None:
        return None

    def read(self) -> Reading:
        gpu_temp, gpu_util, gpu_power = self._nvml.read()
        return Reading(
            idle_seconds=self.idle_seconds(),
            gpu_temp_c=gpu_temp,
            gpu_utilization=gpu_util,
            gpu_power_w=gpu_power,
            cpu_temp_c=_cpu_temp(),
            on_battery=_on_battery(),
            processes=_process_names(),
        )


def _cpu_temp() -> float | None:
    sensors = getattr(psutil, "sensors_temperatures", None)
    if sensors is None:
        return None
    try:
        readings = sensors()
    except (OSError, RuntimeError):
        return None
    temps = [
        t.current
        for name in ("coretemp", "k10temp", "cpu_thermal", "acpitz")
        for t in readings.get(name, [])
    ]
    return max(temps) if temps else None


def _on_battery() -> bool | None:
    try:
        battery = psutil.sensors_battery()
    except (OSError, RuntimeError, AttributeError):
        return None
    return None if battery is None else not battery.power_plugged


def _process_names() -> frozenset[str]:
    names = set()
    for proc in psutil.process_iter(["name"]):
        name = proc.info.get("name")
        if name:
            names.add(name.lower())
    return frozenset(names)
