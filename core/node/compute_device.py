"""Which device the node computes on, said for the volunteer: the GPU's name, "Apple GPU
(MPS)" or "CPU", with a warning when an NVIDIA GPU is there but the installed torch cannot
use it (the CPU build, no driver, a driver too old for the build), rather than quietly
computing on the CPU. One pure decision (``decide``) from what torch and the machine say;
``this_machine()`` asks them once (neither changes while the node runs). The device plan
(core/node/capacity.py) computes on what ``decide`` chooses."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from core.node.probes.gpus import GpuPresence, NvidiaGpus, SystemGpus

#: What the volunteer allows (Preferences.gpus): GPU indexes, or all of them.
Allowed = Sequence[int] | Literal["all"]

#: The advice when the installed torch has no CUDA (README: `make setup TORCH=cu128`, or
#: the GPU bundle: installer/README.md).
GPU_BUILD = "install the GPU build"


@dataclass(frozen=True)
class TorchDevices:
    """What the installed torch can compute on."""

    #: Names of the GPUs torch.cuda sees, by index (AMD ones on a ROCm build).
    cuda: tuple[str, ...] = ()
    mps: bool = False
    #: The CUDA version the build is for (torch.version.cuda); None: a build without CUDA.
    cuda_build: str | None = None
    #: A ROCm build (torch.version.hip): torch.cuda's GPUs are AMD's.
    rocm: bool = False
    version: str = ""


@dataclass(frozen=True)
class Machine:
    torch: TorchDevices
    nvidia: NvidiaGpus


@dataclass(frozen=True)
class ComputeDevice:
    #: torch's name of it: "cuda:N", "mps" or "cpu".
    device: str
    #: In words: "NVIDIA GeForce RTX 3060 (CUDA)", "Apple GPU (MPS)", "CPU".
    line: str
    #: Why a GPU that is there is not used, and what to do; "" when none is left unused.
    warning: str = ""


def choose(seen: TorchDevices, allowed: Allowed) -> str:
    """The first GPU the volunteer allows that torch can use (Apple's is GPU 0), else the
    CPU."""
    indexes = range(len(seen.cuda)) if allowed == "all" else [i for i in allowed if i >= 0]
    usable = [i for i in indexes if i < len(seen.cuda)]
    if usable:
        return f"cuda:{usable[0]}"
    if seen.mps and (allowed == "all" or 0 in allowed):
        return "mps"
    return "cpu"


def describe(machine: Machine, device: str) -> ComputeDevice:
    """``device`` in words, with the warning when an NVIDIA GPU is there that torch cannot
    use (one that the volunteer turned off in the limits, torch could use: no warning)."""
    seen = machine.torch
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        name = seen.cuda[index] if index < len(seen.cuda) else device
        return ComputeDevice(device, f"{name} ({'ROCm' if seen.rocm else 'CUDA'})")
    if device == "mps":
        return ComputeDevice(device, "Apple GPU (MPS)")
    return ComputeDevice(device, "CPU", unused_gpu_warning(machine))


def decide(machine: Machine, allowed: Allowed) -> ComputeDevice:
    return describe(machine, choose(machine.torch, allowed))


def unused_gpu_warning(machine: Machine) -> str:
    """ "" unless an NVIDIA GPU is there and torch sees no GPU at all."""
    seen, nvidia = machine.torch, machine.nvidia
    if not nvidia.names or seen.cuda:
        return ""
    found = ", ".join(dict.fromkeys(nvidia.names))  # two of the same card: named once
    this_torch = f"this torch {seen.version}".rstrip()
    if seen.cuda_build is None:
        needs = "the NVIDIA driver and the GPU build" if not nvidia.driver else "the GPU build"
        why = f"{this_torch} computes on the CPU only"
        return f"your GPU is not used: install {needs} ({found} found; {why})"
    if not nvidia.driver:
        return (
            f"your GPU is not used: install the NVIDIA driver ({found} found; "
            f"{this_torch} is built for CUDA {seen.cuda_build})"
        )
    return (
        f"your GPU is not used: {this_torch} (CUDA {seen.cuda_build}) cannot reach it: "
        f"update the NVIDIA driver, or check CUDA_VISIBLE_DEVICES ({found} found)"
    )


def read_torch() -> TorchDevices:
    """What the installed torch sees (it initializes CUDA when there is some)."""
    cuda = (
        tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        if torch.cuda.is_available()
        else ()
    )
    mps = getattr(torch.backends, "mps", None)
    return TorchDevices(
        cuda=cuda,
        mps=bool(mps is not None and mps.is_available()),
        cuda_build=torch.version.cuda,
        rocm=getattr(torch.version, "hip", None) is not None,
        version=torch.__version__,
    )


def read_machine(gpus: GpuPresence) -> Machine:
    return Machine(read_torch(), gpus.nvidia())


@functools.cache
def this_machine() -> Machine:
    """This computer, asked once per process."""
    return read_machine(SystemGpus())
