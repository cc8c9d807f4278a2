"""On a machine whose torch computes on an NVIDIA GPU, the device line names that GPU (as
torch and NVML both name it) with no warning; the same GPU hidden from torch is warned of."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from core.node.compute_device import decide, this_machine


def test_the_device_line_names_the_gpu_torch_computes_on():
    machine = this_machine()
    compute = decide(machine, "all")
    name = torch.cuda.get_device_name(0)
    assert (compute.device, compute.line, compute.warning) == ("cuda:0", f"{name} (CUDA)", "")
    # NVML (nvidia-ml-py, a dependency), or the driver's files, see the same card
    assert machine.nvidia.driver
    assert name in machine.nvidia.names


def test_a_gpu_that_torch_cannot_reach_is_warned_of():
    script = (
        "from core.node.compute_device import decide, this_machine\n"
        "compute = decide(this_machine(), 'all')\n"
        "print(compute.line); print(compute.warning)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line, warning = done.stdout.splitlines()[-2:]
    assert line == "CPU"
    assert warning.startswith("your GPU is not used: ")
    assert torch.cuda.get_device_name(0) in warning
