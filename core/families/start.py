"""``moehome owner new --from``: a project whose initial weights are those of a Hugging
Face Mixtral folder (continued pre-training). Beside the manifest:

    project.toml        [model] from config.json (a 1-D grid of num_local_experts: a
                        grid gate holds the checkpoint's router exactly), [data] the
                        tokenizer's sha256 (or bytes), [weights] folder = "<name>-weights"
    tokenizer.json      the checkpoint's, when it has one
    <name>-weights/     one <uid>.safetensors per expert (its w1, w2, w3, as moehome's
                        SwiGLU expert names them) and trunk.safetensors: the trainer's
                        layers under the family's keys, each layer's router as its grid
                        gate (``model.layers.<i>.mlp.gate.proj.weight``)

``moehome owner publish`` then publishes the experts and the trunk from that folder
(core/project/publish.py), and a fresh trainer starts from the published trunk
(core/trainer/initial.py): the project's model is the checkpoint's, logit for logit.
"""

from __future__ import annotations

import hashlib
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save

from core.data.tokenizer import HFTokenizer, check_vocab
from core.experts.registry import build_expert
from core.experts.weights import canonical_safetensors, save_weights
from core.families.config import mixtral_config, model_fields
from core.families.load import Checkpoint, read_config, read_pretrained
from core.families.mixtral import FamilyError, trunk_shapes
from core.project.manifest import ModelSection, parse_manifest
from core.project.publish import TRUNK_FILE
from core.project.template import manifest_text

#: The tokenizer a checkpoint's folder holds, and where the manifest's copy goes.
TOKENIZER_FILE = "tokenizer.json"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Started:
    manifest: Path
    #: the ``[weights] folder`` written
    weights: Path
    #: what ``[data] tokenizer`` pins: "bytes" or the tokenizer.json's sha256
    tokenizer: str
    experts: int


def start_from_pretrained(
    folder: Path,
    manifest_path: Path,
    name: str,
    *,
    aggregator_key: str | None = None,
    trainer_key: str | None = None,
    progress: Progress | None = None,
) -> Started:
    """Write the manifest of a project started from the Mixtral in ``folder``, its
    initial weights in a folder beside it and its tokenizer (the module's doc). Nothing
    is written when the checkpoint cannot be held exactly (``FamilyError``, a
    ``ManifestError`` for a model larger than a manifest allows) or a file is in the
    way (``FileExistsError``). ``progress(done, total)``: experts written."""
    folder, manifest_path = Path(folder), Path(manifest_path)
    if manifest_path.exists():
        raise FileExistsError(f"{manifest_path} exists; not overwriting it")
    if not folder.is_dir():
        raise FamilyError(f"{folder} is not a folder (a Hugging Face Mixtral's)")
    config = read_config(folder)
    fields = model_fields(config)
    pin, tokenizer = _tokenizer(folder, int(config.vocab_size))
    kept = manifest_path.parent / TOKENIZER_FILE
    if tokenizer is not None and kept.exists() and kept.read_bytes() != tokenizer.read_bytes():
        raise FileExistsError(f"{kept} exists and is another tokenizer; not overwriting it")
    weights_name = f"{name}-weights"
    weights = manifest_path.parent / weights_name
    if weights.exists():
        raise FileExistsError(f"{weights} exists; not overwriting it")
    text = manifest_text(
        name,
        manifest_path.name,
        aggregator_key=aggregator_key,
        trainer_key=trainer_key,
        description=f"Continued pre-training of {folder.resolve().name} by volunteers.",
        model=fields,
        tokenizer=pin,
        weights_folder=weights_name,
    )
    manifest = parse_manifest(tomllib.loads(text))
    checkpoint = read_pretrained(folder)
    partial = weights.with_name(weights_name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_initial_weights(checkpoint, manifest.model, partial, progress)
    partial.rename(weights)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, kept)
    manifest_path.write_text(text)
    return Started(manifest_path, weights, pin, manifest.model.expert_count)


def _tokenizer(folder: Path, vocab_size: int) -> tuple[str, Path | None]:
    """What ``[data] tokenizer`` pins, and the file to copy beside the manifest."""
    path = folder / TOKENIZER_FILE
    if path.exists():
        tokenizer = HFTokenizer.load(path)
        check_vocab(tokenizer, vocab_size, f"{folder / 'config.json'}")
        return hashlib.sha256(path.read_bytes()).hexdigest(), path
    if vocab_size < 257:
        raise FamilyError(
            f"{folder}: no {TOKENIZER_FILE}, and vocab_size {vocab_size} cannot hold bytes "
            f"(257 ids: 256 byte values and the end of text); put the model's "
            f"{TOKENIZER_FILE} in the folder"
        )
    return "bytes", None


def trunk_tensors(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The trainer's layers of ``checkpoint`` by the trainer's parameter names: the
    family's keys, and each layer's router as its grid gate's weight."""
    tensors = dict(checkpoint.trunk)
    for i, layer in enumerate(checkpoint.layers):
        tensors[f"model.layers.{i}.mlp.gate.proj.weight"] = layer.gate
    return {key: t.to(torch.float32).contiguous() for key, t in tensors.items()}


def write_initial_weights(
    checkpoint: Checkpoint, model: ModelSection, out: Path, progress: Progress | None = None
) -> None:
    """A ``[weights] folder`` for ``model`` (the manifest's, of ``checkpoint``'s config):
    each expert's file as ``moehome owner publish`` reads it, and the trunk's."""
    grids = model.grids()
    if len(grids) != len(checkpoint.layers):
        raise FamilyError(f"{len(grids)} mixture layers, the checkpoint {len(checkpoint.layers)}")
    spec = model.expert_spec()
    out.mkdir(parents=True)
    done, total = 0, model.expert_count
    for grid, layer in zip(grids, checkpoint.layers, strict=True):
        if tuple(layer.grid) != grid.shape:
            raise FamilyError(
                f"{grid.layer}: grid {list(grid.shape)}, the checkpoint's {list(layer.grid)}"
            )
        for uid, tensors in zip(grid, layer.experts, strict=True):
            with torch.device("meta"):  # no weights drawn only to be replaced
                module = build_expert(spec)
            state = {k: t.to(spec.torch_dtype).contiguous() for k, t in tensors.items()}
            module.load_state_dict(state, strict=True, assign=True)
            save_weights(module, out / f"{uid}.safetensors", version=0)
            done += 1
            if progress is not None:
                progress(done, total)
    trunk = trunk_tensors(checkpoint)
    expected = dict(trunk_shapes(mixtral_config(model)))
    for i, grid in enumerate(grids):
        expected[f"model.layers.{i}.mlp.gate.proj.weight"] = torch.Size(
            (sum(grid.shape), model.hidden)
        )
    if {k: tuple(v) for k, v in expected.items()} != {k: tuple(t.shape) for k, t in trunk.items()}:
        raise FamilyError("the checkpoint's trainer layers are not the model's")  # a bug here
    (out / TRUNK_FILE).write_bytes(canonical_safetensors(save(trunk, metadata={"version": "0"})))
