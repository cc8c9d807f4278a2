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


def stalled_from(schedule: dict[str, float]):
    """A ``stalled`` naming each uid from its time on (its aggregator's round due and
    short of contributors)."""
    start = trio.current_time()

    async def stalled() -> frozenset[str]:
        now = trio.current_time() - start
        return frozenset(uid for uid, t in schedule.items() if t <= now)

    return stalled


@pytest.mark.parametrize(
    ("stalls", "seconds", "behind"),
    [
        # b's aggregator says at 2 s that b's round lacks contributors: not waited for
        # past the round after the last step (6 s); a got its round at 2 s, then the pull
        ({"b": 2.0}, 9.0, ("b",)),
        # said only at 10 s: from then on
        ({"b": 10.0}, 13.0, ("b",)),
        # a stall of an expert that had its round changes nothing
        ({"a": 0.0}, 30.0, ("b",)),
        # nobody stalled: the bound
        ({}, 30.0, ("b",)),
    ],
)
async def test_an_expert_whose_round_cannot_close_is_not_waited_for(
    autojump_clock, stalls, seconds, behind
) -> None:
    schedule: dict[str, list[tuple[float, int]]] = {"a": [(0, 4), (2, 5)], "b": [(0, 2)]}
    settled = await await_next_round(
        {"a": 4, "b": 2},
        declared_at(schedule),
        wait_s=30.0,
        pull_s=3.0,
        stalled=stalled_from(stalls),
        round_s=6.0,
    )
    assert not settled.applied
    assert settled.behind == behind
    assert settled.seconds == pytest.approx(seconds)


async def test_when_every_expert_is_stalled_nothing_is_pulled(autojump_clock) -> None:
    settled = await await_next_round(
        {"a": 4},
        declared_at({"a": [(0, 4)]}),
        wait_s=30.0,
        pull_s=3.0,
        stalled=stalled_from({"a": 0.0}),
        round_s=6.0,
    )
    assert (settled.applied, settled.behind) == (False, ("a",))
    assert settled.seconds == pytest.approx(6.0)
