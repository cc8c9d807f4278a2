"""Mixtral-style models from ``transformers``' own layers, with a pluggable sparse block.

    tokens -> embed_tokens
           -> [h += self_attn(input_layernorm(h));                     (transformers)
               h += mlp(post_attention_layernorm(h))] x num_hidden_layers  (moehome)
           -> norm -> lm_head

Attention (rotary embeddings, grouped-query heads, the causal or sliding-window mask),
the RMS norms and the rotary embedding are ``transformers``' Mixtral classes, built from
a ``MixtralConfig``; only the wiring of the residual stream is written here. Every
module is named as in ``MixtralForCausalLM`` (``model.layers.0.self_attn.q_proj`` ...),
so the trainer's layers are the family's checkpoint keys as they are.

The sparse block of a layer (``mlp``) is any module that takes the normed hidden states
[batch, seq, hidden] and returns ``(output [batch, seq, hidden], router_logits
[batch * seq, experts])``, the logits over every expert of the layer (for the
load-balancing loss and for export). ``LocalGridMixture`` is one, with its experts in
this process: a grid gate and SwiGLU experts (core/experts/registry.py), for tests and
for the reference model; the trainer's is the remote mixture.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import MixtralConfig
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.mixtral.modeling_mixtral import (
    MixtralAttention,
    MixtralRMSNorm,
    MixtralRotaryEmbedding,
)

from core.experts.registry import ACTIVATIONS, ExpertSpec, build_expert
from core.experts.spec import seed_for
from core.experts.uid import Grid
from core.families.routing import (
    GridGate,
    beam_search_top_k,
    chosen_weights,
    full_scores,
    route_top_k,
)

#: Builds the sparse block of one layer: layer index -> module (see the module's doc).
BlockFactory = Callable[[int], nn.Module]


class FamilyError(ValueError):
    """A configuration or checkpoint that moehome cannot hold exactly."""


def expert_spec(config: MixtralConfig, *, dtype: str = "float32") -> ExpertSpec:
    """The spec of one of ``config``'s experts: moehome's SwiGLU kind, whose parameters
    are one expert's ``w1``, ``w2`` and ``w3``."""
    act = config.hidden_act
    if act not in ACTIVATIONS:
        raise FamilyError(
            f"hidden_act {act!r}: moehome's experts gate with one of {sorted(ACTIVATIONS)}"
        )
    return ExpertSpec(
        "swiglu",
        hidden=config.hidden_size,
        inner=config.intermediate_size,
        activation=act,
        dtype=dtype,
    )


def _own_config(config: MixtralConfig, attn_implementation: str | None) -> MixtralConfig:
    own = copy.deepcopy(config)
    own._attn_implementation = attn_implementation or config._attn_implementation or "sdpa"
    return own


@dataclass(frozen=True)
class MixtralOutput:
    logits: torch.Tensor  # [batch, seq, vocab]
    #: per layer, every expert's router logits [batch * seq, experts]
    router_logits: tuple[torch.Tensor, ...]


class DecoderLayer(nn.Module):
    """``MixtralDecoderLayer``'s wiring around a pluggable sparse block."""

    def __init__(self, config: MixtralConfig, index: int, block: nn.Module) -> None:
        super().__init__()
        self.self_attn = MixtralAttention(config, index)
        self.mlp = block
        self.input_layernorm = MixtralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MixtralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attended, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        hidden_states = hidden_states + attended
        mixed, router_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        out: torch.Tensor = hidden_states + mixed
        return out, router_logits


class MixtralDecoder(nn.Module):
    """``MixtralModel``'s parts and order: embeddings, layers, final norm."""

    def __init__(self, config: MixtralConfig, make_block: BlockFactory) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, make_block(i)) for i in range(config.num_hidden_layers)
        )
        self.norm = MixtralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MixtralRotaryEmbedding(config=config)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        hidden_states = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        mask_function = (
            create_causal_mask
            if self.config.sliding_window is None
            else create_sliding_window_causal_mask
        )
        mask = mask_function(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=None,
            position_ids=position_ids,
        )
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        router_logits = []
        for layer in self.layers:
            hidden_states, logits = layer(hidden_states, position_embeddings, mask, position_ids)
            router_logits.append(logits)
        out: torch.Tensor = self.norm(hidden_states)
        return out, tuple(router_logits)


