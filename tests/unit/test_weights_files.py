"""Weight files are the same bytes for the same weights: their chunks are addressed by
content, so any other byte made every publish of unchanged weights a new set of chunks."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

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


def test_a_module_whose_head_is_its_embedding_saves_and_loads(tmp_path):
    """A tied output head (Mixtral with tie_word_embeddings) shares the embedding's
    memory; safetensors refused such a pair, so the shared trunk of a tied project could
    not be published."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    source, target = Tied(), Tied()
    save_weights(source, tmp_path / "tied.safetensors", version=2)
    load_weights(target, tmp_path / "tied.safetensors")
    assert torch.equal(target.embed.weight, source.embed.weight)
    assert target.head.weight is target.embed.weight
