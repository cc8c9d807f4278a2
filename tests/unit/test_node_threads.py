"""A volunteer without a GPU caps the processor threads the node computes with; taking the
cap away gives the node its default again."""

from __future__ import annotations

import torch

from core.control.preferences import Preferences
from core.node.node import Node, NodeOptions
from core.node.probes import FakeProbes
from net import Identity


def test_the_thread_cap_applies_and_is_undone(tmp_path):
    before = torch.get_num_threads()
    node = Node(
        Identity.generate(),
        NodeOptions(data_dir=tmp_path / "data", config_dir=tmp_path / "config"),
        probes=FakeProbes(),
    )
    try:
        node._use_threads(Preferences(cpu_threads=1))
        assert torch.get_num_threads() == 1
        node._use_threads(Preferences())
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
