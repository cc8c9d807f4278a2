"""``RemoteMixtureOfExperts``: a layer whose experts are volunteers' servers.

Per batch: gating scores over the grid, beam search for the top-k *live* experts of every
sample, forward calls to all chosen experts at once, continuing once every sample has
``k_min`` answers plus at most ``timeout_after_k_min`` for stragglers; failed, late and
NaN/inf answers are masked out of the softmax. Backward goes only to experts that answered
the forward pass, to the same server (or one with the same weights).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import trio
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from core.experts.uid import Grid
from core.moe import beams
from core.moe.beams import Routing
from core.moe.client import (
    DUMMY,
    ExpertCaller,
    ExpertCallError,
    ExpertServerRef,
    ForwardResult,
    Portal,
    same_weights,
)
from core.moe.dispatch import Answers, Dispatch, Span
from core.moe.finder import ExpertFinder
from core.moe.load import BACKWARD_UNITS, FORWARD_UNITS, Piece

log = logging.getLogger(__name__)


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
    #: seconds training batches spent, summed over them, finding their experts' servers
    #: (the plan), in their forward calls and in their backward calls (event loop's
    #: clock, from the first call out to the last answer or the deadline): beside the
    #: steps' own seconds, where a batch's time goes (benchmarks/swarm_scaling.py)
    plan_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0


@dataclass
class _Plan:
    """One forward pass's routing, kept for its backward pass."""

    routing: Routing  # on the gate's device
    dispatch: Dispatch  # its pairs grouped by expert (host tensors)
    names: dict[int, str]  # uid of each chosen expert (flat index)
    servers: dict[str, list[ExpertServerRef]]
    keep: bool = False  # ask servers to keep forward graphs (a backward pass follows)
    # filled by the forward calls: each answered call's result; an expert's rows may go
    # to several of its servers in parts (ServerLoads.parts)
    answered: dict[Span, ForwardResult] = field(default_factory=dict)


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
        plan = self.portal.run(self._plan, [p.detach() for p in per_dim], torch.is_grad_enabled())
        outputs, alive = _RemoteCallMany.apply(DUMMY, self, plan, x)  # type: ignore[no-untyped-call]

        # gating scores of the chosen experts: the sum of their per-dimension scores
        # (slots without an expert hold expert 0, and are masked out below)
        coords = beams.coordinates(plan.routing.experts, self.grid.shape)
        chosen = sum(p.gather(1, coords[:, :, d]) for d, p in enumerate(per_dim))
        assert isinstance(chosen, torch.Tensor)
        chosen = chosen.masked_fill(alive == 0, float("-inf"))
        # in float32 whatever the model's dtype, as Mixtral's router; rows with no expert: zeros
        weights = torch.softmax(chosen.float(), dim=1).nan_to_num(0.0)
        weights = weights.view(*weights.shape, *([1] * (x.dim() - 1))).to(outputs.dtype)
        mixed: torch.Tensor = (weights * outputs).sum(dim=1)
        return mixed

    async def _plan(self, per_dim: Sequence[torch.Tensor], keep: bool) -> _Plan:
        """The routing and the chosen experts' servers; ``keep``: a backward pass follows
        (servers keep their forward graphs)."""
        started = trio.current_time()
        routing = await self.finder.route(per_dim, self.config.k_best)
        dispatch = Dispatch.of(routing)
        names = {e: self.finder.uid_name(e) for e in dispatch.experts}
        servers = await self.finder.servers_many(list(names.values()))
        if keep:
            self.stats.plan_s += trio.current_time() - started
        return _Plan(routing, dispatch, names, servers, keep=keep)

    # ---- the calls (trio side)

    def _calls(self, plan: _Plan) -> dict[Span, Hashable | None]:
        """Each chosen expert's sample rows as calls, with the server each is pinned to:
        an expert's rows are split over its servers when its work is long enough, the
        phase's work levelled over them (core/moe/load.py ``ServerLoads.plan``); a call
        not pinned (None) goes to the server ranked first when it is sent. Experts
        nobody serves get no call."""
        loads = self.caller.loads
        units = FORWARD_UNITS + (BACKWARD_UNITS if plan.keep else 0.0)
        experts = plan.dispatch.expert_rows()
        served = [plan.servers.get(plan.names[e]) or [] for e, _ in experts]
        if loads is None:
            planned: list[list[Piece] | None] = [None] * len(experts)
        else:
            requests = [
                ([s.peer_id for s in servers], rows)
                for servers, (_, rows) in zip(served, experts, strict=True)
            ]
            # calls that lead to contributions keep each expert's rounds hearing enough
            # of its servers (core/moe/voices.py), as the choice when sent does
            voices = self.caller.voices if plan.keep else None
            unheard = shares = None
            if voices is not None:
                unheard = [
                    voices.unheard(plan.names[e], ids)
                    for (e, _), (ids, _) in zip(experts, requests, strict=True)
                ]
                shares = [voices.floor(max(1, len(ids))) for ids, _ in requests]
            planned = loads.plan(requests, units, trio.current_time(), unheard, shares)
        cuts: list[list[tuple[int, int]]] = []
        pinned: list[Hashable | None] = []
        for servers, (_, rows), pieces in zip(served, experts, planned, strict=True):
            if not servers:
                cuts.append([])
            elif pieces is None:
                cuts.append([(0, rows)])
                pinned.append(None)
            else:
                cuts.append([(p.start, p.stop) for p in pieces])
                pinned.extend(p.server for p in pieces)
        return dict(zip(plan.dispatch.spans_cut(cuts), pinned, strict=True))

    async def _forward_calls(self, plan: _Plan, x: torch.Tensor) -> Answers:
        cfg = self.config
        calls = self._calls(plan)
        grouped = plan.dispatch.gather(x)
        answers = plan.dispatch.buffer(x.shape[1:], x.dtype)
        counts = torch.zeros(x.shape[0], dtype=torch.int32)
        unanswered = set(calls)
        late_rows = 0
        enough = trio.Event()
        finished = trio.Event()

        def check() -> None:
            if not unanswered:
                finished.set()
                enough.set()
            elif int(counts.min()) >= cfg.k_min:
                enough.set()

        async def call(span: Span, rows: torch.Tensor) -> None:
            uid = plan.names[span.expert]
            try:
                result = await self.caller.forward(
                    uid, plan.servers[uid], rows, keep=plan.keep, prefer=calls[span]
                )
                y = result.outputs
                if cfg.detect_anomalies and not torch.isfinite(y).all():
                    self.stats.anomalies += 1
                    self.finder.report_failure(result.server)
                    log.warning("%s answered NaN or infinity; masked out", uid)
                else:
                    answers.put(span, y)
                    plan.answered[span] = result
                    self.stats.answered_by[str(result.server.peer_id)] += 1
                    old = self.stats.versions.get(uid, 0)
                    self.stats.versions[uid] = max(old, result.server.version)
                    counts.index_add_(0, plan.dispatch.rows_of(span), _ones(span.rows))
            except ExpertCallError as exc:
                self.stats.failed_calls += 1
                log.info("expert %s failed: %s", uid, exc)
            finally:
                unanswered.discard(span)
                check()

        self.stats.batches += 1
        self.stats.expert_calls += len(calls)
        for span in calls:
            if span.part == 0:
                self.stats.called[plan.names[span.expert]] += 1
        if x.shape[0]:
            check()
        else:
            enough.set()
            finished.set()
        started = trio.current_time()
        with trio.move_on_after(cfg.forward_timeout):
            async with trio.open_nursery() as nursery:
                for span in calls:
                    nursery.start_soon(call, span, grouped[span.start : span.stop])
                await enough.wait()
                with trio.move_on_after(cfg.timeout_after_k_min):
                    await finished.wait()
                self.stats.late_calls += len(unanswered)
                late_rows = sum(span.rows for span in unanswered)  # cancelling empties it
                nursery.cancel_scope.cancel()
        if plan.keep:
            self.stats.forward_s += trio.current_time() - started
            self.stats.forward_rows += sum(span.rows for span in plan.answered)
            self.stats.late_rows += late_rows
        if x.shape[0] and int(counts.min()) < cfg.k_min and not cfg.allow_zero_outputs:
            short = int((counts < cfg.k_min).sum())
            raise MoEError(
                f"{short} of {x.shape[0]} samples got fewer than k_min={cfg.k_min} answers"
            )
        return answers

    async def _backward_calls(
        self, plan: _Plan, x: torch.Tensor, grads: dict[Span, torch.Tensor]
    ) -> Answers:
        cfg = self.config
        out = plan.dispatch.buffer(x.shape[1:], x.dtype)
        done: set[Span] = set()
        spans = list(grads)
        grouped = plan.dispatch.gather(x)

        async def call(span: Span) -> None:
            uid = plan.names[span.expert]
            result = plan.answered[span]
            same = same_weights(result.server, plan.servers[uid])
            try:
                grad = await self.caller.backward(
                    uid, same, grouped[span.start : span.stop], grads[span], kept=result
                )
                out.put(span, grad)
                done.add(span)
            except ExpertCallError as exc:
                self.stats.failed_calls += 1
                log.info("backward of %s failed: %s", uid, exc)

        started = trio.current_time()
        with trio.move_on_after(cfg.backward_timeout):
            async with trio.open_nursery() as nursery:
                for span in spans:
                    nursery.start_soon(call, span)
        self.stats.backward_s += trio.current_time() - started
        counts = torch.zeros(x.shape[0], dtype=torch.int32)
        needed = torch.zeros(x.shape[0], dtype=torch.bool)
        for span in spans:
            rows = plan.dispatch.rows_of(span)
            needed[rows] = True
            if span in done:
                counts.index_add_(0, rows, _ones(span.rows))
        self.stats.backward_rows += sum(span.rows for span in done)
        if (
            bool(needed.any())
            and int(counts[needed].min()) < cfg.backward_k_min
            and not cfg.allow_zero_outputs
        ):
            raise MoEError(
                f"fewer than backward_k_min={cfg.backward_k_min} experts answered the backward pass"
            )
        return out


def _ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.int32)


class _RemoteCallMany(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        dummy: torch.Tensor,
        layer: RemoteMixtureOfExperts,
        plan: _Plan,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_cpu = x.detach().cpu()
        answers = layer.portal.run(layer._forward_calls, plan, x_cpu)
        outputs, alive = plan.dispatch.combine(answers)
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
        dispatch = plan.dispatch
        spans = sorted(plan.answered, key=lambda s: s.start)
        grouped = dispatch.per_pair(grad_outputs.cpu())  # [N, ...] in dispatch order
        # experts whose outputs did not matter need no call
        mattered = dispatch.any_nonzero(grouped, spans)
        grads = {
            span: g
            for span, g, m in zip(spans, dispatch.take(grouped, spans), mattered, strict=True)
            if m
        }
        answers = layer.portal.run(layer._backward_calls, plan, x, grads)
        grad_x = dispatch.scatter_add(answers, torch.zeros_like(x))
        return None, None, None, grad_x.to(ctx.device)
