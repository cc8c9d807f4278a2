"""The trainer's loop reads time through the clock it is given (core/clock.py): its
patience with a swarm that answers no evaluation is counted on that clock, so a test
moves it instead of waiting. (Trio's own clock jumps too: the loop's pause between two
tries is trio.sleep.)"""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import trio

from core.errors import UserFacingError
from core.trainer.train import _evaluate_until_answered
from tests.clocks import ManualClock


class SilentSwarm:
    """A session whose every evaluation takes 10 s of the clock and gets no answer."""

    def __init__(self, clock: ManualClock, answer_after: int | None = None) -> None:
        self.clock, self.answer_after, self.calls = clock, answer_after, 0
        self.evaluation_error = "64 of 64 samples got fewer than k_min=1 answers"

    def evaluate(self) -> float:
        self.calls += 1
        self.clock.advance(10.0)
        return 2.5 if self.answer_after is not None and self.calls > self.answer_after else math.nan


async def test_patience_with_a_silent_swarm_is_counted_on_the_trainers_clock(autojump_clock):
    clock = ManualClock()
    session = SilentSwarm(clock)
    with pytest.raises(UserFacingError, match="answered no evaluation for 30 s"):
        await _evaluate_until_answered(cast(Any, session), trio.Event(), 30.0, clock)
    # 10, 20, 30 s: patient; 40 s: too long. On the computer's clock the evaluations,
    # instant here, would have gone on for 30 real seconds
    assert session.calls == 4


async def test_the_first_answer_within_patience_ends_the_wait(autojump_clock):
    clock = ManualClock()
    session = SilentSwarm(clock, answer_after=2)
    assert await _evaluate_until_answered(cast(Any, session), trio.Event(), 30.0, clock) == 2.5
    assert session.calls == 3
