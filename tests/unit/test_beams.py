"""The tensor beam search (core/moe/beams.py) chooses what the per-sample reference
(``advance_beams``) chooses, ties and dead experts included; dispatch and combine put
every answer back where the per-call loops did."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from core.experts.uid import Grid
from core.moe import beams
from core.moe.beams import LevelAlive, beam_search, coordinates, name_rank
from core.moe.dispatch import Dispatch
from core.moe.finder import advance_beams

Alive = dict[str, frozenset[int]]


def reference(per_dim: list[torch.Tensor], grid: Grid, k: int, alive: Alive) -> list[list[str]]:
    scores = [p.double().tolist() for p in per_dim]
    dims = len(grid.shape)
    out = []
    for t in range(per_dim[0].shape[0]):
        beams = [(grid.root_prefix, 0.0)]
        for d in range(dims):
            beams = advance_beams(beams, scores[d][t], alive, k, last=d == dims - 1)
        out.append([uid for uid, _ in beams])
    return out


def levels(grid: Grid, alive: Alive) -> list[LevelAlive]:
    """``alive`` as the finder hands it to the search: per dimension, the listed
    prefixes' rows."""
    out = []
    for d, n in enumerate(grid.shape):
        keys, rows = [], []
        prefixes = itertools.product(*(range(m) for m in grid.shape[:d]))
        for i, coords in enumerate(prefixes):
            name = grid.root_prefix + "".join(f"{c}." for c in coords)
            if name in alive:
                keys.append(i)
                rows.append([j in alive[name] for j in range(n)])
        out.append(
            LevelAlive(
                torch.tensor(keys, dtype=torch.long).reshape(-1),
                torch.tensor(rows, dtype=torch.bool).reshape(-1, n),
            )
        )
    return out


def chosen_names(per_dim: list[torch.Tensor], grid: Grid, k: int, alive: Alive) -> list[list[str]]:
    routing = beam_search(per_dim, k, levels(grid, alive))
    coords = coordinates(routing.experts, grid.shape).tolist()
    valid = routing.valid.tolist()
    return [
        [".".join([grid.layer, *map(str, c)]) for c, ok in zip(row, oks, strict=True) if ok]
        for row, oks in zip(coords, valid, strict=True)
    ]


def every(grid: Grid) -> Alive:
    return {
        prefix: frozenset(range(grid.shape[depth]))
        for uid in grid
        for depth, prefix in enumerate(uid.prefixes())
    }


@pytest.mark.parametrize(
    ("shape", "scores", "k", "expected"),
    [
        # equal scores: by name, where 10 and 11 come before 2
        ((12,), [[0.0] * 12], 4, ["ffn.0", "ffn.1", "ffn.10", "ffn.11"]),
        # the best first
        ((3,), [[0.1, 0.3, 0.2]], 2, ["ffn.1", "ffn.2"]),
        # more wanted than the grid holds
        ((2,), [[0.5, 0.1]], 4, ["ffn.0", "ffn.1"]),
        # a NaN scores nothing
        ((3,), [[float("nan"), 0.1, 0.2]], 3, ["ffn.2", "ffn.1"]),
    ],
)
def test_one_dimension_table(shape, scores, k, expected):
    grid = Grid("ffn", shape)
    per_dim = [torch.tensor(scores)]
    assert chosen_names(per_dim, grid, k, every(grid)) == [expected]
    if not any(s != s for s in scores[0]):  # the reference has no rule for NaN
        assert reference(per_dim, grid, k, every(grid)) == [expected]


def test_a_beam_whose_prefix_has_no_live_expert_is_lost_as_in_the_reference():
    """ffn.0. is the best prefix, but nobody serves under it: the search (both of them)
    keeps k prefixes at the first level and finds only what lives under the others."""
    grid = Grid("ffn", (3, 2))
    alive = {"ffn.": frozenset({0, 1, 2}), "ffn.1.": frozenset({0}), "ffn.2.": frozenset({1})}
    per_dim = [torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[0.0, 0.5]])]
    assert chosen_names(per_dim, grid, 2, alive) == [["ffn.1.0"]]
    assert reference(per_dim, grid, 2, alive) == [["ffn.1.0"]]
    assert chosen_names(per_dim, grid, 3, alive) == [["ffn.1.0", "ffn.2.1"]]
    assert reference(per_dim, grid, 3, alive) == [["ffn.1.0", "ffn.2.1"]]


def test_name_rank_sorts_as_uid_strings_do():
    shape = (12, 11)
    names = [f"ffn.{i}.{j}" for i in range(12) for j in range(11)]
    ranks = name_rank(torch.arange(len(names)), shape).tolist()
    assert [names[i] for i in sorted(range(len(names)), key=lambda i: ranks[i])] == sorted(names)


@pytest.mark.parametrize("seed", range(6))
def test_random_grids_liveness_and_ties_choose_as_the_reference(seed):
    rng = random.Random(seed)
    for _ in range(40):
        shape = tuple(rng.choice([1, 2, 3, 5, 11, 13]) for _ in range(rng.choice([1, 2, 3])))
        grid = Grid("ffn", shape)
        k = rng.choice([1, 2, 4, 5])
        share = rng.choice([1.0, 0.8, 0.3])
        alive: dict[str, set[int]] = {}
        for uid in grid:
            for depth, prefix in enumerate(uid.prefixes()):
                if rng.random() < share:
                    alive.setdefault(prefix, set()).add(uid.coords[depth])
        frozen = {p: frozenset(c) for p, c in alive.items()}
        batch = rng.choice([1, 7, 40])
        torch.manual_seed(rng.randrange(1 << 30))
        ties = rng.random() < 0.4  # small integers: many equal sums
        per_dim = [
            torch.randint(-2, 3, (batch, n)).float() if ties else torch.randn(batch, n)
            for n in shape
        ]
        assert chosen_names(per_dim, grid, k, frozen) == reference(per_dim, grid, k, frozen)


