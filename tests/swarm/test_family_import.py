"""A project started from a Mixtral checkpoint (issue 38): a tiny random Mixtral made and
saved by ``transformers`` itself, made a project with ``moehome owner new --from`` and
published, has the same logits in moehome: the trainer fetches the published trainer
layers from the owner over real peers, the experts are the published expert files.
Refusals are one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM
from typer.testing import CliRunner

from core.cli import app
from core.data.tokenizer import train_bpe
from core.experts.registry import build_expert
from core.experts.weights import load_weights_bytes
from core.families.mixtral import FamilyError, LocalGridMixture
from core.families.routing import GridGate
from core.families.start import start_from_pretrained
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.distribution import WeightsFetcher
from core.project.keys import OwnerKey
from core.project.manifest import ManifestError, load_manifest
from core.project.publish import TRUNK_FILE, prepare, serve_project
from core.protocol.contributions import TRUNK_UID
from core.roles.aggregator import aggregate
from core.trainer.export import export_project
from core.trainer.family import MixtralTrainerModel, build_family_model, family_trunk
from core.trainer.initial import TrunkError, load_trunk, start_from_published, trunk_shapes_of
from core.trainer.train import TrainerOptions, remote_model
from core.trainer.trunk import snapshot
from net.testing import open_swarm

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
OTHER_TRAINER = "b" * 64


def mixtral(folder: Path, **fields: Any) -> MixtralForCausalLM:
    """A tiny random Mixtral, saved by transformers; norms perturbed so that every
    tensor matters to the logits."""
    settings: dict[str, Any] = {
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "initializer_range": 0.2,  # large enough that routing and logits vary
    }
    settings.update(fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MixtralForCausalLM(MixtralConfig(**settings))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    model.train(False)
    return model


def local_model(manifest_path: Path, experts: dict[str, bytes]) -> MixtralTrainerModel:
    """The project's model as a fresh trainer builds it (its layers from the manifest's
    seed), each layer's experts here, loaded from the published files."""
    manifest = load_manifest(manifest_path)
    m = manifest.model
    spec = m.expert_spec()

    def block(_layer: int, grid) -> LocalGridMixture:
        modules = []
        for uid in grid:
            module = build_expert(spec)
            load_weights_bytes(module, experts[str(uid)])
            modules.append(module)
        return LocalGridMixture(GridGate(m.hidden, grid.shape), modules, m.k_best, beam_search=True)

    return build_family_model(m, block, seed=manifest.weights.seed).eval()


def logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


async def test_a_transformers_mixtral_started_with_from_has_its_logits_in_moehome(tmp_path):
    checkpoint = tmp_path / "hf"
    hf = mixtral(checkpoint)
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, trainer, aggregator = swarm.peers
        manifest_path = tmp_path / "project.toml"
        started = start_from_pretrained(
            checkpoint,
            manifest_path,
            "my-lm",
            aggregator_key=aggregator.identity.public_key.hex(),
            trainer_key=trainer.identity.public_key.hex(),
        )
        assert started.tokenizer == "bytes"  # no tokenizer.json; 300 ids hold the bytes
        assert started.weights == tmp_path / "my-lm-weights"
        text = manifest_path.read_text()
        assert "grid = [4]" in text
        assert 'folder = "my-lm-weights"' in text
        # a second trainer: the trainers share the trunk through the aggregator
        manifest_path.write_text(text + f'\n[[trainers]]\nkey = "{OTHER_TRAINER}"\n')
        manifest = load_manifest(manifest_path)
        assert manifest.model.architecture == "mixtral"
        assert manifest.model.grid == [4]
        assert manifest.model.k_best == 2
        assert manifest.data.tokenizer == "bytes"
        uids = list(manifest.model.expert_uids())
        assert sorted(p.name for p in started.weights.iterdir()) == sorted(
            [f"{uid}.safetensors" for uid in uids] + [TRUNK_FILE]
        )
        prepared = prepare(
            manifest_path, OwnerKey.generate(), (), tmp_path / "owner", trunk_shapes=trunk_shapes_of
        )
        signed = prepared.signed
        assert set(prepared.index.files) == {*uids, TRUNK_UID}
        published = load_file(str(started.weights / TRUNK_FILE))
        await nursery.start(serve_project, owner, prepared)

        # the trainer's own model (remote experts) starts from the published trunk
        options = TrainerOptions(project=signed.project_id, workdir=tmp_path / "trainer")
        remote = remote_model(trainer, signed, trainer.identity, options)()
        store = tmp_path / "trainer" / "trunk-chunks"
        assert await start_from_published(trainer, signed, remote, store)
        assert snapshot(remote).keys() == published.keys()
        assert all(torch.equal(snapshot(remote)[k], t) for k, t in published.items())
        # so does the aggregator's copy of the shared trunk, the trainers' anchor
        service = await nursery.start(aggregate, aggregator, signed, tmp_path / "aggregator")
        anchor = snapshot(service.core.modules[TRUNK_UID])
        assert all(torch.equal(anchor[k], t) for k, t in published.items())

        # the model with the published experts here has the checkpoint's logits
        fetcher = WeightsFetcher(trainer, ChunkStore(tmp_path / "trainer" / "chunks"))
        experts = await fetcher.fetch(signed, uids)
        model = local_model(manifest_path, experts)
        tokens = torch.randint(0, 300, (3, 32), generator=torch.Generator().manual_seed(1))
        seeded = logits(model, tokens)
        assert await start_from_published(trainer, signed, model, store)
        # exported before any training: the checkpoint again
        out = tmp_path / "exported"
        exported = await export_project(trainer, signed, out, workdir=tmp_path / "fresh")
        nursery.cancel_scope.cancel()
    ours, theirs = logits(model, tokens), logits(hf, tokens)
    assert (ours - theirs).abs().max() <= TOLERANCE
    assert (seeded - theirs).abs().max() > 100 * TOLERANCE  # the trunk is what made them equal
    assert exported.trainer_step is None
    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    again.train(False)
    assert (logits(again, tokens) - theirs).abs().max() <= TOLERANCE


