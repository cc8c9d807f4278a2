"""``moehome owner export``: the project's model as a folder that ``transformers`` loads
(``AutoModelForCausalLM.from_pretrained``), assembled from the trainer's layers (its
newest checkpoint, or the initial ones: the owner's published trunk, else those of the
manifest's seed) and the experts' newest versions as the aggregators announce them (each
fetched and checked against its signed record; the owner's initial file where no version
was announced yet)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import trio

from core.checkpoints import CheckpointStore
from core.data.tokenizer import HFTokenizer, TextTokenizer
from core.errors import UserFacingError
from core.families.config import mixtral_config
from core.families.export import LayerWeights, write_pretrained
from core.families.mixtral import trunk_shapes
from core.moe.published import PublishedWeights
from core.project.chunks import ChunkStore
from core.project.distribution import WeightsFetcher
from core.project.manifest import ModelSection
from core.project.signed import SignedManifest
from core.trainer.batches import project_tokenizer
from core.trainer.family import family_trunk
from core.trainer.initial import published_trunk
from core.trainer.tokenizer_file import tokenizer_for
from net import Peer

log = logging.getLogger(__name__)

#: (experts done, experts in all)
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Exported:
    folder: Path
    #: the trainer step of the trainer's layers (None: the initial ones)
    trainer_step: int | None
    #: per expert, the version exported
    versions: dict[str, int]


def trainer_layers(
    signed: SignedManifest, workdir: Path
) -> tuple[dict[str, torch.Tensor], int | None]:
    """The trainer's weights by name (the family's keys, and each layer's
    ``model.layers.<i>.mlp.gate.proj.weight``) from its newest checkpoint in ``workdir``,
    or the initial ones; and the step they are of."""
    store = CheckpointStore(workdir / "checkpoints")
    latest = store.latest() if (workdir / "checkpoints").is_dir() else None
    if latest is not None:
        _, meta, tensors = latest
        if meta.get("project") == signed.project_id:
            weights = {k[2:]: v for k, v in tensors.items() if k.startswith("m/")}
            return weights, int(meta["step"])
        log.warning("%s holds another project's checkpoint; exporting the initial layers", workdir)
    trunk = family_trunk(signed.manifest.model, seed=signed.manifest.weights.seed)
    return {k: v.detach() for k, v in trunk.state_dict().items()}, None


def check_exportable(model: ModelSection, out: Path) -> None:
    """Refuse, before any work, a project that has no Hugging Face Mixtral form, or an
    ``out`` that is not empty."""
    if model.architecture == "byte":
        raise UserFacingError(
            "the byte model has no Hugging Face form: export takes a project whose "
            "[model] architecture is mixtral"
        )
    if model.expert.blocks != 1:
        raise UserFacingError(
            f"this project's experts are of {model.expert.blocks} blocks ([model.expert] "
            "blocks): a Hugging Face Mixtral expert is one SwiGLU block, so it cannot be "
            "written as a Mixtral checkpoint; export takes a project whose blocks is 1"
        )
    if out.exists() and any(out.iterdir()):
        raise UserFacingError(f"{out} is not empty; choose a new folder")


def _plan(
    signed: SignedManifest, out: Path, workdir: Path, tokenizer: Path | None
) -> tuple[TextTokenizer, dict[str, torch.Tensor], int | None]:
    check_exportable(signed.manifest.model, out)
    # the file tokenizer_for chose (given, or the work folder's, fetched when missing)
    text = project_tokenizer(signed.manifest.data.tokenizer, tokenizer, [])
    weights, step = trainer_layers(signed, workdir)
    return text, weights, step


async def export_project(
    peer: Peer,
    signed: SignedManifest,
    out: Path,
    *,
    workdir: Path,
    tokenizer: Path | None = None,
    progress: Progress | None = None,
) -> Exported:
    """Write the project's model to ``out`` (absent or empty); ``workdir``: the
    trainer's (its checkpoints, its copy of the tokenizer: fetched from the swarm into it
    when it has none and ``tokenizer`` is not given)."""
    m = signed.manifest.model
    check_exportable(m, out)  # before the tokenizer is fetched
    store = workdir / "export-chunks"
    tokenizer = await tokenizer_for(peer, signed, workdir, given=tokenizer, store=store)
    text, weights, step = await trio.to_thread.run_sync(_plan, signed, out, workdir, tokenizer)
    chunks = ChunkStore(store)
    if step is None:  # no checkpoint: the initial layers are the owner's, when published
        weights = await published_trunk(WeightsFetcher(peer, chunks), signed) or weights
    config = mixtral_config(m, eos_token_id=text.eos_id)
    shapes = trunk_shapes(config)
    trunk = {k: v for k, v in weights.items() if k in shapes}
    published = PublishedWeights(peer, signed, chunks, max_bytes=2**62)
    versions: dict[str, int] = {}
    layers = []
    for i, grid in enumerate(m.grids()):
        experts = []
        for uid in grid:
            version, module = await published.newest(str(uid))
            versions[str(uid)] = version
            experts.append({k: v.detach() for k, v in module.state_dict().items()})
            if progress is not None:
                progress(len(versions), m.expert_count)
        gate = weights.get(f"model.layers.{i}.mlp.gate.proj.weight")
        if gate is None:
            raise UserFacingError(f"the trainer's checkpoint has no gate for layer {i}")
        layers.append(LayerWeights(tuple(grid.shape), gate, experts))
    tokenizer_file, special = None, None
    if isinstance(text, HFTokenizer):  # bytes have no tokenizer.json: generate knows them
        tokenizer_file = text.path
        special = {"eos_token": str(text.tokenizer.id_to_token(text.eos_id))}
    await trio.to_thread.run_sync(
        partial(
            write_pretrained,
            out,
            config,
            trunk,
            layers,
            tokenizer=tokenizer_file,
            special_tokens=special,
        )
    )
    return Exported(out, step, versions)
