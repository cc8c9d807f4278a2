"""Export: a folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    config.json             MixtralConfig (architectures: MixtralForCausalLM)
    model.safetensors       the family's own key names, as ``save_pretrained`` writes them
    tokenizer.json          with tokenizer_config.json, when a tokenizer is given

The trainer's layers keep their names (core/families/mixtral.py names them as the family
does). Each layer's grid gate becomes the router over all its experts
(``block_sparse_moe.gate.weight``: row ``e`` is the sum of the gate rows of expert
``e``'s coordinates, the experts in the grid's order), and each SwiGLU expert's
``w1``/``w2``/``w3`` become ``block_sparse_moe.experts.<e>.w1.weight`` and so on.
``transformers`` 5 fuses the experts into 3-D tensors when it loads, from exactly these
keys (its conversion mapping for Mixtral), and writes them back so when it saves.

The weights come as plain tensors (``LayerWeights``): the trainer's layers from the
trainer, the experts from the aggregators' latest versions; ``export_model`` takes them
from a model whose experts are local.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig

from core.families.mixtral import FamilyError, LocalGridMixture, MixtralLanguageModel, trunk_shapes
from core.families.routing import full_router

#: one SwiGLU expert's tensors (core/experts/registry.py ``SwiGLUExpert``)
EXPERT_KEYS = ("w1.weight", "w2.weight", "w3.weight")


@dataclass(frozen=True)
class LayerWeights:
    """One layer's sparse block as tensors."""

    grid: tuple[int, ...]
    #: the grid gate's rows [sum(grid), hidden], dimension after dimension
    gate: torch.Tensor
    #: prod(grid) experts' state dicts (``EXPERT_KEYS``), in the grid's order
    experts: Sequence[Mapping[str, torch.Tensor]]


def split_model(model: MixtralLanguageModel) -> tuple[dict[str, torch.Tensor], list[LayerWeights]]:
    """A model with local blocks -> (the trainer's layers by key, each layer's block)."""
    shapes = trunk_shapes(model.config)
    trunk = {key: t.detach() for key, t in model.state_dict().items() if key in shapes}
    layers = []
    for i, block in enumerate(model.blocks()):
        if not isinstance(block, LocalGridMixture):
            raise FamilyError(f"layer {i}: its experts are not in this model")
        layers.append(
            LayerWeights(
                block.gate.shape,
                block.gate.proj.weight.detach(),
                [{k: t.detach() for k, t in e.state_dict().items()} for e in block.experts],
            )
        )
    return trunk, layers


def checkpoint_tensors(
    config: MixtralConfig,
    trunk: Mapping[str, torch.Tensor],
    layers: Sequence[LayerWeights],
    *,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """The family's checkpoint keys -> tensors in ``dtype``, every name and shape checked
    against ``config``."""
    shapes = trunk_shapes(config)
    given = {k for k in trunk if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    if given != set(shapes):
        missing, extra = sorted(set(shapes) - given), sorted(given - set(shapes))
        raise FamilyError(f"trainer layers: missing {missing[:3]}, unexpected {extra[:3]}")
    tensors: dict[str, torch.Tensor] = {}
    for key, shape in shapes.items():
        if trunk[key].shape != shape:
            raise FamilyError(f"{key}: {list(trunk[key].shape)}, expected {list(shape)}")
        tensors[key] = trunk[key].detach().to("cpu", dtype).contiguous()
    if len(layers) != config.num_hidden_layers:
        raise FamilyError(f"{config.num_hidden_layers} layers, got {len(layers)} sparse blocks")
    hidden, inner = config.hidden_size, config.intermediate_size
    expected = {"w1.weight": (inner, hidden), "w2.weight": (hidden, inner)}
    expected["w3.weight"] = (inner, hidden)
    for i, layer in enumerate(layers):
        experts = math.prod(layer.grid)
        if experts != config.num_local_experts or len(layer.experts) != experts:
            raise FamilyError(
                f"layer {i}: grid {list(layer.grid)} with {len(layer.experts)} experts; "
                f"the config says {config.num_local_experts}"
            )
        if tuple(layer.gate.shape) != (sum(layer.grid), hidden):
            raise FamilyError(f"layer {i}: gate {list(layer.gate.shape)} for grid {layer.grid}")
        prefix = f"model.layers.{i}.block_sparse_moe."
        router = full_router(layer.gate.detach().to("cpu", torch.float32), layer.grid)
        tensors[prefix + "gate.weight"] = router.to(dtype).contiguous()
        for e, expert in enumerate(layer.experts):
            if any(name.startswith("blocks.") for name in expert):
                raise FamilyError(
                    f"layer {i} expert {e}: an expert of several blocks ([model.expert] "
                    "blocks > 1) has no Mixtral form: a Mixtral expert is one SwiGLU block"
                )
            if set(expert) != set(EXPERT_KEYS):
                raise FamilyError(f"layer {i} expert {e}: tensors {sorted(expert)}, not SwiGLU")
            for name in EXPERT_KEYS:
                if tuple(expert[name].shape) != expected[name]:
                    raise FamilyError(
                        f"layer {i} expert {e}: {name} {list(expert[name].shape)}, "
                        f"expected {list(expected[name])}"
                    )
                key = f"{prefix}experts.{e}.{name}"
                tensors[key] = expert[name].detach().to("cpu", dtype).contiguous()
    return tensors


def write_pretrained(
    folder: Path,
    config: MixtralConfig,
    trunk: Mapping[str, torch.Tensor],
    layers: Sequence[LayerWeights],
    *,
    tokenizer: Path | None = None,
    special_tokens: Mapping[str, str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write the folder (absent or empty): config, weights and, with ``tokenizer`` (a
    ``tokenizers`` tokenizer.json), the tokenizer for ``PreTrainedTokenizerFast`` with
    ``special_tokens`` (e.g. ``{"bos_token": "<s>", "eos_token": "</s>"}``)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FamilyError(f"{folder} is not empty")
    tensors = checkpoint_tensors(config, trunk, layers, dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    own = copy.deepcopy(config)
    own.architectures = ["MixtralForCausalLM"]
    own.dtype = dtype
    own.save_pretrained(folder)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        shutil.copyfile(tokenizer, folder / "tokenizer.json")
        settings: dict[str, object] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": config.max_position_embeddings,
            **(special_tokens or {}),
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return folder


def export_model(
    model: MixtralLanguageModel,
    folder: Path,
    *,
    tokenizer: Path | None = None,
    special_tokens: Mapping[str, str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """``write_pretrained`` of a model whose experts are local."""
    trunk, layers = split_model(model)
    config = copy.deepcopy(model.config)
    tops = {b.top_k for b in model.blocks() if isinstance(b, LocalGridMixture)}
    if len(tops) != 1:
        raise FamilyError(f"the layers choose different numbers of experts: {sorted(tops)}")
    config.num_experts_per_tok = tops.pop()
    return write_pretrained(
        folder,
        config,
        trunk,
        layers,
        tokenizer=tokenizer,
        special_tokens=special_tokens,
        dtype=dtype,
    )
