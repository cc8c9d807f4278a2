"""The trainer's model: a byte-level language model whose feed-forward layers are
mixtures of experts.

    bytes -> embedding + position
          -> [causal self-attention (trainer) -> mixture of experts (swarm)] x mixture_layers
          -> norm -> next-byte logits

The trainer-side layers (embeddings, attention, gating, output) are small and trained by
the trainer itself; the experts hold most of the parameters and are trained by the
volunteers and aggregators. Routing is per token: each token's hidden state chooses its
experts, so nothing about later tokens reaches earlier ones (routing a whole sequence by
its mean would leak the future into every position).

``LocalMixtureOfExperts`` is the same layer with its experts in this process, with the
same routing (the same beam search over the grid), for the reference runs that the swarm
is compared against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from core.experts import activations
from core.experts.activations import WireCodecs
from core.experts.registry import ExpertSpec, build_expert
from core.experts.spec import seed_for
from core.experts.uid import Grid
from core.moe.beams import beam_search
from core.moe.dispatch import Dispatch
from core.moe.mixture import RemoteMixtureOfExperts
from core.project.manifest import ModelSection

#: Builds the mixture of one layer: (layer index, its grid) -> module on [tokens, hidden].
MixtureFactory = Callable[[int, Grid], nn.Module]


def attention_heads(hidden: int) -> int:
    """Heads of the trainer-side attention: 16-wide heads, as many as divide ``hidden``."""
    for heads in (hidden // 16, 4, 2):
        if heads >= 1 and hidden % heads == 0:
            return heads
    return 1


class CausalSelfAttention(nn.Module):
    """Pre-norm self-attention over earlier positions only, with a residual connection."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, attention_heads(hidden), batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        length = x.shape[1]
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        attended, _ = self.attn(h, h, h, attn_mask=future, need_weights=False)
        out: torch.Tensor = x + attended
        return out


class TrainerModel(nn.Module):
    """What a trainer trains, whatever its family: tokens [batch, length] in, the loss
    out, its mixture layers' experts remote (core/trainer/session.py)."""

    #: tokens per training sample
    context: int

    def objective(
        self, tokens: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss to minimize, the next-token loss in nats: what evaluations report)."""
        raise NotImplementedError

    def remote_mixtures(self) -> list[RemoteMixtureOfExperts]:
        """The mixtures whose experts are volunteers' (their statistics, their calls)."""
        raise NotImplementedError


