"""A trainer's routing of one mixture layer at scale, as tensor operations (now) beside
the per-sample path it replaced (before, kept here as it was at 95de286), same run.

    python benchmarks/routing_scale.py [--tokens 8192] [--grid 64 64] [--k 4] [--hidden 64]

Routing is everything between the gate's scores and the mixed output but the calls:
the beam search (the DHT's answers cached, every expert alive), the grouping of rows
per expert, each call's input rows, putting the answers back (an expert here answers
its inputs: no compute) and the softmax mix. The hidden size is small on purpose, so
that the figure is routing and not the copying of activations both paths do alike.
Prints one JSON line: ``routing_us_per_token_layer`` and ``..._before`` (microseconds
per token, best of the repetitions), and ``routing_matches_before`` (the same experts,
in the same order, for every token; and the same mixed output).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.experts.uid import ExpertUID, Grid
from core.moe import beams
from core.moe.dispatch import Answers, Dispatch, Span
from core.moe.finder import advance_beams


def plan_now(
    per_dim: Sequence[torch.Tensor], x: torch.Tensor, grid: Grid, k: int
) -> tuple[beams.Routing, Dispatch, list[Span], torch.Tensor]:
    """Today's path up to the calls (core/moe/finder.py route, mixture.py _plan and
    _forward_calls): the routing, its dispatch, the calls and their inputs."""
    prefix, score = beams.start(x.shape[0], x.device)
    for d, scores in enumerate(per_dim):
        prefix, score = beams.step(
            prefix, score, scores, level_alive(prefix, score, grid, d), k, grid.shape[:d]
        )
    routing = beams.finish(prefix, score)
    dispatch = Dispatch.of(routing)
    return routing, dispatch, dispatch.spans(), dispatch.gather(x)


def combine_now(
    per_dim: Sequence[torch.Tensor],
    grid: Grid,
    routing: beams.Routing,
    dispatch: Dispatch,
    answers: Answers,
) -> torch.Tensor:
    """Today's path after the calls (mixture.py _RemoteCallMany.forward and mix)."""
    outputs, alive = dispatch.combine(answers)
    coords = beams.coordinates(routing.experts, grid.shape)
    chosen = sum(p.gather(1, coords[:, :, d]) for d, p in enumerate(per_dim))
    assert isinstance(chosen, torch.Tensor)
    chosen = chosen.masked_fill(alive == 0, float("-inf"))
    weights = torch.softmax(chosen.float(), dim=1).nan_to_num(0.0).unsqueeze(-1)
    return (weights * outputs).sum(dim=1)


def answer_now(
    dispatch: Dispatch, spans: list[Span], grouped: torch.Tensor, x: torch.Tensor
) -> Answers:
    """The calls (not timed): each takes its rows and the expert answers them, written
    as the calls write them."""
    answers = dispatch.buffer(x.shape[1:], x.dtype)
    for span in spans:
        answers.put(span, grouped[span.start : span.stop])
    return answers


def level_alive(prefix: torch.Tensor, score: torch.Tensor, grid: Grid, d: int) -> beams.LevelAlive:
    """What ExpertFinder._level_alive builds from its cache: every prefix in the beams
    looked up (here every coordinate alive)."""
    keys = beams.live_prefixes(prefix, score, math.prod(grid.shape[:d]))
    alive = {i: range(grid.shape[d]) for i in keys.tolist()}  # the finder's cached answers
    return beams.LevelAlive(keys, beams.alive_table(list(alive.values()), grid.shape[d]))


def plan_before(
    per_dim: Sequence[torch.Tensor], x: torch.Tensor, grid: Grid, k: int, alive: dict[str, Any]
) -> tuple[list[list[str]], dict[str, list[int]], dict[str, torch.Tensor]]:
    """The path at 95de286 up to the calls: a Python beam search per sample, rows
    grouped per sample, each call's inputs."""
    scores = [p.detach().float().tolist() for p in per_dim]
    dims = len(grid.shape)
    uids: list[list[str]] = []
    for b in range(x.shape[0]):
        sample = [(grid.root_prefix, 0.0)]
        for d in range(dims):
            sample = advance_beams(sample, scores[d][b], alive, k, last=d == dims - 1)
        uids.append([uid for uid, _ in sample])
    rows_of: dict[str, list[int]] = defaultdict(list)
    for b, chosen_uids in enumerate(uids):
        for uid in chosen_uids:
            rows_of[uid].append(b)
    return uids, rows_of, {uid: x[rows] for uid, rows in rows_of.items()}


