"""The whole suite on two workers (``make test``: ``pytest -n 2 --dist loadgroup
--no-loadscope-reorder``), for the machine it leaves idle: run in one process it kept
1.08 of two cores busy (24 min of wall time for 26 min of CPU, the rest waiting on
sockets, child processes and rounds).

Each worker takes a whole test file at a time (its module fixtures set up once), the
NAT lab's files as one (one lab of namespaces and shaped links at a time), and the
files holding slow tests go out first, the bundle's build first of all: the longest
work starts while the short files can still fill in around it. Pure ordering and
grouping; a run without ``-n`` is unchanged."""

from __future__ import annotations

import pytest

from tests.bundle.building import BUNDLE_TESTS

#: files whose tests share what one machine has once, run one after another
SHARED = {"tests/nat/": "nat"}


def in_a_worker(config: pytest.Config) -> bool:
    """Whether this process is a worker of ``pytest -n`` (xdist gives it its input)."""
    return hasattr(config, "workerinput")


def group_of(nodeid: str) -> str:
    """The worker's unit of work a test belongs to: its file, or its shared group."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED.items():
        if path.startswith(prefix):
            return group
    return path


def rank_of_groups(items: list[pytest.Item]) -> dict[str, int]:
    """0 for the bundle's build, 1 for groups with a slow test, 2 for the rest."""
    rank: dict[str, int] = {}
    for item in items:
        group = group_of(item.nodeid)
        if item.nodeid.startswith(BUNDLE_TESTS):
            mine = 0
        elif item.get_closest_marker("slow") is not None:
            mine = 1
        else:
            mine = 2
        rank[group] = min(rank.get(group, 2), mine)
    return rank


@pytest.hookimpl(tryfirst=True)  # before xdist names each test after its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not in_a_worker(config):
        return
    rank = rank_of_groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.nodeid)))
    # stable: a file's tests keep their order, and every worker sorts alike
    items.sort(key=lambda item: rank[group_of(item.nodeid)])
