"""The device line: the GPU's name when torch computes on it, "CPU" when there is no GPU,
and "CPU" with a warning naming the GPU when one is there that torch cannot use; what the
machine has comes from NVML, the driver's /proc files or the PCI bus (fake trees here)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from core.node.compute_device import (
    GPU_BUILD,
    ComputeDevice,
    Machine,
    TorchDevices,
    decide,
    describe,
    read_machine,
)
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from core.node.probes.gpus import UNNAMED, FakeGpus, NvidiaGpus, SystemGpus
from core.node.status import NodeSnapshot, build_status
from net import Identity

RTX = "NVIDIA GeForce RTX 3060"
CPU_TORCH = TorchDevices(version="2.13.0+cpu")
CUDA_TORCH = TorchDevices(cuda=(RTX,), cuda_build="12.8", version="2.13.0+cu128")
TWO_GPUS = TorchDevices(cuda=(RTX, "NVIDIA RTX A4000"), cuda_build="12.8", version="2.13.0+cu128")
NO_GPU = NvidiaGpus()
ONE_RTX = NvidiaGpus((RTX,), driver=True)


@pytest.mark.parametrize(
    ("seen", "nvidia", "allowed", "device", "line", "warns"),
    [
        # no GPU anywhere: the CPU, nothing to say
        (CPU_TORCH, NO_GPU, "all", "cpu", "CPU", ""),
        # torch computes on the GPU: its name
        (CUDA_TORCH, ONE_RTX, "all", "cuda:0", f"{RTX} (CUDA)", ""),
        (
            TWO_GPUS,
            NvidiaGpus((RTX, "NVIDIA RTX A4000"), True),
            [1],
            "cuda:1",
            "NVIDIA RTX A4000 (CUDA)",
            "",
        ),
        # torch sees it, NVML does not (no nvidia-ml-py): torch's word is enough
        (CUDA_TORCH, NO_GPU, "all", "cuda:0", f"{RTX} (CUDA)", ""),
        # the volunteer turned the GPUs off: the CPU, by choice, without a warning
        (CUDA_TORCH, ONE_RTX, [], "cpu", "CPU", ""),
        (CUDA_TORCH, ONE_RTX, [3], "cpu", "CPU", ""),
        # the CPU build of torch on a GPU machine: said, with the GPU's name
        (CPU_TORCH, ONE_RTX, "all", "cpu", "CPU", f"{GPU_BUILD} ({RTX} found"),
        (CPU_TORCH, NvidiaGpus((RTX, RTX), True), "all", "cpu", "CPU", f"({RTX} found;"),
        # no driver either (the PCI bus shows the card): both to install
        (CPU_TORCH, NvidiaGpus((UNNAMED,), False), "all", "cpu", "CPU", "the NVIDIA driver and"),
        # a CUDA build that cannot reach the GPU: the driver is the problem
        (
            TorchDevices(cuda_build="12.8", version="2.13.0+cu128"),
            NvidiaGpus((UNNAMED,), False),
            "all",
            "cpu",
            "CPU",
            "install the NVIDIA driver",
        ),
        (
            TorchDevices(cuda_build="12.8", version="2.13.0+cu128"),
            ONE_RTX,
            "all",
            "cpu",
            "CPU",
            "update the NVIDIA driver",
        ),
        # Apple's GPU through MPS: GPU 0
        (TorchDevices(mps=True), NO_GPU, "all", "mps", "Apple GPU (MPS)", ""),
        (TorchDevices(mps=True), NO_GPU, [0], "mps", "Apple GPU (MPS)", ""),
        (TorchDevices(mps=True), NO_GPU, [], "cpu", "CPU", ""),
        # a ROCm build: AMD's GPUs come through torch.cuda
        (
            TorchDevices(cuda=("AMD Radeon RX 7900 XTX",), rocm=True),
            NO_GPU,
            "all",
            "cuda:0",
            "AMD Radeon RX 7900 XTX (ROCm)",
            "",
        ),
    ],
)
def test_the_device_line(seen, nvidia, allowed, device, line, warns):
    compute = decide(Machine(seen, nvidia), allowed)
    assert compute.device == device
    assert compute.line == line
    if warns:
        assert compute.warning.startswith("your GPU is not used: ")
        assert warns in compute.warning
        assert compute.warning.count(RTX) <= 1  # two of one card: named once
    else:
        assert compute.warning == ""


def test_the_cpu_build_on_a_gpu_machine_says_what_to_do():
    compute = decide(Machine(CPU_TORCH, ONE_RTX), "all")
    assert compute == ComputeDevice(
        "cpu",
        "CPU",
        "your GPU is not used: install the GPU build (NVIDIA GeForce RTX 3060 found; "
        "this torch 2.13.0+cpu computes on the CPU only)",
    )


def test_a_planned_device_is_described_as_decided():
    machine = Machine(TWO_GPUS, ONE_RTX)
    assert describe(machine, "cuda:1").line == "NVIDIA RTX A4000 (CUDA)"
    assert describe(machine, "cpu") == ComputeDevice("cpu", "CPU")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_driver_files_name_the_gpus_without_nvml(tmp_path):
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    _write(gpus / "0000:01:00.0" / "information", f"Model: \t\t {RTX}\nIRQ:   130\n")
    _write(gpus / "0000:02:00.0" / "information", "IRQ:   131\n")  # no model line
    found = SystemGpus(tmp_path, nvml=lambda: ()).nvidia()
    assert found == NvidiaGpus((RTX, UNNAMED), driver=True)


def test_nvml_names_come_first(tmp_path):
    found = SystemGpus(tmp_path, nvml=lambda: ("NVIDIA H100 80GB HBM3",)).nvidia()
    assert found == NvidiaGpus(("NVIDIA H100 80GB HBM3",), driver=True)


def test_without_a_driver_the_pci_bus_still_shows_the_gpu(tmp_path):
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    for address, vendor, kind in [
        ("0000:01:00.0", "0x10de", "0x030000"),  # an NVIDIA GPU (VGA)
        ("0000:01:00.1", "0x10de", "0x040300"),  # its audio function: not a GPU
        ("0000:00:02.0", "0x8086", "0x030000"),  # Intel graphics
    ]:
        _write(devices / address / "vendor", vendor + "\n")
        _write(devices / address / "class", kind + "\n")
    assert SystemGpus(tmp_path, nvml=lambda: ()).nvidia() == NvidiaGpus((UNNAMED,), False)


def test_a_machine_without_any_of_it_has_no_gpu(tmp_path):
    assert SystemGpus(tmp_path, nvml=lambda: ()).nvidia() == NO_GPU


def test_read_machine_asks_the_gpu_probe():
    machine = read_machine(FakeGpus(ONE_RTX))
    assert machine.nvidia == ONE_RTX
    assert machine.torch.version  # this torch, whichever it is


def test_the_status_carries_the_device_line():
    compute = decide(Machine(CPU_TORCH, ONE_RTX), "all")
    device = build_status(NodeSnapshot(compute=compute)).device
    assert (device.device, device.computes_on) == ("cpu", "CPU")
    assert device.warning == compute.warning
    assert build_status(NodeSnapshot()).device.computes_on == ""


def _node(tmp_path, machine: Machine) -> Node:
    return Node(
        Identity.generate(),
        NodeOptions(data_dir=tmp_path / "data", config_dir=tmp_path / "config"),
        probes=FakeProbes(),
        machine=machine,
    )


def test_the_node_follows_the_gpus_the_volunteer_allows(tmp_path):
    node = _node(tmp_path, Machine(CUDA_TORCH, ONE_RTX))
    assert node.status().device.computes_on == f"{RTX} (CUDA)"
    node.preferences.update({"gpus": []})
    assert node.status().device.computes_on == "CPU"
    assert node.status().device.warning == ""


def test_the_node_warns_at_start_of_a_gpu_it_cannot_use(tmp_path, caplog):
    node = _node(tmp_path, Machine(CPU_TORCH, ONE_RTX))
    with caplog.at_level(logging.INFO, logger="core.node.node"):
        node._say_device()
    [record] = [r for r in caplog.records if "computing on" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "computing on the CPU: your GPU is not used: install the GPU build" in (
        record.getMessage()
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="core.node.node"):
        _node(tmp_path, Machine(CPU_TORCH, NO_GPU))._say_device()
    [record] = [r for r in caplog.records if "computing on" in r.getMessage()]
    assert (record.levelno, record.getMessage()) == (logging.INFO, "computing on the CPU")
