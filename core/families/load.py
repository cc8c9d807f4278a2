"""Import: a Hugging Face Mixtral folder (config.json and safetensors, one file or
shards with their index) as moehome's trainer layers, experts and 1-D grid gates.

Only safetensors are read (never pickle: a ``pytorch_model.bin`` is refused). Both
layouts of the experts are read: the one on the Hub and written by ``save_pretrained``
(``block_sparse_moe.experts.<e>.w1.weight``, ``w2``, ``w3``, ``block_sparse_moe.gate``)
and ``transformers`` 5's fused one (``mlp.experts.gate_up_proj`` [E, 2I, H], the gate's
rows first, ``mlp.experts.down_proj`` [E, H, I], ``mlp.gate.weight``). The router becomes
a grid gate of the 1-D grid [E]: a general linear router is not a sum over a larger grid.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import MixtralConfig

from core.experts.registry import build_expert
from core.families.export import EXPERT_KEYS, LayerWeights
from core.families.mixtral import (
    FamilyError,
    LocalGridMixture,
    MixtralLanguageModel,
    expert_spec,
    trunk_shapes,
)
from core.families.routing import GridGate

_ROUTER = re.compile(r"^model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.gate\.weight$")
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


@dataclass(frozen=True)
class Checkpoint:
    config: MixtralConfig
    #: the trainer's layers by the family's keys (core/families/mixtral.py names them so)
    trunk: dict[str, torch.Tensor]
    #: each layer's router as a 1-D grid gate [E] and its experts in order
    layers: list[LayerWeights]


def read_config(folder: Path) -> MixtralConfig:
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FamilyError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("model_type") != "mixtral":
        found = data.get("model_type") if isinstance(data, dict) else None
        raise FamilyError(f"{path}: model_type {found!r}, expected 'mixtral'")
    return MixtralConfig.from_dict(data)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FamilyError(f"cannot read {index}: {exc}") from exc
        if any(Path(n).name != n for n in names):
            raise FamilyError(f"{index}: shards must lie in the folder itself")
        return [folder / n for n in names]
    if (folder / "model.safetensors").exists():
        return [folder / "model.safetensors"]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise FamilyError(f"{folder}: only pickled weights; moehome reads safetensors only")
    raise FamilyError(f"{folder}: no model.safetensors nor model.safetensors.index.json")


def read_tensors(folder: Path, *, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(Path(folder)):
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                    if key in tensors:
                        raise FamilyError(f"{key} is in two shards")
                    tensors[key] = f.get_tensor(key).to(dtype)
        except (SafetensorError, OSError) as exc:
            raise FamilyError(f"cannot read {path}: {exc}") from exc
    return tensors


def read_pretrained(folder: Path, *, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """The folder's config, trainer layers and experts, every tensor accounted for."""
    folder = Path(folder)
    config = read_config(folder)
    expert_spec(config)  # the activation is one moehome's experts have
    tensors = read_tensors(folder, dtype=dtype)
    layers_n, experts_n = config.num_hidden_layers, config.num_local_experts
    inner = config.intermediate_size
    routers: dict[int, torch.Tensor] = {}
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    trunk: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if match := _ROUTER.match(key):
            routers[int(match[1])] = t
        elif match := _EXPERT.match(key):
            experts[int(match[1])][int(match[2])][f"{match[3]}.weight"] = t
        elif match := _FUSED.match(key):
            layer = experts[int(match[1])]
            for e in range(t.shape[0]):
                if match[2] == "gate_up_proj":
                    layer[e]["w1.weight"], layer[e]["w3.weight"] = t[e, :inner], t[e, inner:]
                else:
                    layer[e]["w2.weight"] = t[e]
        else:
            trunk[key] = t
    shapes = trunk_shapes(config)
    _check_tied(folder, config, trunk)
    if config.tie_word_embeddings:
        trunk.pop("lm_head.weight", None)
    if set(trunk) != set(shapes):
        missing, extra = sorted(set(shapes) - set(trunk)), sorted(set(trunk) - set(shapes))
        raise FamilyError(f"{folder}: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, shape in shapes.items():
        if trunk[key].shape != shape:
            raise FamilyError(f"{key}: {list(trunk[key].shape)}, expected {list(shape)}")
    layers = []
    for i in range(layers_n):
        router = routers.get(i)
        if router is None or tuple(router.shape) != (experts_n, config.hidden_size):
            raise FamilyError(f"layer {i}: no router of {experts_n} experts")
        found = experts.get(i, {})
        if sorted(found) != list(range(experts_n)):
            raise FamilyError(f"layer {i}: experts {sorted(found)}, expected 0..{experts_n - 1}")
        for e in range(experts_n):
            if set(found[e]) != set(EXPERT_KEYS):
                raise FamilyError(f"layer {i} expert {e}: tensors {sorted(found[e])}")
        layers.append(LayerWeights((experts_n,), router, [found[e] for e in range(experts_n)]))
    extra_layers = (set(routers) | set(experts)) - set(range(layers_n))
    if extra_layers:
        raise FamilyError(
            f"{folder}: sparse blocks of layers {sorted(extra_layers)} past the config"
        )
    return Checkpoint(config, trunk, layers)


def _check_tied(folder: Path, config: MixtralConfig, trunk: dict[str, torch.Tensor]) -> None:
    """The output head as config.json says: its own ``lm_head.weight``, or the embedding's
    (a head of its own beside tied embeddings would be dropped, as transformers does)."""
    head, embedding = trunk.get("lm_head.weight"), trunk.get("model.embed_tokens.weight")
    if not config.tie_word_embeddings and head is None and embedding is not None:
        raise FamilyError(
            f"{folder}: no lm_head.weight, and config.json's tie_word_embeddings is false "
            "(true if the output head shares the embedding's weights)"
        )
    if (
        config.tie_word_embeddings
        and head is not None
        and embedding is not None
        and (head.shape != embedding.shape or not torch.equal(head, embedding))
    ):
        raise FamilyError(
            f"{folder}: config.json ties the output head to the embedding "
            "(tie_word_embeddings), but lm_head.weight differs from it"
        )


def model_from_checkpoint(
    checkpoint: Checkpoint,
    *,
    beam_search: bool = False,
    attn_implementation: str | None = None,
) -> MixtralLanguageModel:
    """A model holding the checkpoint, its experts local (moehome's SwiGLU experts)."""
    config = checkpoint.config
    spec = expert_spec(config)

    def make_block(i: int) -> LocalGridMixture:
        layer = checkpoint.layers[i]
        gate = GridGate(config.hidden_size, layer.grid)
        modules = [build_expert(spec) for _ in layer.experts]
        return LocalGridMixture(gate, modules, config.num_experts_per_tok, beam_search=beam_search)

    model = MixtralLanguageModel(config, make_block, attn_implementation=attn_implementation)
    state = dict(checkpoint.trunk)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    for i, layer in enumerate(checkpoint.layers):
        state[f"model.layers.{i}.mlp.gate.proj.weight"] = layer.gate
        for e, expert in enumerate(layer.experts):
            for name, t in expert.items():
                state[f"model.layers.{i}.mlp.experts.{e}.{name}"] = t
    model.load_state_dict(state, strict=True)
    return model


def load_pretrained(
    folder: Path,
    *,
    beam_search: bool = False,
    attn_implementation: str | None = None,
) -> MixtralLanguageModel:
    """``model_from_checkpoint`` of ``read_pretrained`` (float32)."""
    return model_from_checkpoint(
        read_pretrained(folder), beam_search=beam_search, attn_implementation=attn_implementation
    )
