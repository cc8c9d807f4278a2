"""Weight files are the same bytes for the same weights: their chunks are addressed by
content, so any other byte made every publish of unchanged weights a new set of chunks."""

from __future__ import annotations

from pathlib import Path

import torch

from core.experts.registry import ExpertSpec, build_expert
from core.experts.weights import load_weights, save_weights


def test_equal_weights_make_equal_files(tmp_path: Path) -> None:
    module = build_expert(ExpertSpec("ffn", hidden=8, inner=16), seed=3)
    files = set()
    for i in range(12):  # safetensors' metadata order changed from one save to the next
        path = tmp_path / f"{i}.safetensors"
        save_weights(module, path, version=7)
        files.add(path.read_bytes())
    assert len(files) == 1
    copy = build_expert(ExpertSpec("ffn", hidden=8, inner=16), seed=4)
    info = load_weights(copy, tmp_path / "0.safetensors")
    assert info.version == 7
    assert all(
        torch.equal(a, b)
        for a, b in zip(copy.state_dict().values(), module.state_dict().values(), strict=True)
    )
