"""Experts are assigned to a project's aggregators explicitly and balanced by
parameters; volunteers, trainers and aggregators compute the same assignment."""

from __future__ import annotations

from collections import Counter

import pytest

from core.project.assignment import balanced, expert_assignment
from core.project.manifest import Manifest, parse_manifest
from core.protocol.aggregator_methods import responsible_aggregator
from core.protocol.contributions import TRUNK_UID


@pytest.mark.parametrize(
    ("sizes", "aggregators", "expected"),
    [
        ([("a", 1), ("b", 1), ("c", 1)], 2, {"a": 0, "b": 1, "c": 0}),
        ([("big", 10), ("a", 1), ("b", 1), ("c", 1)], 2, {"big": 0, "a": 1, "b": 1, "c": 1}),
        ([("a", 5)], 3, {"a": 0}),
        ([], 2, {}),
    ],
)
def test_balanced_table(sizes, aggregators, expected):
    assert balanced(sizes, aggregators) == expected


def manifest(aggregators: int, trainers: int = 0) -> Manifest:
    return parse_manifest(
        {
            "project": {"name": "t"},
            "model": {
                "hidden": 16,
                "grid": [3, 5],
                "mixture_layers": 2,
                "expert": {"kind": "ffn", "hidden": 16, "inner": 32},
            },
            "aggregators": [{"key": f"{i:064x}"} for i in range(1, aggregators + 1)],
            "trainers": [{"key": f"{i:064x}"} for i in range(100, 100 + trainers)],
        }
    )


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_expert_has_one_aggregator_and_the_shares_differ_by_one_at_most(count):
    m = manifest(count, trainers=2)
    assignment = expert_assignment(m)
    uids = list(m.model.expert_uids())
    assert set(assignment) == {*uids, TRUNK_UID}
    shares = Counter(assignment[u] for u in uids)
    assert set(shares) == set(range(min(count, len(uids))))
    assert max(shares.values()) - min(shares.values()) <= 1
    # the trunk goes where the fewest expert parameters are
    assert shares[assignment[TRUNK_UID]] == min(shares.values())
    peers = [f"peer{i}" for i in range(count)]
    for uid in uids:
        assert responsible_aggregator(uid, peers, assignment) == peers[assignment[uid]]


def test_without_an_assignment_the_uid_is_hashed_as_before():
    peers = ["a", "b", "c"]
    assert responsible_aggregator("ffn0.1.2", peers) == responsible_aggregator(
        "ffn0.1.2", peers, {}
    )
    assert responsible_aggregator("ffn0.1.2", peers, {"ffn0.1.2": 7}) in peers  # out of range
