"""Which NVIDIA GPUs this computer has, whatever the installed torch can do with them: the
node warns when one is there but torch cannot compute on it (core/node/compute_device.py).
NVML names them; without NVML's library (some containers), the driver's /proc files do;
without the driver, the PCI bus still says that one is there."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: NVIDIA's PCI vendor id, and the PCI class of display controllers (VGA and 3D: a GPU's
#: audio function is a multimedia device, 0x04, and is not counted)
NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS = "0x03"
#: What a GPU seen only on the PCI bus is called (its name comes with the driver).
UNNAMED = "an NVIDIA GPU"


@dataclass(frozen=True)
class NvidiaGpus:
    #: The NVIDIA GPUs found, by name ("NVIDIA GeForce RTX 3060"; UNNAMED for one only
    #: the PCI bus shows).
    names: tuple[str, ...] = ()
    #: Whether the NVIDIA driver answers (NVML or /proc/driver/nvidia): without it, no
    #: torch computes on them.
    driver: bool = False


class GpuPresence(Protocol):
    def nvidia(self) -> NvidiaGpus: ...


class SystemGpus:
    """This computer's NVIDIA GPUs. ``root`` (the file system's) and ``nvml`` (names from
    NVML) are for tests: a fake tree, and no NVML."""

    def __init__(
        self, root: Path = Path("/"), nvml: Callable[[], tuple[str, ...]] | None = None
    ) -> None:
        self.root = root
        self._nvml = nvml or _nvml_names

    def nvidia(self) -> NvidiaGpus:
        names = self._nvml()
        if not names:
            names = _proc_names(self.root / "proc" / "driver" / "nvidia" / "gpus")
        if names:
            return NvidiaGpus(names, driver=True)
        count = _pci_count(self.root / "sys" / "bus" / "pci" / "devices")
        return NvidiaGpus((UNNAMED,) * count, driver=False)


class FakeGpus:
    """GPUs a test says are there."""

    def __init__(self, found: NvidiaGpus | None = None) -> None:
        self.found = found or NvidiaGpus()

    def nvidia(self) -> NvidiaGpus:
        return self.found


def _nvml_names() -> tuple[str, ...]:
    nvml: Any
    try:
        import pynvml

        nvml = pynvml
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVIDIA driver (or no NVML) is a normal case
        log.debug("NVML unavailable: %s", exc)
        return ()
    try:
        names = []
        for i in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
            # bytes from nvidia-ml-py before 11.5, str since
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return tuple(names)
    except Exception as exc:  # noqa: BLE001 - a driver hiccup: the other sources may say
        log.info("NVML could not list the GPUs: %s", exc)
        return ()
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - NVML keeps a count of inits; nothing to do
            log.debug("NVML shutdown: %s", exc)


def _proc_names(gpus: Path) -> tuple[str, ...]:
    """From /proc/driver/nvidia/gpus/<bus id>/information ("Model:  NVIDIA GeForce ...")."""
    try:
        folders = sorted(gpus.iterdir())
    except OSError:
        return ()
    names = []
    for folder in folders:
        model = UNNAMED
        try:
            for line in (folder / "information").read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model" and value.strip():
                    model = value.strip()
                    break
        except OSError:
            pass
        names.append(model)
    return tuple(names)


def _pci_count(devices: Path) -> int:
    """NVIDIA display controllers on the PCI bus (Linux's sysfs), with or without a driver."""
    try:
        entries = list(devices.iterdir())
    except OSError:
        return 0
    count = 0
    for device in entries:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            kind = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and kind.startswith(DISPLAY_CLASS):
            count += 1
    return count
