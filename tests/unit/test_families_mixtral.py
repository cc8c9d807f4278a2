"""The Mixtral family (core/families): moehome's model against ``transformers``' own.

Export then ``from_pretrained`` gives the same logits (grid gates and 1-D gates, with the
beam search's routing); a tiny Mixtral saved by ``transformers`` imports with the same
logits (both layouts of its experts, shards, tied embeddings, a sliding window); the
load-balancing loss is ``transformers``'; the SwiGLU expert is one of Mixtral's experts.
Float32, tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import MixtralExperts, load_balancing_loss_func

from core.experts.registry import ExpertSpec, SwiGLUExpert, build_expert
from core.experts.uid import Grid
from core.families.export import EXPERT_KEYS, export_model
from core.families.load import load_pretrained, read_pretrained
from core.families.mixtral import (
    FamilyError,
    MixtralLanguageModel,
    build_model,
    expert_spec,
    local_mixture,
)
from core.families.routing import (
    GridGate,
    beam_search_top_k,
    chosen_weights,
    full_scores,
    load_balancing_loss,
    route_top_k,
)

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4


def config(experts: int = 8, **fields: Any) -> MixtralConfig:
    settings: dict[str, Any] = {
        "vocab_size": 100,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 64,
        "initializer_range": 0.1,  # large enough that routing and logits vary
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    settings.update(fields)
    return MixtralConfig(**settings)


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(seed))


def ours(model: MixtralLanguageModel, ids: torch.Tensor, mask: torch.Tensor | None = None):
    with torch.no_grad():
        return model.eval()(ids, mask)


def theirs(folder: Path, ids: torch.Tensor, mask: torch.Tensor | None = None):
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True
    )
    model, info = loaded
    assert isinstance(model, MixtralForCausalLM)
    assert not any(info.values()), info  # every tensor used, none made up
    with torch.no_grad():
        model.train(False)
        return model(ids, attention_mask=mask, output_router_logits=True)


def grid_model(cfg: MixtralConfig, shape: tuple[int, ...], *, beam_search: bool = False):
    return build_model(
        cfg,
        lambda i: local_mixture(
            cfg, Grid(f"ffn{i}", shape), weights_seed=3, beam_search=beam_search
        ),
        seed=0,
    )


# ---------------------------------------------------------------- export


@pytest.mark.parametrize(
    ("shape", "beam_search"), [((2, 4), True), ((2, 4), False), ((8,), True), ((8,), False)]
)
def test_export_loads_in_transformers_with_equal_logits(tmp_path, shape, beam_search):
    cfg = config()
    model = grid_model(cfg, shape, beam_search=beam_search)
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # padding in the second sample
    mine = ours(model, ids, mask)
    export_model(model, tmp_path / "out")
    hf = theirs(tmp_path / "out", ids, mask)
    assert (mine.logits - hf.logits).abs().max().item() < TOLERANCE
    assert mine.logits.abs().max().item() > 0.5  # not a trivially small comparison
    # the grid gate is a linear router over all experts: the same router logits
    for a, b in zip(mine.router_logits, hf.router_logits, strict=True):
        assert (a - b).abs().max().item() < TOLERANCE
    # routing varies between tokens (the experts' mapping is exercised)
    chosen = {tuple(sorted(r)) for r in route_top_k(mine.router_logits[0], 2)[1].tolist()}
    assert len(chosen) > 3


def test_export_names_the_family_keys_and_writes_the_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer

    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "ab": 5}
    Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")])).save(str(tmp_path / "tok.json"))
    cfg = config()
    model = grid_model(cfg, (2, 4))
    folder = export_model(
        model,
        tmp_path / "out",
        tokenizer=tmp_path / "tok.json",
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        router = f.get_tensor("model.layers.0.block_sparse_moe.gate.weight")
    assert "model.layers.1.block_sparse_moe.experts.7.w3.weight" in keys
    assert not any(".mlp." in k for k in keys)
    gate = model.blocks()[0].gate.proj.weight.detach()
    # expert (1, 2) = index 1 * 4 + 2: the sum of row 1 of dimension 0 and row 2 of dimension 1
    assert torch.allclose(router[6], gate[1] + gate[2 + 2])
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "MixtralForCausalLM"
    ]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer("abc")["input_ids"] == [5, 4]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1)
    with pytest.raises(FamilyError, match="not empty"):
        export_model(model, folder)


# ---------------------------------------------------------------- import


def _saved(tmp_path: Path, cfg: MixtralConfig, layout: str) -> tuple[Path, MixtralForCausalLM]:
    torch.manual_seed(5)
    hf = MixtralForCausalLM(cfg)
    hf.train(False)
    folder = tmp_path / "hf"
    if layout == "fused":  # transformers 5's own names, as in memory
        folder.mkdir()
        cfg.save_pretrained(folder)
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if cfg.tie_word_embeddings:
            del state["lm_head.weight"]
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        hf.save_pretrained(folder, max_shard_size="40KB" if layout == "shards" else "5GB")
    return folder, hf


@pytest.mark.parametrize(
    ("layout", "fields"),
    [
        ("saved", {}),
        ("shards", {}),
        ("fused", {}),
        ("saved", {"tie_word_embeddings": True, "sliding_window": 6}),
    ],
)
def test_a_mixtral_saved_by_transformers_imports_with_equal_logits(tmp_path, layout, fields):
    cfg = config(**fields)
    folder, hf = _saved(tmp_path, cfg, layout)
    if layout == "shards":
        assert (folder / "model.safetensors.index.json").exists()
    ids = tokens(2)
    with torch.no_grad():
        expected = hf(ids, output_router_logits=True)
    for beam_search in (False, True):
        model = load_pretrained(folder, beam_search=beam_search)
        got = ours(model, ids)
        assert (got.logits - expected.logits).abs().max().item() < TOLERANCE
        assert got.logits.abs().max().item() > 0.5
    assert [b.gate.shape for b in model.blocks()] == [(8,), (8,)]


def test_import_reads_safetensors_only_and_only_mixtral(tmp_path):
    folder, _ = _saved(tmp_path, config(), "saved")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(FamilyError, match="safetensors only"):
        read_pretrained(folder)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, "model_type": "llama"}))
    with pytest.raises(FamilyError, match="model_type 'llama'"):
        read_pretrained(folder)


# ---------------------------------------------------------------- routing


def test_load_balancing_loss_is_transformers_own():
    cfg = config()
    model = grid_model(cfg, (2, 4))
    ids = tokens(3)
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    logits = ours(model, ids).router_logits
    for attention_mask in (None, mask):
        expected = load_balancing_loss_func(logits, 8, 2, attention_mask)
        got = load_balancing_loss(logits, 2, attention_mask=attention_mask)
        assert isinstance(expected, torch.Tensor)
        assert abs(got.item() - expected.item()) < 1e-6
    # the experts the beam search chose are the top k: the same loss
    chosen = [route_top_k(layer, 2)[1] for layer in logits]
    assert load_balancing_loss(logits, 2, chosen=chosen).item() == pytest.approx(
        load_balancing_loss(logits, 2).item(), abs=1e-7
    )
    # and the loss trains the gate: its gradient reaches the grid gate's rows
    model.train()
    out = model(ids)
    torch.autograd.backward(load_balancing_loss(out.router_logits, 2))
    grad = model.blocks()[0].gate.proj.weight.grad
    assert grad is not None
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(2, 4), (3, 3, 2), (8,)])
def test_beam_search_over_the_grid_is_mixtrals_top_k(shape):
    gen = torch.Generator().manual_seed(7)
    gate = GridGate(16, shape)
    x = torch.randn(64, 16, generator=gen)
    with torch.no_grad():
        per_dim = gate(x)
        logits = full_scores(per_dim)
        assert torch.allclose(logits, x @ gate.router_weight().T, atol=1e-6)
        for k in (1, 2, 3):
            weights, top = route_top_k(logits, k)
            beam = beam_search_top_k(per_dim, Grid("ffn0", shape), k)
            assert torch.equal(beam, top)
            # moehome's weights (softmax over the chosen) are Mixtral's renormalized top k
            assert torch.allclose(chosen_weights(logits, beam), weights, atol=1e-6)


# ---------------------------------------------------------------- the expert


def test_swiglu_expert_is_one_mixtral_expert():
    cfg = config()
    spec = expert_spec(cfg)
    assert spec == ExpertSpec("swiglu", 32, 48, activation="silu")
    expert = build_expert(spec, seed=1)
    assert isinstance(expert, SwiGLUExpert)
    shapes = {k: list(v.shape) for k, v in expert.state_dict().items()}
    assert shapes == {"w1.weight": [48, 32], "w2.weight": [32, 48], "w3.weight": [48, 32]}
    assert set(shapes) == set(EXPERT_KEYS)
    # transformers' fused experts holding this one as expert 2 compute the same output
    fused = MixtralExperts(cfg)
    with torch.no_grad():
        fused.gate_up_proj.zero_()
        fused.down_proj.zero_()
        fused.gate_up_proj[2] = torch.cat([expert.w1.weight, expert.w3.weight])
        fused.down_proj[2] = expert.w2.weight
        x = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
        index = torch.full((5, 1), 2)
        expected = fused(x, index, torch.ones(5, 1))
        assert (expert(x) - expected).abs().max().item() < 1e-6