class MixtralLanguageModel(nn.Module):
    """``MixtralForCausalLM``'s modules under the same names, each layer's sparse block
    made by ``make_block``. With ``tie_word_embeddings``, ``lm_head`` shares the
    embedding's weight, as in ``transformers``."""

    def __init__(
        self,
        config: MixtralConfig,
        make_block: BlockFactory,
        *,
        attn_implementation: str | None = None,
    ) -> None:
        super().__init__()
        self.config = _own_config(config, attn_implementation)
        self.model = MixtralDecoder(self.config, make_block)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> MixtralOutput:
        """input_ids [batch, seq] int64 (attention_mask [batch, seq]: 1 for tokens, 0 for
        padding) -> logits and each layer's router logits."""
        hidden_states, router_logits = self.model(input_ids, attention_mask)
        return MixtralOutput(self.lm_head(hidden_states), router_logits)

    def blocks(self) -> list[nn.Module]:
        """Each layer's sparse block."""
        blocks = []
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            blocks.append(layer.mlp)
        return blocks

    def reset_trunk(self) -> None:
        """Initialize the trainer's layers as ``transformers`` initializes Mixtral's:
        normal(0, initializer_range) for every projection, embedding and router (a grid
        gate's rows scaled so that the router over all experts has that deviation),
        norms to one. Experts keep their own (published) initial weights."""
        std = self.config.initializer_range
        nn.init.normal_(self.model.embed_tokens.weight, std=std)
        nn.init.normal_(self.lm_head.weight, std=std)
        for module in self.modules():
            if isinstance(module, MixtralAttention):
                for proj in (module.q_proj, module.k_proj, module.v_proj, module.o_proj):
                    nn.init.normal_(proj.weight, std=std)
            elif isinstance(module, GridGate):
                nn.init.normal_(module.proj.weight, std=std / len(module.shape) ** 0.5)
            elif isinstance(module, MixtralRMSNorm):
                nn.init.ones_(module.weight)
        padding = self.model.embed_tokens.padding_idx
        if padding is not None:
            with torch.no_grad():
                self.model.embed_tokens.weight[padding].zero_()


def build_model(
    config: MixtralConfig,
    make_block: BlockFactory,
    *,
    seed: int,
    attn_implementation: str | None = None,
    model_class: Callable[[MixtralConfig, BlockFactory], MixtralLanguageModel] | None = None,
) -> MixtralLanguageModel:
    """The model with deterministic trainer-side weights (``reset_trunk``): the same
    ``seed`` gives the same trainer layers whatever the blocks are (remote or local).
    ``model_class``: a subclass's constructor (the trainer's)."""
    with torch.random.fork_rng(devices=[]):
        if model_class is None:
            model = MixtralLanguageModel(
                config, make_block, attn_implementation=attn_implementation
            )
        else:
            model = model_class(config, make_block)
        # drawn after every block is built: blocks of any kind draw any amount
        torch.manual_seed(seed)
        model.reset_trunk()
    return model


class LocalGridMixture(nn.Module):
    """A sparse block whose experts all live in this process: a grid gate over
    ``prod(grid)`` experts (in the grid's order), each token's k chosen and mixed with
    Mixtral's weights. ``beam_search`` chooses them as the trainer does (moehome's beam
    search over the grid, then the softmax over the chosen scores); without it, the top
    k of all experts' logits (the same experts, vectorized)."""

    #: its experts stand for volunteers' (core/trainer/optimizers.py: Muon leaves them)
    stands_for_volunteers = True

    def __init__(
        self,
        gate: GridGate,
        experts: Sequence[nn.Module],
        top_k: int,
        *,
        beam_search: bool = False,
    ) -> None:
        super().__init__()
        if len(experts) != gate.experts:
            raise ValueError(f"a grid {list(gate.shape)} needs {gate.experts} experts")
        if not 1 <= top_k <= gate.experts:
            raise ValueError(f"top_k must be in 1..{gate.experts}, got {top_k}")
        self.gate = gate
        self.experts = nn.ModuleList(experts)
        self.top_k = top_k
        self.beam_search = beam_search

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        per_dim = self.gate(x)
        logits = full_scores(per_dim)
        if self.beam_search:
            chosen = beam_search_top_k(per_dim, Grid("moe", self.gate.shape), self.top_k)
            weights = chosen_weights(logits, chosen)
        else:
            weights, chosen = route_top_k(logits, self.top_k)
        out = torch.zeros_like(x)
        for e in sorted(set(chosen.flatten().tolist())):
            rows, slots = (chosen == e).nonzero(as_tuple=True)
            y = self.experts[e](x[rows]) * weights[rows, slots].unsqueeze(1)
            out = out.index_add(0, rows, y.to(out.dtype))
        return out.view_as(hidden_states), logits


def local_mixture(
    config: MixtralConfig,
    grid: Grid,
    *,
    weights_seed: int,
    beam_search: bool = False,
) -> LocalGridMixture:
    """A layer's local block with the published initial experts: expert ``uid`` gets
    seed ``seed_for(weights_seed, uid)``, as ``moehome owner publish`` gives it."""
    spec = expert_spec(config)
    experts = [build_expert(spec, seed=seed_for(weights_seed, str(uid))) for uid in grid]
    gate = GridGate(config.hidden_size, grid.shape)
    return LocalGridMixture(gate, experts, config.num_experts_per_tok, beam_search=beam_search)


def trunk_shapes(config: MixtralConfig) -> dict[str, torch.Size]:
    """The trainer's layers of ``config`` in the family's checkpoint: key -> shape, the
    sparse blocks left out (``lm_head.weight`` too when it is tied to the embedding)."""
    with torch.device("meta"):
        skeleton = MixtralLanguageModel(config, lambda _i: nn.Identity())
    shapes = {key: t.shape for key, t in skeleton.state_dict().items()}
    if config.tie_word_embeddings:
        del shapes["lm_head.weight"]
    return shapes
