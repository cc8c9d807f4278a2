"""The wait for the experts' round after the last step (core/trainer/settle.py), on
trio's autojumping clock: declared versions move at set times."""

from __future__ import annotations

import pytest
import trio

from core.trainer.settle import await_next_round


def declared_at(schedule: dict[str, list[tuple[float, int]]]):
    """A ``newest`` whose answer for a uid is the last (time, version) reached."""
    start = trio.current_time()

    async def newest(uid: str) -> int | None:
        now = trio.current_time() - start
        reached = [v for t, v in schedule.get(uid, []) if t <= now]
        return reached[-1] if reached else None

    return newest


@pytest.mark.parametrize(
    ("schedule", "applied", "seconds", "behind"),
    [
        # both experts get a round: the later at 7 s, then the volunteers' pull of 3 s
        ({"a": [(0, 4), (5, 5)], "b": [(0, 2), (7, 3)]}, True, 10.0, ()),
        # a newer version already declared: only the pull is waited for
        ({"a": [(0, 6)], "b": [(0, 3)]}, True, 3.0, ()),
        # b never gets a round (its contributors stopped): the bound ends the wait
        ({"a": [(0, 4), (2, 5)], "b": [(0, 2)]}, False, 30.0, ("b",)),
        # nothing declared at all counts as no round
        ({}, False, 30.0, ("a", "b")),
        # a version older than the one served (another aggregator's stale record) is no
        # round: found newer at 4 s
        ({"a": [(0, 3), (4, 5)], "b": [(0, 1), (4, 3)]}, True, 7.0, ()),
    ],
)
async def test_the_wait_ends_at_the_round_or_at_its_bound(
    autojump_clock, schedule, applied, seconds, behind
) -> None:
    served = {"a": 4, "b": 2}
    settled = await await_next_round(served, declared_at(schedule), wait_s=30.0, pull_s=3.0)
    assert settled.applied is applied
    assert settled.behind == behind
    assert settled.seconds == pytest.approx(seconds)
    assert settled.seconds <= 30.0


async def test_nothing_served_waits_for_nothing(autojump_clock) -> None:
    async def never(uid: str) -> int | None:
        raise AssertionError("no expert to look up")

    settled = await await_next_round({}, never, wait_s=30.0, pull_s=3.0)
    assert (settled.applied, settled.seconds, settled.behind) == (True, 0.0, ())