def test_the_checkpoints_tokenizer_is_pinned_and_kept_beside_the_manifest(tmp_path):
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    docs = ["def f(x):\n    return x + 1\n" * 20, "hello world " * 50]
    tokenizer = train_bpe(docs, 280, checkpoint / "tokenizer.json")
    mixtral(checkpoint, vocab_size=280, tie_word_embeddings=True)
    manifest_path = tmp_path / "project.toml"
    started = start_from_pretrained(checkpoint, manifest_path, "tok")
    assert started.tokenizer == tokenizer.sha256
    assert load_manifest(manifest_path).data.tokenizer == tokenizer.sha256
    assert load_manifest(manifest_path).model.tie_embeddings
    kept = tmp_path / "tokenizer.json"
    assert kept.read_bytes() == (checkpoint / "tokenizer.json").read_bytes()
    # tied: the trunk holds the embedding once, as the trainer's parameters do
    trunk = load_file(str(started.weights / TRUNK_FILE))
    assert "lm_head.weight" not in trunk
    shapes = trunk_shapes_of(load_manifest(manifest_path).model)
    assert {k: tuple(t.shape) for k, t in trunk.items()} == shapes


def test_refusals_are_clear_and_write_nothing(tmp_path):
    window = tmp_path / "window"
    mixtral(window, sliding_window=16)
    with pytest.raises(FamilyError, match="sliding_window 16"):
        start_from_pretrained(window, tmp_path / "a.toml", "a")
    small = tmp_path / "small"
    mixtral(small, vocab_size=200)
    with pytest.raises(FamilyError, match=r"put the model's tokenizer\.json in the folder"):
        start_from_pretrained(small, tmp_path / "b.toml", "b")
    with pytest.raises(FamilyError, match=r"config\.json"):
        start_from_pretrained(tmp_path / "window" / "..", tmp_path / "c.toml", "c")
    untied = tmp_path / "untied"
    mixtral(untied)
    tensors = load_file(str(untied / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(untied / "model.safetensors"))
    with pytest.raises(FamilyError, match="tie_word_embeddings is false"):
        start_from_pretrained(untied, tmp_path / "d.toml", "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small", "untied", "window"]


def test_owner_new_from_says_what_is_wrong_in_one_line(tmp_path):
    window = tmp_path / "window"
    mixtral(window, sliding_window=16)
    runner = CliRunner()
    args = ["--data-dir", str(tmp_path / "data"), "owner", "new", str(tmp_path / "p.toml")]
    result = runner.invoke(app, [*args, "--name", "my-lm", "--from", str(window)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert "sliding_window 16" in errors[0]
    assert not (tmp_path / "p.toml").exists()
    result = runner.invoke(app, [*args, "--name", "my-lm", "--from", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "is not a folder" in result.output
    fine = tmp_path / "fine"
    mixtral(fine)
    result = runner.invoke(app, [*args, "--name", "my-lm", "--from", str(fine)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "my-lm-weights" / TRUNK_FILE).exists()


def test_a_trunk_that_is_not_the_model_s_is_refused_by_name(tmp_path):
    checkpoint = tmp_path / "hf"
    mixtral(checkpoint)
    manifest_path = tmp_path / "project.toml"
    started = start_from_pretrained(checkpoint, manifest_path, "my-lm")
    trunk_path = started.weights / TRUNK_FILE
    tensors = load_file(str(trunk_path))
    tensors["model.norm.weight"] = torch.ones(31)
    save_file(tensors, str(trunk_path))
    with pytest.raises(ManifestError, match=r"model\.norm\.weight is \[31\], expected \[32\]"):
        prepare(
            manifest_path, OwnerKey.generate(), (), tmp_path / "o", trunk_shapes=trunk_shapes_of
        )
    del tensors["model.norm.weight"]
    trainer = family_trunk(load_manifest(manifest_path).model, seed=0)
    with pytest.raises(TrunkError, match=r"missing \['model.norm.weight'\]"):
        load_trunk(trainer, tensors, load_manifest(manifest_path).model)
