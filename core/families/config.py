"""A manifest's ``[model]`` as the family's configuration, and back: the one place that
maps moehome's field names onto ``transformers``' (``hidden`` -> ``hidden_size``,
``grid`` -> ``num_local_experts`` as the product of its sizes, ``k_best`` ->
``num_experts_per_tok``, ...)."""

from __future__ import annotations

import math
from typing import Any

from transformers import MixtralConfig

from core.families.mixtral import FamilyError
from core.project.manifest import ModelSection

#: transformers' Mixtral default; a model's weights start from normal(0, this)
INITIALIZER_RANGE = 0.02


def mixtral_config(model: ModelSection, *, eos_token_id: int | None = None) -> MixtralConfig:
    """The ``MixtralConfig`` of a manifest's ``[model]`` (architecture ``mixtral``)."""
    if model.architecture != "mixtral":
        raise FamilyError(f"architecture {model.architecture!r} is not mixtral")
    return MixtralConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden,
        intermediate_size=model.expert_spec().inner_dim,
        num_hidden_layers=model.mixture_layers,
        num_attention_heads=model.attention_heads,
        num_key_value_heads=model.key_value_heads,
        head_dim=model.hidden // model.attention_heads,
        hidden_act=model.expert_spec().activation,
        max_position_embeddings=model.context,
        initializer_range=INITIALIZER_RANGE,
        rms_norm_eps=model.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": model.rope_theta},
        sliding_window=None,
        num_local_experts=model.experts_per_layer,
        num_experts_per_tok=model.k_best,
        output_router_logits=model.router_aux_loss > 0,
        router_aux_loss_coef=model.router_aux_loss,
        tie_word_embeddings=model.tie_embeddings,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
    )


def model_fields(config: MixtralConfig, *, grid: list[int] | None = None) -> dict[str, Any]:
    """A manifest's ``[model]`` fields for ``config`` (``moehome owner new --from``). The
    grid is one-dimensional by default: only then does the grid gate hold any router
    exactly (a grid's scores add across its dimensions, a rank-limited router)."""
    experts = int(config.num_local_experts)
    grid = grid or [experts]
    if math.prod(grid) != experts:
        raise FamilyError(f"grid {grid} holds {math.prod(grid)} experts, the model {experts}")
    window = getattr(config, "sliding_window", None)
    if window and window < config.max_position_embeddings:
        raise FamilyError(
            f"sliding_window {window}: moehome's Mixtral attends to the whole "
            "context; a checkpoint with a sliding window would be changed"
        )
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim * heads != config.hidden_size:
        raise FamilyError(
            f"head_dim {head_dim} x {heads} heads is not hidden_size {config.hidden_size}"
        )
    return {
        "architecture": "mixtral",
        "dtype": _dtype(config),
        "vocab_size": int(config.vocab_size),
        "hidden": int(config.hidden_size),
        "context": int(min(config.max_position_embeddings, 4096)),
        "mixture_layers": int(config.num_hidden_layers),
        "grid": grid,
        "k_best": int(config.num_experts_per_tok),
        "k_min": 1,
        "heads": heads,
        "kv_heads": int(config.num_key_value_heads),
        "rope_theta": float(_rope_theta(config)),
        "rms_norm_eps": float(config.rms_norm_eps),
        "router_aux_loss": float(config.router_aux_loss_coef),
        "tie_embeddings": bool(config.tie_word_embeddings),
        "expert": {
            "kind": "swiglu",
            "hidden": int(config.hidden_size),
            "inner": int(config.intermediate_size),
            "activation": str(config.hidden_act),
            "blocks": 1,  # a Mixtral expert is one SwiGLU block
        },
    }


def _dtype(config: MixtralConfig) -> str:
    """The checkpoint's own dtype where it names a 16-bit one the experts can hold (a
    float32 checkpoint stays float32: its owner chose full precision)."""
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", "") or "")
    name = dtype.removeprefix("torch.")
    return name if name in ("bfloat16", "float16", "float32") else "bfloat16"


def _rope_theta(config: MixtralConfig) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise FamilyError(
            f"rope_type {rope['rope_type']!r}: moehome's Mixtral uses the default rotary embedding"
        )
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 1e6)))
