"""``RemoteMixtureOfExperts``: a layer whose experts are volunteers' servers.

Per batch: gating scores over the grid, beam search for the top-k *live* experts of every
sample, forward calls to all chosen experts at once, continuing once every sample has
``k_min`` answers plus at most ``timeout_after_k_min`` for stragglers; failed, late and
NaN/inf answers are masked out of the softmax. Backward goes only to experts that answered
the forward pass, to the same server (or one with the same weights).
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import trio
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from core.experts.uid import ExpertUID, Grid
from core.moe.client import (
    DUMMY,
    ExpertCaller,
    ExpertCallError,
    ExpertServerRef,
    ForwardResult,
    Portal,
    same_weights,
)
from core.moe.finder import ExpertFinder
from core.moe.load import BACKWARD_UNITS, FORWARD_UNITS

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1 << 16)
def _coords(uid: str) -> tuple[int, ...]:
    return ExpertUID.parse(uid).coords


class MoEError(RuntimeError):
    """Too few experts answered for some sample."""


@dataclass(frozen=True)
class MoEConfig:
    k_best: int = 4
    k_min: int = 1
    forward_timeout: float = 10.0
    timeout_after_k_min: float = 1.0
    backward_k_min: int = 1
    backward_timeout: float = 20.0
    #: Treat answers with NaN or infinity as failures.
    detect_anomalies: bool = True
    #: When fewer than k_min experts answer for a sample, give it a zero output instead of
    #: raising MoEError.
    allow_zero_outputs: bool = False


@dataclass
class MoEStatistics:
    batches: int = 0
    expert_calls: int = 0
    failed_calls: int = 0
    anomalies: int = 0
    late_calls: int = 0
    #: sample rows of training batches (a backward pass follows) each expert computed:
    #: forward rows answered in time, forward rows of calls too late to use (computed
    #: for nothing), backward rows answered. They weigh the volunteers' work used
    forward_rows: int = 0
    late_rows: int = 0
    backward_rows: int = 0
    called: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: answers per serving peer (str of its PeerID)
    answered_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: the newest weights version seen answering, per expert
    versions: dict[str, int] = field(default_factory=dict)


#: one call of a forward pass: the expert's uid and which part of its rows
Call = tuple[str, int]


@dataclass
class _Plan:
    """One forward pass's routing, kept for its backward pass."""

    uids: list[list[str]]  # per sample, the chosen experts (at most k)
    servers: dict[str, list[ExpertServerRef]]
    keep: bool = False  # ask servers to keep forward graphs (a backward pass follows)
    # filled by the forward calls: (uid, part) -> (the answer, sample rows); an expert's
    # rows may go to several of its servers in parts (ServerLoads.parts)
    answered: dict[Call, tuple[ForwardResult, list[int]]] = field(default_factory=dict)


