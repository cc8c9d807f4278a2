from __future__ import annotations

import pytest

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
