"""How the whole suite is shared between two workers (tests/parallel.py): a file at a
time, the NAT lab's files as one, the bundle's build first, then files with slow tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from tests.parallel import group_of, rank_of_groups


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/unit/test_choice.py::test_memory_budget[a]", "tests/unit/test_choice.py"),
        ("tests/swarm/test_rpc.py::test_x", "tests/swarm/test_rpc.py"),
        ("tests/nat/test_relay.py::test_y", "nat"),  # one lab at a time
        ("tests/nat/test_demo_nat.py::test_z", "nat"),
        ("tests/bundle/test_bundle.py::test_b", "tests/bundle/test_bundle.py"),
    ],
)
def test_a_test_goes_with_its_file_or_its_shared_group(nodeid: str, group: str) -> None:
    assert group_of(nodeid) == group


@dataclass
class FakeItem:
    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_the_bundle_goes_first_then_every_group_with_a_slow_test() -> None:
    items = [
        FakeItem("tests/unit/test_a.py::t1"),
        FakeItem("tests/processes/test_demo.py::quick"),
        FakeItem("tests/processes/test_demo.py::long", slow=True),
        FakeItem("tests/nat/test_lab.py::t"),
        FakeItem("tests/nat/test_relay.py::t", slow=True),
        FakeItem("tests/bundle/test_bundle.py::b", slow=True),
    ]
    rank = rank_of_groups(cast(list[Any], items))
    assert rank == {
        "tests/unit/test_a.py": 2,
        "tests/processes/test_demo.py": 1,  # its quick test goes with it
        "nat": 1,
        "tests/bundle/test_bundle.py": 0,
    }