def test_bfloat16_and_float64_scores_choose_as_the_reference():
    grid = Grid("ffn", (16, 16))
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float64):
        per_dim = [torch.randn(64, 16).to(dtype) for _ in range(2)]
        assert chosen_names(per_dim, grid, 4, every(grid)) == reference(
            per_dim, grid, 4, every(grid)
        )


def test_cut_spans_are_the_given_pieces_of_each_experts_rows() -> None:
    """A phase's plan cuts each expert's rows at given places (core/moe/load.py
    ``ServerLoads.plan``): the spans are those pieces, in the dispatch's order, and an
    expert given none gets no call."""
    torch.manual_seed(1)
    dispatch = Dispatch.of(beam_search([torch.randn(10, 4) for _ in range(2)], 3))
    per_expert = dispatch.expert_rows()
    assert sum(rows for _, rows in per_expert) == len(dispatch)
    cuts = [
        [(0, rows // 2), (rows // 2, rows)] if rows > 1 else [(0, rows)] for _, rows in per_expert
    ]
    cuts[0] = []  # nobody serves the first expert
    spans = dispatch.spans_cut(cuts)
    assert spans == [
        s
        for s in dispatch.spans(lambda expert, rows: 2 if rows > 1 else 1)
        if s.expert != per_expert[0][0]
    ]


@pytest.mark.parametrize("lost_at", [None, 3])  # every slot answered (a gather), or not
def test_dispatch_groups_by_expert_and_combines_back(lost_at: int | None) -> None:
    torch.manual_seed(1)
    per_dim = [torch.randn(10, 4) for _ in range(2)]
    routing = beam_search(per_dim, 3)
    dispatch = Dispatch.of(routing)
    assert len(dispatch) == 30
    spans = dispatch.spans(lambda expert, rows: 2 if rows > 2 else 1)
    x = torch.randn(10, 5)
    inputs = dispatch.take(dispatch.gather(x), spans)
    experts = routing.experts.tolist()
    for span, rows_x in zip(spans, inputs, strict=True):
        rows = dispatch.rows_of(span)
        assert rows.tolist() == sorted(rows.tolist())
        assert all(span.expert in experts[r] for r in rows.tolist())
        assert torch.equal(rows_x, x[rows])
    # an answer per span: the expert's index plus the sample's own row; one span may be lost
    lost = spans[lost_at] if lost_at is not None else None
    answers = dispatch.buffer((5,), torch.float32)
    for s, inp in zip(spans, inputs, strict=True):
        if s != lost:
            answers.put(s, inp + s.expert)
    outputs, alive = dispatch.combine(answers)
    for b in range(10):
        for slot in range(3):
            e = experts[b][slot]
            missed = lost is not None and e == lost.expert and b in dispatch.rows_of(lost).tolist()
            assert alive[b, slot] == (0.0 if missed else 1.0)
            expected = torch.zeros(5) if missed else x[b] + e
            assert torch.equal(outputs[b, slot], expected)
    summed = dispatch.scatter_add(answers, torch.zeros(10, 5))
    expected = torch.zeros(10, 5)
    for s, inp in zip(spans, inputs, strict=True):
        if s != lost:
            expected.index_add_(0, dispatch.rows_of(s), inp + s.expert)
    assert torch.allclose(summed, expected)
    grouped = dispatch.per_pair(outputs)
    assert dispatch.any_nonzero(grouped, spans) == [s != lost for s in spans]


@pytest.mark.parametrize("by_mask", [True, False])
def test_live_prefixes_are_the_distinct_finite_beams_ascending(
    by_mask: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(beams, "_MASK_PREFIXES", 1 << 20 if by_mask else 0)
    prefix = torch.tensor([[7, 3, 3], [0, 9, 5], [5, 2, 1]])
    score = torch.tensor([[1.0, 0.5, 0.2], [2.0, float("-inf"), 1.0], [0.1, float("-inf"), 0.0]])
    assert beams.live_prefixes(prefix, score, 16).tolist() == [0, 1, 3, 5, 7]
    nothing = torch.full((2, 2), float("-inf"))
    assert beams.live_prefixes(prefix[:2, :2], nothing, 16).tolist() == []


def test_dispatch_of_a_routing_with_empty_slots_combines_only_the_valid_ones() -> None:
    # grid of 3 with k=4: every sample has one empty slot
    per_dim = [torch.randn(6, 3)]
    routing = beam_search(per_dim, 4)
    assert not bool(routing.valid[:, 3].any())
    dispatch = Dispatch.of(routing)
    assert len(dispatch) == 18
    x = torch.randn(6, 2)
    answers = dispatch.buffer((2,), torch.float32)
    spans = dispatch.spans()
    for span, rows_x in zip(spans, dispatch.take(dispatch.gather(x), spans), strict=True):
        answers.put(span, rows_x * 2)
    outputs, alive = dispatch.combine(answers)
    assert torch.equal(alive, routing.valid.float())
    assert torch.equal(outputs[:, :3], (x * 2).unsqueeze(1).expand(6, 3, 2))
    assert not bool(outputs[:, 3].any())
