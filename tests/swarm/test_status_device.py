"""The device line travels from the node through the control API (real HTTP on 127.0.0.1)
to `moehome status`: the GPU's name where torch computes on it, "CPU" elsewhere, and the
warning when a GPU is there that torch cannot use."""

from __future__ import annotations

import pytest
import trio
from typer.testing import CliRunner

from core.cli import app
from core.control import find_node
from core.node.compute_device import Machine, TorchDevices
from core.node.control_server import serve_control
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from core.node.probes.gpus import NvidiaGpus
from net import Identity

RTX = "NVIDIA GeForce RTX 3060"
CPU_TORCH = TorchDevices(version="2.13.0+cpu")


@pytest.mark.parametrize(
    ("machine", "says", "warning"),
    [
        (Machine(CPU_TORCH, NvidiaGpus()), "CPU", ""),
        (
            Machine(TorchDevices(cuda=(RTX,), cuda_build="12.8"), NvidiaGpus((RTX,), True)),
            f"{RTX} (CUDA)",
            "",
        ),
        (
            Machine(CPU_TORCH, NvidiaGpus((RTX,), True)),
            "CPU",
            f"your GPU is not used: install the GPU build ({RTX} found;",
        ),
    ],
)
async def test_moehome_status_says_the_device(tmp_path, machine, says, warning):
    data = tmp_path / "data"
    node = Node(
        Identity.generate(),
        NodeOptions(data_dir=data, config_dir=tmp_path / "config"),
        probes=FakeProbes(),
        machine=machine,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, node, data)
        client = find_node(data)
        try:
            device = (await trio.to_thread.run_sync(client.status)).device
        finally:
            client.close()
        result = await trio.to_thread.run_sync(
            lambda: CliRunner().invoke(app, ["--data-dir", str(data), "status"])
        )
        nursery.cancel_scope.cancel()
    assert device.computes_on == says
    assert device.warning.startswith(warning)
    assert bool(device.warning) == bool(warning)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"computing on: {says}" in lines
    warned = [line for line in lines if line.startswith("  warning: ")]
    assert warned == ([f"  warning: {device.warning}"] if warning else [])
