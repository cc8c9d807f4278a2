"""Thick experts (issue 39, part 4): an expert of several blocks, a manifest setting.

The spec's ``blocks`` (validated, carried by the wire dict, 1 where a peer's dict lacks
it); one block builds exactly the modules of before (names, initial weights); several
build residual blocks in sequence (ffn) or SwiGLU blocks summed (swiglu); the kept-graph
estimate and the parameter count grow with the blocks; the manifest carries the setting;
a thick project has no Mixtral form, so export refuses it before any work."""

from __future__ import annotations

import math
import tomllib
from functools import partial
from pathlib import Path
from typing import cast

import pytest
import torch
import trio
from transformers import MixtralConfig

from core.errors import UserFacingError
from core.experts.backend import ExpertBackend
from core.experts.registry import (
    MAX_BLOCKS,
    ExpertSpec,
    FeedForwardExpert,
    SpecError,
    SwiGLUExpert,
    ThickSwiGLUExpert,
    build_expert,
    parameter_count,
)
from core.experts.uid import ExpertUID, Grid
from core.families.config import model_fields
from core.families.export import export_model
from core.families.mixtral import FamilyError, LocalGridMixture, build_model
from core.families.routing import GridGate
from core.project.keys import OwnerKey
from core.project.manifest import Manifest, ManifestError, parse_manifest
from core.project.signed import SignedManifest
from core.project.template import DEFAULT_MODEL, model_block
from core.trainer.export import check_exportable, export_project
from net import Peer
from tests.swarm.test_experts_units import kept_bytes
from tests.unit.test_trainer_family import MODEL

FFN = ExpertSpec("ffn", 16, 32)
SWIGLU = ExpertSpec("swiglu", 16, 24, activation="silu")


def thick(spec: ExpertSpec, blocks: int, **fields: object) -> ExpertSpec:
    return ExpertSpec.from_dict({**spec.to_dict(), "blocks": blocks, **fields})


# ---------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("blocks", "ok"),
    [
        (1, True),
        (2, True),
        (MAX_BLOCKS, True),
        (0, False),
        (-1, False),
        (MAX_BLOCKS + 1, False),
        (True, False),  # a bool is an int to Python, never a count here
        ("2", False),
        (2.0, False),
        (None, False),
        ([2], False),
    ],
)
def test_blocks_is_validated_and_errors_name_the_field(blocks, ok):
    data = {"kind": "swiglu", "hidden": 8, "blocks": blocks}
    if ok:
        spec = ExpertSpec.from_dict(data)
        assert spec.blocks == blocks
        assert ExpertSpec.from_dict(spec.to_dict()) == spec
    else:
        with pytest.raises(SpecError, match=r"^blocks: must be an integer"):
            ExpertSpec.from_dict(data)


def test_a_peer_s_dict_without_blocks_means_one_and_positional_calls_still_hold():
    spec = ExpertSpec.from_dict({"kind": "ffn", "hidden": 8, "inner": 16, "dtype": "float32"})
    assert spec.blocks == 1
    assert spec.to_dict()["blocks"] == 1
    # the fields before blocks keep their places
    assert ExpertSpec("swiglu", 8, 16, 0, "silu", "bfloat16") == ExpertSpec(
        "swiglu", 8, 16, activation="silu", dtype="bfloat16", blocks=1
    )
    assert list(ExpertSpec.__dataclass_fields__)[-1] == "blocks"


# ---------------------------------------------------------------- the modules


