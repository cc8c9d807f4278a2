"""The GPU tier: runs where torch sees a CUDA device, skips with the reason elsewhere
(CI has no GPU: these run on a lent GPU machine, see tests/gpu/README.md)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if item.nodeid.startswith("tests/gpu/"):
            item.add_marker(skip)