class CharLanguageModel(TrainerModel):
    def __init__(self, model: ModelSection, mixtures: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(mixtures) != model.mixture_layers:
            raise ValueError(f"{model.mixture_layers} mixture layers, got {len(mixtures)}")
        self.context = model.context
        self.embed = nn.Embedding(model.vocab_size, model.hidden)
        self.position = nn.Embedding(model.context, model.hidden)
        self.attention = nn.ModuleList(CausalSelfAttention(model.hidden) for _ in mixtures)
        self.mixtures = nn.ModuleList(mixtures)
        self.norm = nn.LayerNorm(model.hidden)
        self.head = nn.Linear(model.hidden, model.vocab_size)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, length <= context] int64 -> logits [batch, length, vocab]."""
        batch, length = tokens.shape
        positions = torch.arange(length, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for attention, mixture in zip(self.attention, self.mixtures, strict=True):
            x = attention(x)
            # experts take [tokens, hidden]: every token is routed on its own
            x = mixture(x.reshape(batch * length, -1)).reshape(batch, length, -1)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits

    def objective(
        self, tokens: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss = language_model_loss(self(tokens), targets)
        return loss, loss

    def remote_mixtures(self) -> list[RemoteMixtureOfExperts]:
        return [m for m in self.mixtures if isinstance(m, RemoteMixtureOfExperts)]


def build_model(
    model: ModelSection, make_mixture: MixtureFactory, *, seed: int
) -> CharLanguageModel:
    """The model with deterministic trainer-side weights: the same ``seed`` gives the same
    initial model whatever the mixtures are (remote or local)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mixtures = [make_mixture(i, grid) for i, grid in enumerate(model.grids())]
        return CharLanguageModel(model, mixtures)


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next byte, in nats."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LocalMixtureOfExperts(nn.Module):
    """A mixture whose experts all live in this process and are all alive: the reference
    for the swarm. Same gating, same beam search, same softmax over the chosen experts."""

    #: its experts stand for volunteers' (core/trainer/optimizers.py: Muon leaves them)
    stands_for_volunteers = True

    def __init__(
        self,
        *,
        in_features: int,
        grid: Grid,
        spec: ExpertSpec,
        k_best: int,
        weights_seed: int,
        codecs: WireCodecs | None = None,
    ) -> None:
        super().__init__()
        self.grid = grid
        #: with codecs, every expert's inputs, outputs and their gradients lose what the
        #: wire would lose (the reference for a project's compression)
        self.codecs = codecs
        self.k_best = k_best
        self.proj = nn.Linear(in_features, sum(grid.shape))
        self.uids = [str(uid) for uid in grid]
        # the published initial weights: the same seed per uid as `moehome owner publish`,
        # held in float32 as an aggregator holds them (rounded to the project's dtype
        # first, as published) and computing in the project's dtype, as volunteers do
        self.compute_dtype = spec.torch_dtype
        self.experts = nn.ModuleList(
            build_expert(spec, seed=seed_for(weights_seed, uid)).float() for uid in self.uids
        )
        self._index = {uid: i for i, uid in enumerate(self.uids)}
        # a buffer, so that it moves with the module to the trainer's device
        self._coords: torch.Tensor
        self.register_buffer(
            "_coords", torch.tensor([uid.coords for uid in grid]), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(x)
        per_dim = logits.split(list(self.grid.shape), dim=-1)
        # every expert alive: the beam search as tensor operations on x's device
        routing = beam_search([p.detach() for p in per_dim], self.k_best)
        chosen = routing.experts
        coords = self._coords[chosen]
        gate = sum(p.gather(1, coords[:, :, d]) for d, p in enumerate(per_dim))
        assert isinstance(gate, torch.Tensor)
        weights = torch.softmax(gate, dim=1)
        out = torch.zeros_like(x)
        dispatch = Dispatch.of(routing)
        for span in dispatch.spans():
            rows = dispatch.rows_of(span).to(x.device)
            slots = dispatch.slots[span.start : span.stop].to(x.device)
            y = self._through_wire(self.experts[span.expert], x[rows])
            out = out.index_add(0, rows, weights[rows, slots].unsqueeze(1) * y)
        return out

    def _expert(self, expert: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``expert`` as a volunteer computes it: weights and inputs in the project's
        dtype (gradients flow back to the float32 weights)."""
        if self.compute_dtype == x.dtype:
            out: torch.Tensor = expert(x)
            return out
        params = {n: p.to(self.compute_dtype) for n, p in expert.named_parameters()}
        y = torch.func.functional_call(expert, params, (x.to(self.compute_dtype),))
        assert isinstance(y, torch.Tensor)
        return y.to(x.dtype)

    def _through_wire(self, expert: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.codecs is None or self.codecs == WireCodecs():
            return self._expert(expert, x)
        sent = _WireBoundary.apply(x, self.codecs)  # type: ignore[no-untyped-call]
        y = _WireBoundary.apply(self._expert(expert, sent), self.codecs)  # type: ignore[no-untyped-call]
        assert isinstance(y, torch.Tensor)
        return y


class _WireBoundary(torch.autograd.Function):
    """Identity, but for what the wire loses: the forward value through the activation
    codec, its gradient through the gradient codec (rounded at random, as on the wire)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, codecs: WireCodecs) -> torch.Tensor:
        ctx.codecs = codecs
        return activations.roundtrip(t, codecs.activations)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = activations.roundtrip(grad.contiguous(), ctx.codecs.gradients, stochastic=True)
        return grad, None
