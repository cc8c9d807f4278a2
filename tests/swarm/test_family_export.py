"""A mixtral project's model taken out and brought in (issue 38): ``owner export`` over
real peers gives a folder whose ``from_pretrained`` model has moehome's own logits; a
Mixtral made and saved by ``transformers`` itself, made a project with ``owner new
--from``, has the same logits in moehome."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from core.experts.registry import build_expert
from core.experts.spec import seed_for
from core.families.config import mixtral_config
from core.families.mixtral import LocalGridMixture
from core.families.routing import GridGate
from core.namespaces import moehome_validator
from core.project.keys import OwnerKey
from core.project.manifest import load_manifest
from core.project.publish import prepare, serve_project
from core.trainer.data import Corpus
from core.trainer.export import export_project
from core.trainer.family import MixtralTrainerModel, build_family_model
from core.trainer.session import SessionSettings, TrainingSession
from net.testing import open_swarm

pytestmark = pytest.mark.slow

MANIFEST = """\
[project]
name = "family-export"

[model]
architecture = "mixtral"
vocab_size = 257
hidden = 32
context = 16
mixture_layers = 2
grid = [2, 2]
k_best = 2
heads = 4
kv_heads = 2

[model.expert]
kind = "swiglu"
hidden = 32
inner = 48

[weights]
seed = 3
"""


def local_model(manifest_path: Path) -> MixtralTrainerModel:
    """The project's model with every expert here, at its published initial weights,
    routed by the top k of the full router (what transformers computes)."""
    manifest = load_manifest(manifest_path)
    m = manifest.model
    spec = m.expert_spec()

    def block(_layer: int, grid) -> LocalGridMixture:
        experts = [build_expert(spec, seed=seed_for(manifest.weights.seed, str(u))) for u in grid]
        return LocalGridMixture(GridGate(m.hidden, grid.shape), experts, m.k_best)

    return build_family_model(m, block, seed=manifest.weights.seed, eos_token_id=256)


async def test_an_exported_project_loads_in_transformers_with_moehome_s_logits(tmp_path):
    manifest_path = tmp_path / "project.toml"
    manifest_path.write_text(MANIFEST)
    prepared = prepare(manifest_path, OwnerKey.generate(), (), tmp_path / "owner")
    # the trainer trains its layers a few steps (the experts stay at their published
    # weights: no aggregator here) and checkpoints them, as owner train does
    model = local_model(manifest_path)
    for block in model.blocks():  # the volunteers' part: trained by aggregators, not here
        assert isinstance(block, LocalGridMixture)
        block.experts.requires_grad_(False)
    text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 40), dtype=torch.uint8)
    corpus = Corpus(text[:800], text[800:], 1, "inline")
    workdir = tmp_path / "trainer"
    session = TrainingSession(
        model,
        corpus,
        SessionSettings(project=prepared.signed.project_id, batch_size=4),
        workdir / "checkpoints",
    )
    for _ in range(3):
        assert session.train_step() is not None
    session.save()
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, trainer = swarm.peers
        await nursery.start(serve_project, owner, prepared)
        out = tmp_path / "export"
        exported = await export_project(trainer, prepared.signed, out, workdir=workdir)
        nursery.cancel_scope.cancel()
    assert exported.trainer_step == 3
    assert set(exported.versions.values()) == {0}
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf.train(False)
    model.train(False)
    tokens = torch.randint(0, 257, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens).logits
        theirs = hf(tokens).logits
    assert (ours - theirs).abs().max() < 1e-4
    assert hf.config.num_local_experts == 4
    assert hf.config.eos_token_id == 256
    assert mixtral_config(load_manifest(manifest_path).model).hidden_size == 32