class RemoteMixtureOfExperts(nn.Module):
    def __init__(
        self,
        *,
        in_features: int,
        grid: Grid,
        finder: ExpertFinder,
        caller: ExpertCaller,
        portal: Portal,
        config: MoEConfig | None = None,
        own_gate: bool = True,
    ) -> None:
        """``own_gate=False``: no gate of its own; the caller gives ``mix`` the scores
        (a model family's gate, core/families)."""
        super().__init__()
        self.grid = grid
        self.finder = finder
        self.caller = caller
        self.portal = portal
        self.config = config or MoEConfig()
        if not 1 <= self.config.k_min <= self.config.k_best:
            raise ValueError("need 1 <= k_min <= k_best")
        self.proj = nn.Linear(in_features, sum(grid.shape)) if own_gate else None
        self.stats = MoEStatistics()
        caller.on_failure = finder.report_failure
        caller.on_latency = finder.report_latency

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [batch, hidden] or [batch, seq, hidden]; each sample is routed as a whole."""
        if self.proj is None:
            raise TypeError("this mixture has no gate of its own: call mix() with scores")
        logits = self.proj(x if x.dim() == 2 else x.mean(dim=1))
        return self.mix(x, logits.split(list(self.grid.shape), dim=-1))

    def mix(self, x: torch.Tensor, per_dim: Sequence[torch.Tensor]) -> torch.Tensor:
        """The chosen experts' outputs for ``x``, mixed by the softmax of their scores:
        ``per_dim`` holds each grid dimension's scores [batch, n_d]."""
        batch, k = x.shape[0], self.config.k_best
        scores = [p.detach().float().tolist() for p in per_dim]
        plan = self.portal.run(self._plan, scores)
        plan.keep = torch.is_grad_enabled()
        outputs, alive = _RemoteCallMany.apply(DUMMY, self, plan, x)  # type: ignore[no-untyped-call]

        # gating scores of the chosen experts: the sum of their per-dimension scores
        # (one tensor built from lists: a per-token loop of small tensors costs ~50 ms
        # for 1024 tokens)
        pad = (0,) * len(self.grid.shape)
        coords = torch.tensor(
            [[_coords(u) for u in uids] + [pad] * (k - len(uids)) for uids in plan.uids],
            dtype=torch.long,
            device=x.device,
        ).view(batch, k, len(self.grid.shape))
        chosen = sum(p.gather(1, coords[:, :, d]) for d, p in enumerate(per_dim))
        assert isinstance(chosen, torch.Tensor)
        chosen = chosen.masked_fill(alive == 0, float("-inf"))
        # in float32 whatever the model's dtype, as Mixtral's router; rows with no expert: zeros
        weights = torch.softmax(chosen.float(), dim=1).nan_to_num(0.0)
        weights = weights.view(batch, k, *([1] * (x.dim() - 1))).to(outputs.dtype)
        mixed: torch.Tensor = (weights * outputs).sum(dim=1)
        return mixed

    async def _plan(self, scores: Sequence[Sequence[Sequence[float]]]) -> _Plan:
        uids = await self.finder.beam_search(scores, self.config.k_best)
        servers = await self.finder.servers_many([u for sample in uids for u in sample])
        return _Plan(uids, servers)

    # ---- the calls (trio side)

    def _calls(self, plan: _Plan) -> dict[Call, list[int]]:
        """Each chosen expert's sample rows, split over its servers when its work is long
        enough (core/moe/load.py ``split_parts``)."""
        rows_of: dict[str, list[int]] = defaultdict(list)
        for b, uids in enumerate(plan.uids):
            for uid in uids:
                if plan.servers.get(uid):
                    rows_of[uid].append(b)
        loads = self.caller.loads
        units = FORWARD_UNITS + (BACKWARD_UNITS if plan.keep else 0.0)
        calls: dict[Call, list[int]] = {}
        for uid, rows in rows_of.items():
            n = 1
            if loads is not None:
                n = loads.parts([s.peer_id for s in plan.servers[uid]], len(rows), units)
            for part in range(n):
                calls[(uid, part)] = rows[part * len(rows) // n : (part + 1) * len(rows) // n]
        return calls

    async def _forward_calls(self, plan: _Plan, x: torch.Tensor) -> dict[Call, torch.Tensor]:
        cfg = self.config
        calls = self._calls(plan)
        answers: dict[Call, torch.Tensor] = {}
        counts = [0] * x.shape[0]
        unanswered = set(calls)
        late_rows = 0
        enough = trio.Event()
        finished = trio.Event()

        def check() -> None:
            if not unanswered:
                finished.set()
                enough.set()
            elif min(counts) >= cfg.k_min:
                enough.set()

        async def call(key: Call, rows: list[int]) -> None:
            uid = key[0]
            try:
                result = await self.caller.forward(uid, plan.servers[uid], x[rows], keep=plan.keep)
                y = result.outputs
                if cfg.detect_anomalies and not torch.isfinite(y).all():
                    self.stats.anomalies += 1
                    self.finder.report_failure(result.server)
                    log.warning("%s answered NaN or infinity; masked out", uid)
                else:
                    answers[key] = y
                    plan.answered[key] = (result, rows)
                    self.stats.answered_by[str(result.server.peer_id)] += 1
                    old = self.stats.versions.get(uid, 0)
                    self.stats.versions[uid] = max(old, result.server.version)
                    for b in rows:
                        counts[b] += 1
            except ExpertCallError as exc:
                self.stats.failed_calls += 1
                log.info("expert %s failed: %s", uid, exc)
            finally:
                unanswered.discard(key)
                check()

        self.stats.batches += 1
        self.stats.expert_calls += len(calls)
        for uid, part in calls:
            if part == 0:
                self.stats.called[uid] += 1
        check()
        with trio.move_on_after(cfg.forward_timeout):
            async with trio.open_nursery() as nursery:
                for key, rows in calls.items():
                    nursery.start_soon(call, key, rows)
                await enough.wait()
                with trio.move_on_after(cfg.timeout_after_k_min):
                    await finished.wait()
                self.stats.late_calls += len(unanswered)
                late_rows = sum(len(calls[key]) for key in unanswered)  # cancelling empties it
                nursery.cancel_scope.cancel()
        if plan.keep:
            self.stats.forward_rows += sum(len(calls[key]) for key in answers)
            self.stats.late_rows += late_rows
        if min(counts, default=cfg.k_min) < cfg.k_min and not cfg.allow_zero_outputs:
            short = sum(c < cfg.k_min for c in counts)
            raise MoEError(
                f"{short} of {len(counts)} samples got fewer than k_min={cfg.k_min} answers"
            )
        return answers

    async def _backward_calls(
        self, plan: _Plan, x: torch.Tensor, grads: dict[Call, torch.Tensor]
    ) -> dict[Call, torch.Tensor]:
        cfg = self.config
        out: dict[Call, torch.Tensor] = {}

        async def call(key: Call) -> None:
            uid = key[0]
            result, rows = plan.answered[key]
            same = same_weights(result.server, plan.servers[uid])
            try:
                out[key] = await self.caller.backward(uid, same, x[rows], grads[key], kept=result)
            except ExpertCallError as exc:
                self.stats.failed_calls += 1
                log.info("backward of %s failed: %s", uid, exc)

        with trio.move_on_after(cfg.backward_timeout):
            async with trio.open_nursery() as nursery:
                for key in grads:
                    nursery.start_soon(call, key)
        counts = [0] * x.shape[0]
        for key in out:
            for b in plan.answered[key][1]:
                counts[b] += 1
        self.stats.backward_rows += sum(len(plan.answered[key][1]) for key in out)
        needed = [b for key in grads for b in plan.answered[key][1]]
        if (
            needed
            and min(counts[b] for b in needed) < cfg.backward_k_min
            and not cfg.allow_zero_outputs
        ):
            raise MoEError(
                f"fewer than backward_k_min={cfg.backward_k_min} experts answered the backward pass"
            )
        return out


class _RemoteCallMany(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        dummy: torch.Tensor,
        layer: RemoteMixtureOfExperts,
        plan: _Plan,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = layer.config.k_best
        x_cpu = x.detach().cpu()
        answers = layer.portal.run(layer._forward_calls, plan, x_cpu)
        outputs = torch.zeros(x.shape[0], k, *x.shape[1:], dtype=x.dtype)
        alive = torch.zeros(x.shape[0], k)
        for key, y in answers.items():
            rows = plan.answered[key][1]
            slots = [plan.uids[b].index(key[0]) for b in rows]
            outputs[rows, slots] = y.to(x.dtype)
            alive[rows, slots] = 1.0
        ctx.layer = layer  # type: ignore[attr-defined]
        ctx.device = x.device  # type: ignore[attr-defined]
        ctx.plan = plan  # type: ignore[attr-defined]
        ctx.save_for_backward(x_cpu)
        ctx.mark_non_differentiable(alive)
        return outputs.to(x.device), alive.to(x.device)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_outputs: torch.Tensor, _grad_alive: torch.Tensor
    ) -> tuple[None, None, None, torch.Tensor]:
        (x,) = ctx.saved_tensors
        layer: RemoteMixtureOfExperts = ctx.layer
        plan: _Plan = ctx.plan
        grad_outputs = grad_outputs.cpu()
        grads: dict[Call, torch.Tensor] = {}
        for key, (_, rows) in plan.answered.items():
            slots = [plan.uids[b].index(key[0]) for b in rows]
            g = grad_outputs[rows, slots].contiguous()
            if g.any():  # experts whose outputs did not matter need no call
                grads[key] = g
        answers = layer.portal.run(layer._backward_calls, plan, x, grads)
        grad_x = torch.zeros_like(x)
        for key, gx in answers.items():
            rows = plan.answered[key][1]
            grad_x.index_add_(0, torch.tensor(rows), gx.to(grad_x.dtype))
        return None, None, None, grad_x.to(ctx.device)