def combine_before(
    per_dim: Sequence[torch.Tensor],
    x: torch.Tensor,
    grid: Grid,
    k: int,
    uids: list[list[str]],
    rows_of: dict[str, list[int]],
    answers: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The path at 95de286 after the calls: answers put back row by row, the mix."""
    dims = len(grid.shape)
    outputs = torch.zeros(x.shape[0], k, *x.shape[1:], dtype=x.dtype)
    alive_slots = torch.zeros(x.shape[0], k)
    for uid, y in answers.items():
        rows = rows_of[uid]
        slots = [uids[b].index(uid) for b in rows]
        outputs[rows, slots] = y
        alive_slots[rows, slots] = 1.0
    pad = (0,) * dims
    coords = torch.tensor(
        [[ExpertUID.parse(u).coords for u in us] + [pad] * (k - len(us)) for us in uids],
        dtype=torch.long,
    ).view(x.shape[0], k, dims)
    chosen = sum(p.gather(1, coords[:, :, d]) for d, p in enumerate(per_dim))
    assert isinstance(chosen, torch.Tensor)
    chosen = chosen.masked_fill(alive_slots == 0, float("-inf"))
    weights = torch.softmax(chosen.float(), dim=1).nan_to_num(0.0).unsqueeze(-1)
    return (weights * outputs).sum(dim=1)


def _flat(uid: str, shape: Sequence[int]) -> int:
    index = 0
    for c, n in zip(ExpertUID.parse(uid).coords, shape, strict=True):
        index = index * n + c
    return index


def measure(
    tokens: int, shape: tuple[int, ...], k: int, hidden: int, repeats: int
) -> dict[str, Any]:
    grid = Grid("ffn", shape)
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden)
    gate = torch.nn.Linear(hidden, sum(shape), bias=False)
    with torch.no_grad():
        per_dim = list(gate(x).split(list(shape), dim=-1))
    alive = {
        prefix: frozenset(range(shape[depth]))
        for uid in grid
        for depth, prefix in enumerate(uid.prefixes())
    }
    now: list[float] = []
    chosen_now = mixed_now = torch.empty(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        routing, dispatch, spans, inputs = plan_now(per_dim, x, grid, k)
        t1 = time.perf_counter()
        answers = answer_now(dispatch, spans, inputs, x)
        t2 = time.perf_counter()
        mixed_now = combine_now(per_dim, grid, routing, dispatch, answers)
        now.append(t1 - t0 + time.perf_counter() - t2)
        chosen_now = routing.experts
    before: list[float] = []
    chosen_before = mixed_before = torch.empty(0)
    for _ in range(max(1, repeats // 5)):
        t0 = time.perf_counter()
        uids, rows_of, calls = plan_before(per_dim, x, grid, k, alive)
        t1 = time.perf_counter()
        answers_before = dict(calls)  # each expert answers its inputs
        t2 = time.perf_counter()
        mixed_before = combine_before(per_dim, x, grid, k, uids, rows_of, answers_before)
        before.append(t1 - t0 + time.perf_counter() - t2)
        chosen_before = torch.tensor(
            [[_flat(u, shape) for u in us] + [0] * (k - len(us)) for us in uids]
        )
    matches = bool(torch.equal(chosen_now, chosen_before)) and bool(
        torch.allclose(mixed_now, mixed_before)
    )
    return {
        "tokens": tokens,
        "grid": list(shape),
        "k": k,
        "hidden": hidden,
        "threads": torch.get_num_threads(),
        "routing_us_per_token_layer": round(min(now) / tokens * 1e6, 3),
        "routing_us_per_token_layer_before": round(min(before) / tokens * 1e6, 3),
        "routing_speedup": round(min(before) / min(now), 1),
        "routing_matches_before": matches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--grid", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(measure(args.tokens, tuple(args.grid), args.k, args.hidden, args.repeats)))


if __name__ == "__main__":
    main()
