"""Which experts a volunteer serves: the ones the swarm covers least, as many as fit.
Pure. Petals' block selection is the model: move only when it helps enough (hysteresis),
and never leave an expert that nobody else serves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def choose_experts(coverage: Mapping[str, int], capacity: int, order: Sequence[str]) -> list[str]:
    """The ``capacity`` experts with the fewest servers; ties broken by ``order`` (a
    per-volunteer shuffle, so that volunteers starting together spread out)."""
    rank = {uid: i for i, uid in enumerate(order)}
    ordered = sorted(coverage, key=lambda u: (coverage[u], rank.get(u, len(rank)), u))
    return ordered[: max(0, capacity)]


def rebalance(
    current: Sequence[str],
    coverage: Mapping[str, int],
    capacity: int,
    order: Sequence[str],
    *,
    min_gain: int = 2,
) -> list[str]:
    """What to serve next, given what we serve now. ``coverage`` counts servers of each
    expert *including us*. One move at a time, only when the expert we would drop keeps
    at least one other server and the one we would take has at least ``min_gain`` fewer
    servers than the dropped one (so two volunteers do not swap back and forth)."""
    serving = list(current)[:capacity]
    if len(serving) < capacity:
        free = [u for u in choose_experts(coverage, len(coverage), order) if u not in serving]
        return serving + free[: capacity - len(serving)]
    candidates = [u for u in choose_experts(coverage, len(coverage), order) if u not in serving]
    if not candidates:
        return serving
    best = candidates[0]
    droppable = [u for u in serving if coverage.get(u, 1) >= 2]  # someone else serves it too
    if not droppable:
        return serving
    worst = max(droppable, key=lambda u: (coverage.get(u, 1), u))
    if coverage.get(worst, 1) - coverage.get(best, 0) >= min_gain:
        return [u for u in serving if u != worst] + [best]
    return serving
