"""A backward call sent again with its receipt (the trainer's side timed out) gets the
first answer, computed once; a repeat during the first waits for it; a failed first try
leaves nothing; kept answers are bounded."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from core.experts.retries import AnsweredOnce
from net import Reply, Tensor


def reply(tag: int, nbytes: int = 8) -> Reply:
    return Reply({"tag": tag}, (Tensor("uint8", (nbytes,), bytes(nbytes)),))


async def test_a_repeat_gets_the_first_answer_and_nothing_is_computed_twice():
    answered, computed = AnsweredOnce(), []

    async def compute() -> Reply:
        computed.append(1)
        return reply(len(computed))

    first = await answered.once("batch", compute)
    again = await answered.once("batch", compute)
    assert again is first
    assert computed == [1]
    assert answered.repeats == 1
    other = await answered.once("another batch", compute)
    assert other.meta["tag"] == 2


async def test_a_repeat_during_the_first_try_waits_for_its_answer():
    answered, computed, got = AnsweredOnce(), [], []
    release = trio.Event()

    async def slow() -> Reply:
        computed.append(1)
        await release.wait()
        return reply(7)

    async def ask() -> None:
        got.append(await answered.once("batch", slow))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask)  # the trainer's repeat, while the first still runs
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert computed == [1]
    assert [r.meta["tag"] for r in got] == [7, 7]


async def test_a_failed_first_try_leaves_nothing_and_a_repeat_computes():
    answered = AnsweredOnce()

    async def fails() -> Reply:
        raise RuntimeError("graph gone")

    with pytest.raises(RuntimeError):
        await answered.once("batch", fails)

    async def works() -> Reply:
        return reply(3)

    assert (await answered.once("batch", works)).meta["tag"] == 3
    assert answered.repeats == 0


async def test_kept_answers_are_bounded_in_number_and_bytes():
    answered = AnsweredOnce(most=3, most_bytes=100)
    for i in range(5):
        await answered.once(i, partial(_ready, reply(i, 10)))
    assert list(answered._done) == [2, 3, 4]  # the oldest went first
    await answered.once("big", partial(_ready, reply(9, 90)))
    assert list(answered._done) == [4, "big"]  # 30 + 90 bytes > 100: room made
    await answered.once("too big", partial(_ready, reply(9, 101)))
    assert "too big" not in answered._done  # never kept


async def _ready(r: Reply) -> Reply:
    return r
