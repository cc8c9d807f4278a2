"""Weight files are the same bytes for the same weights: their chunks are addressed by
content, so any other byte made every publish of unchanged weights a new set of chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save
from torch import nn

from core.experts.registry import ExpertSpec, build_expert
from core.experts.weights import (
    WeightsError,
    load_weights,
    load_weights_bytes,
    save_weights,
    weights_hash,
)


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


def test_fetched_bytes_load_in_memory_with_the_files_checks(tmp_path: Path) -> None:
    """A peer's file is read from its bytes (no temporary folder) and checked as a file
    on disk is: its version, its hash, its tensors; a malformed one is a WeightsError."""
    spec = ExpertSpec("ffn", hidden=8, inner=16)
    module = build_expert(spec, seed=3)
    info = save_weights(module, tmp_path / "w.safetensors", version=5)
    blob = (tmp_path / "w.safetensors").read_bytes()
    copy = build_expert(spec, seed=4)
    assert load_weights_bytes(copy, blob, expected_sha256=info.sha256) == info
    assert weights_hash(copy) == info.sha256
    with pytest.raises(WeightsError, match="does not match"):
        load_weights_bytes(copy, blob, expected_sha256="0" * 64)
    other = save(
        {"fc1.weight": torch.zeros(2, 2)}, metadata={"version": "1", "sha256": info.sha256}
    )
    with pytest.raises(WeightsError, match="do not match the expert"):
        load_weights_bytes(copy, other)
    size = int.from_bytes(blob[:8], "little")
    for bad in (
        b"",  # empty
        blob[:20],  # cut in its header
        blob[:-4],  # cut in its tensors
        (10**9).to_bytes(8, "little") + blob[8:],  # a header longer than the file
        blob[:8] + b"[" + blob[9 : 8 + size] + blob[8 + size :],  # a header not JSON
    ):
        with pytest.raises(WeightsError, match="cannot read fetched weights"):
            load_weights_bytes(build_expert(spec, seed=4), bad)
    bad_metadata = save(dict(module.state_dict()), metadata={"version": "seven"})
    with pytest.raises(WeightsError, match="version metadata is not an integer"):
        load_weights_bytes(build_expert(spec, seed=4), bad_metadata)