@pytest.mark.parametrize(
    ("spec", "cls", "names"),
    [
        (
            FFN,
            FeedForwardExpert,
            ["norm.weight", "norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        ),
        (SWIGLU, SwiGLUExpert, ["w1.weight", "w2.weight", "w3.weight"]),
    ],
)
def test_one_block_builds_the_modules_of_before(spec, cls, names):
    """Published projects' weights files and seeds: the same names, the same weights."""
    module = build_expert(spec, seed=7)
    assert type(module) is cls
    assert list(module.state_dict()) == names
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        before = cls(spec)
    for name, tensor in before.state_dict().items():
        assert torch.equal(module.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("spec", "per_block", "first_block"),
    [
        (FFN, ["norm.weight", "norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], 6),
        (SWIGLU, ["w1.weight", "w2.weight", "w3.weight", "norm.weight"], 3),  # none on block 0
    ],
)
def test_thick_parameter_names(spec, per_block, first_block):
    names = list(build_expert(thick(spec, 3), seed=0).state_dict())
    assert names[:first_block] == [f"blocks.0.{n}" for n in per_block[:first_block]]
    assert names[first_block:] == [f"blocks.{i}.{n}" for i in (1, 2) for n in per_block]


@pytest.mark.parametrize("spec", [FFN, SWIGLU])
@pytest.mark.parametrize("blocks", [2, 5])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_thick_forward_and_backward(spec, blocks, dtype):
    spec = thick(spec, blocks, dtype=dtype)
    module = build_expert(spec, seed=3)
    x = torch.randn(6, spec.hidden, dtype=spec.torch_dtype, requires_grad=True)
    out = module(x)
    assert out.shape == x.shape
    assert out.dtype == x.dtype
    assert torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert x.grad is not None
    assert x.grad.shape == x.shape
    assert torch.isfinite(x.grad).all()
    for name, p in module.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name  # every block takes part


@pytest.mark.parametrize("spec", [FFN, SWIGLU])
def test_thick_experts_are_deterministic_with_a_seed(spec):
    spec = thick(spec, 3)
    a, b, c = (build_expert(spec, seed=s).state_dict() for s in (11, 11, 12))
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name
    first = "fc1" if spec.kind == "ffn" else "w1"
    assert not torch.equal(a[f"blocks.2.{first}.weight"], c[f"blocks.2.{first}.weight"])
    # the blocks are not copies of each other
    assert not torch.equal(a[f"blocks.0.{first}.weight"], a[f"blocks.1.{first}.weight"])


def test_a_thick_swiglu_expert_returns_the_sum_of_its_blocks():
    """h_1 = x + b_1(x); h_i = h_(i-1) + b_i(RMSNorm_i(h_(i-1))); the expert gives h_N - x,
    so it drops in where a one-block expert goes (the trainer adds the residual)."""
    spec = thick(SWIGLU, 4)
    module = build_expert(spec, seed=2)
    assert isinstance(module, ThickSwiGLUExpert)
    x = torch.randn(5, spec.hidden)
    state = module.state_dict()
    silu, rms_norm = torch.nn.functional.silu, torch.nn.functional.rms_norm

    def swiglu(i: int, n: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (state[f"blocks.{i}.{w}.weight"] for w in ("w1", "w2", "w3"))
        return (silu(n @ w1.T) * (n @ w3.T)) @ w2.T

    h = x + swiglu(0, x)
    for i in range(1, spec.blocks):
        h = h + swiglu(i, rms_norm(h, (spec.hidden,), state[f"blocks.{i}.norm.weight"], eps=1e-5))
    with torch.no_grad():
        assert torch.allclose(module(x), h - x, atol=1e-6)


@pytest.mark.parametrize("spec", [FFN, SWIGLU])
def test_thick_init_scales_the_output_projections(spec):
    """Block 0 draws the weights a one-block expert of the seed draws; every block's
    output projection starts scaled by 1/sqrt(blocks), so a thick expert's first output
    is about as large as a one-block expert's."""
    blocks = 4
    one = build_expert(spec, seed=5)
    many = build_expert(thick(spec, blocks), seed=5)
    names = ("fc1", "fc2") if spec.kind == "ffn" else ("w1", "w2")
    assert torch.equal(
        many.get_parameter(f"blocks.0.{names[0]}.weight"), one.get_parameter(f"{names[0]}.weight")
    )
    assert torch.allclose(
        many.get_parameter(f"blocks.0.{names[1]}.weight"),
        one.get_parameter(f"{names[1]}.weight") / math.sqrt(blocks),
    )
    x = torch.randn(256, spec.hidden)
    with torch.no_grad():
        change_one = (one(x) - (x if spec.kind == "ffn" else 0)).std()
        change_many = (many(x) - (x if spec.kind == "ffn" else 0)).std()
    assert 0.4 < (change_many / change_one).item() < 2.5


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "spec",
    [
        FFN,
        SWIGLU,
        thick(FFN, 2),
        thick(FFN, 4),
        thick(SWIGLU, 2),
        thick(SWIGLU, 4),
        thick(SWIGLU, 3, inner=64),
        thick(SWIGLU, 3, hidden=2, inner=4),
        thick(FFN, 3, inner=8),
    ],
    ids=lambda s: f"{s.kind}-{s.blocks}x{s.hidden}x{s.inner}",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kept_graph_estimate_covers_what_autograd_keeps(spec, dtype):
    """As tests/swarm/test_experts_units.py measures it for one block: never below what
    autograd saves for the backward (and the output the cache holds), at most twice it."""
    spec = thick(spec, spec.blocks, dtype=dtype)
    module = build_expert(spec, seed=1)
    x = torch.randn(8, spec.hidden, dtype=spec.torch_dtype).requires_grad_(True)
    kept = kept_bytes(module, x)
    estimate = ExpertBackend(ExpertUID.parse("ffn.0"), spec, module)._graph_bytes(x)
    assert kept <= estimate <= 2 * kept


@pytest.mark.parametrize(("spec", "widths"), [(FFN, 4 + 3 * 2), (SWIGLU, 2 + 4 * 1.5)])
def test_the_one_block_estimate_is_unchanged(spec, widths):
    assert spec.kept_widths() == widths


@pytest.mark.parametrize(
    ("spec", "norms"),
    [(FFN, 0), (SWIGLU, 3 * 16)],  # swiglu: an RMS norm's weight on blocks 2..4
)
def test_four_blocks_have_four_times_the_parameters_plus_norms(spec, norms):
    one = parameter_count(spec)
    assert parameter_count(thick(spec, 4)) == 4 * one + norms


# ---------------------------------------------------------------- the manifest


def manifest(**expert: object) -> Manifest:
    model = {**MODEL, "expert": {"kind": "swiglu", "hidden": 32, "inner": 48, **expert}}
    return parse_manifest({"project": {"name": "t"}, "model": model, "weights": {"seed": 3}})


@pytest.mark.parametrize(
    ("blocks", "ok"),
    [
        (None, True),
        (1, True),
        (3, True),
        (64, True),
        (0, False),
        (65, False),
        (True, False),
        ("2", False),
    ],
)
def test_the_manifest_carries_blocks_to_the_spec(blocks, ok):
    fields = {} if blocks is None else {"blocks": blocks}
    if not ok:
        with pytest.raises(ManifestError, match="blocks"):
            manifest(**fields)
        return
    m = manifest(**fields)
    assert m.model.expert.spec().blocks == (blocks or 1)
    assert m.model.expert_spec().blocks == (blocks or 1)


def test_the_template_says_one_block():
    model = tomllib.loads(DEFAULT_MODEL)["model"]
    assert model["expert"]["blocks"] == 1
    assert "Mixtral export needs 1" in DEFAULT_MODEL


def test_owner_new_from_a_checkpoint_makes_one_block():
    config = MixtralConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    fields = model_fields(config)
    assert fields["expert"]["blocks"] == 1
    block = tomllib.loads(model_block(fields))["model"]
    assert block["expert"]["blocks"] == 1


# ---------------------------------------------------------------- export


def signed(m: Manifest) -> SignedManifest:
    return SignedManifest.create(m, OwnerKey.generate(), (), "0" * 64)


def test_export_refuses_a_thick_project_before_any_work(tmp_path: Path):
    out, workdir = tmp_path / "out", tmp_path / "work"
    no_peer = cast(Peer, None)  # the refusal comes before the swarm is asked for anything
    run = partial(export_project, no_peer, signed(manifest(blocks=2)), out, workdir=workdir)
    with pytest.raises(UserFacingError, match=r"2 blocks.*Mixtral expert is one SwiGLU block"):
        trio.run(run)
    assert not out.exists()
    assert not workdir.exists()
    check_exportable(manifest(blocks=1).model, out)  # one block: exportable


def test_a_local_model_of_thick_experts_runs_but_has_no_mixtral_form(tmp_path: Path):
    m = manifest(blocks=3)
    spec = m.model.expert_spec()
    config = MixtralConfig(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=16,
    )

    def block(i: int) -> LocalGridMixture:
        grid = Grid(f"ffn{i}", (2, 2))
        experts = [build_expert(spec, seed=j) for j in range(4)]
        return LocalGridMixture(GridGate(32, grid.shape), experts, 2)

    model = build_model(config, block, seed=0)
    logits = model(torch.randint(0, 257, (2, 8))).logits
    assert logits.shape == (2, 8, 257)
    assert torch.isfinite(logits).all()
    with pytest.raises(FamilyError, match="several blocks"):
        export_model(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
