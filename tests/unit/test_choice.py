from __future__ import annotations

import pytest

from core.experts.registry import ExpertSpec, parameter_count
from core.node.capacity import (
    FORMER_BYTES_PER_PARAM,
    GRAPH_SHARE,
    choose_device,
    experts_that_fit,
    graph_cache_bytes,
    memory_budget,
    params_per_gb,
)
from core.node.choice import choose_experts, rebalance

ORDER = ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("coverage", "capacity", "expected"),
    [
        ({"a": 3, "b": 0, "c": 1, "d": 0}, 2, ["b", "d"]),
        ({"a": 1, "b": 1, "c": 1, "d": 1}, 2, ["a", "b"]),  # ties: this volunteer's order
        ({"a": 0}, 3, ["a"]),
        ({"a": 0, "b": 0}, 0, []),
    ],
)
def test_choose_least_covered(coverage, capacity, expected):
    assert choose_experts(coverage, capacity, ORDER) == expected


@pytest.mark.parametrize(
    ("current", "coverage", "expected"),
    [
        (["a"], {"a": 3, "b": 0}, ["b"]),  # a has 2 others; b has nobody: move
        (["a"], {"a": 1, "b": 0}, ["a"]),  # we are a's only server: never leave it
        (["a"], {"a": 2, "b": 1}, ["a"]),  # gain of 1 < 2: stay (hysteresis)
        (["a", "c"], {"a": 4, "b": 0, "c": 2}, ["c", "b"]),  # drop the most covered
        ([], {"a": 1, "b": 0}, ["b"]),  # start with the least covered
    ],
)
def test_rebalance(current, coverage, expected):
    assert rebalance(current, coverage, max(1, len(current)), ORDER) == expected


def test_two_volunteers_do_not_oscillate():
    # two volunteers on the same expert, one free expert: one moves, then both stay
    cov = {"a": 2, "b": 0}
    first = rebalance(["a"], cov, 1, ORDER)
    assert first == ["b"]
    cov = {"a": 1, "b": 1}
    assert rebalance(["a"], cov, 1, ORDER) == ["a"]
    assert rebalance(["b"], cov, 1, ORDER) == ["b"]


@pytest.mark.parametrize(
    ("allowed", "cuda_count", "expected"),
    [
        ("all", 0, "cpu"),
        ("all", 2, "cuda:0"),
        ([1], 2, "cuda:1"),
        ([3], 2, "cpu"),  # the allowed GPU is not there
        ([], 4, "cpu"),  # the volunteer allows no GPU
    ],
)
def test_choose_device(allowed, cuda_count, expected):
    assert choose_device(allowed, cuda_count) == expected


@pytest.mark.parametrize(
    ("free", "cap_gb", "expected"),
    [
        (8_000_000_000, None, 4_000_000_000),  # half of what is free
        (8_000_000_000, 2.0, 2_000_000_000),  # the volunteer's cap
        (1_000_000_000, 2.0, 1_000_000_000),  # never more than is free
    ],
)
def test_memory_budget(free, cap_gb, expected):
    assert memory_budget(free, cap_gb) == expected


@pytest.mark.parametrize(
    ("params", "weight_bytes", "on_gpu", "budget", "wanted", "expected"),
    [
        # float32 on the CPU: weights, sums, previous weights, residual (16 B), a quarter
        # of the budget for graphs, one gradient and one swap copy (8 B) once
        (1_000_000, 4, False, 200_000_000, None, 8),
        # the same on a GPU (the residual in RAM): 12 B each
        (1_000_000, 4, True, 200_000_000, None, 11),
        # bfloat16 on a GPU: 2 + 4 + 2 = 8 B each, 4 B once
        (1_000_000, 2, True, 200_000_000, None, 18),
        (1_000_000, 2, True, 200_000_000, 3, 3),  # the volunteer asked for fewer
        (1_000_000, 4, False, 20_000_000, 3, 0),  # not even one fits beside the graphs' share
        (1_000_000, 4, False, 32_000_000, None, 1),  # 24 - 8 MB of room: one of 16 MB
        (10, 4, False, 10**12, None, 64),  # tiny experts: at most MOST_EXPERTS
    ],
)
def test_experts_that_fit(params, weight_bytes, on_gpu, budget, wanted, expected):
    assert experts_that_fit(params, weight_bytes, budget, wanted, on_gpu=on_gpu) == expected


def test_a_bfloat16_gpu_node_serves_at_least_two_and_a_half_times_the_former_plan():
    """Issue 39's goal: 20 B per parameter before, 8 B now (bfloat16 on a GPU)."""
    former = 1e9 * (1 - GRAPH_SHARE) / FORMER_BYTES_PER_PARAM
    assert params_per_gb(2, on_gpu=True) >= 2.5 * former
    assert params_per_gb(4, on_gpu=True) == pytest.approx(1e9 * 0.75 / 12)


@pytest.mark.parametrize(
    ("budget", "experts", "expected"),
    [(4_000_000, 1, 1_000_000), (4_000_000, 4, 250_000), (4_000_000, 0, 1_000_000)],
)
def test_kept_graphs_get_a_quarter_of_the_budget_shared_by_the_experts(budget, experts, expected):
    assert graph_cache_bytes(budget, experts) == expected


def test_parameter_count_needs_no_memory():
    spec = ExpertSpec(kind="ffn", hidden=16, inner=32)
    # LayerNorm (2x16) + Linear 16->32 (16*32+32) + Linear 32->16 (32*16+16)
    assert parameter_count(spec) == 32 + 544 + 528
