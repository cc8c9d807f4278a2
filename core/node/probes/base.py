"""The probe interface and the parts every OS shares (psutil; NVML when present; the
amdgpu driver's sysfs on Linux)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from collections.abc import Sequence
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


# (temperature °C of the hottest GPU, utilization 0..1 of the busiest, power W of all)
GpuReading = tuple[float | None, float | None, float | None]


class GpuReader(Protocol):
    def read(self) -> GpuReading: ...


class Nvml:
    """GPU temperature, utilization and power through NVML (nvidia-ml-py), if present."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception as exc:  # noqa: BLE001 - no NVIDIA driver is a normal case
            log.debug("NVML unavailable: %s", exc)
            self._nvml = None

    def read(self) -> GpuReading:
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
    """What psutil and the GPU readers tell on any OS; idle time is unknown (None).

    ``gpu_readers`` defaults to NVML, plus the amdgpu sysfs reader on Linux."""

    def __init__(self, gpu_readers: Sequence[GpuReader] | None = None) -> None:
        self._gpus = list(gpu_readers) if gpu_readers is not None else default_gpu_readers()
        self._processes: frozenset[str] = frozenset()
        self._processes_at = -math.inf

    def idle_seconds(self) -> float | None:
        return None

    def read(self) -> Reading:
        gpu_temp, gpu_util, gpu_power = combine_gpu_readings(self._gpus)
        return Reading(
            idle_seconds=self.idle_seconds(),
            gpu_temp_c=gpu_temp,
            gpu_utilization=gpu_util,
            gpu_power_w=gpu_power,
            cpu_temp_c=_cpu_temp(),
            on_battery=_on_battery(),
            processes=self._process_names(),
        )

    def _process_names(self) -> frozenset[str]:
        """The running programs, listed at most every PROCESS_SCAN_S: the governor reads
        the probes four times a second, and listing every process that often cost a
        node more than its idle work (measured with py-spy in the demo)."""
        now = time.monotonic()
        if now - self._processes_at >= PROCESS_SCAN_S:
            self._processes, self._processes_at = _process_names(), now
        return self._processes


def default_gpu_readers() -> list[GpuReader]:
    readers: list[GpuReader] = [Nvml()]
    if sys.platform.startswith("linux"):
        from core.node.probes.amd import AmdSysfs

        readers.append(AmdSysfs())
    return readers


def combine_gpu_readings(readers: Sequence[GpuReader]) -> GpuReading:
    """The hottest temperature, the highest utilization and the summed power of whatever
    reported; None for what none did (a machine with an NVIDIA and an AMD GPU sees both)."""
    temps: list[float] = []
    utils: list[float] = []
    powers: list[float] = []
    for reader in readers:
        try:
            temp, util, power = reader.read()
        except Exception as exc:  # noqa: BLE001 - one broken reader must not stop the probes
            log.warning("GPU reader %s failed: %r", type(reader).__name__, exc)
            continue
        if temp is not None:
            temps.append(temp)
        if util is not None:
            utils.append(util)
        if power is not None:
            powers.append(power)
    return (
        max(temps) if temps else None,
        max(utils) if utils else None,
        sum(powers) if powers else None,
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


#: a program named in the exclusive apps pauses the node at most this long after it starts
PROCESS_SCAN_S = 2.0


def _process_names() -> frozenset[str]:
    names = set()
    for proc in psutil.process_iter(["name"]):
        name = proc.info.get("name")
        if name:
            names.add(name.lower())
    return frozenset(names)


def command_output(args: list[str], timeout: float = 2.0) -> str | None:
    """What a system tool prints, or None when it is missing, slow or fails: a probe
    that cannot answer says nothing rather than stopping the node."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None
