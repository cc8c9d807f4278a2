"""How long a trainer skips a server that failed a call (core/moe/finder.py)."""

from __future__ import annotations

import pytest

from core.moe.finder import LONGEST_SKIP, Skip, skip_after_failure


@pytest.mark.parametrize(
    ("skip", "now", "expected"),
    [
        # the first failure: the base time
        (None, 100.0, Skip(105.0, 5.0)),
        # more failures during the skip: the calls in flight when the link went; one
        # incident, whatever their number
        (Skip(105.0, 5.0), 100.0, Skip(105.0, 5.0)),
        (Skip(105.0, 5.0), 104.9, Skip(105.0, 5.0)),
        # failing again after the skip: twice as long
        (Skip(105.0, 5.0), 105.0, Skip(115.0, 10.0)),
        (Skip(115.0, 10.0), 200.0, Skip(220.0, 20.0)),
        # never longer than LONGEST_SKIP
        (Skip(0.0, 200.0), 1000.0, Skip(1000.0 + LONGEST_SKIP, LONGEST_SKIP)),
    ],
)
def test_a_failing_server_is_skipped_for_longer_only_when_it_fails_again(skip, now, expected):
    assert skip_after_failure(skip, now, base=5.0) == expected


def test_eight_calls_failing_at_once_skip_a_server_for_the_base_time():
    skip = None
    for _ in range(8):
        skip = skip_after_failure(skip, 50.0, base=5.0)
    assert skip == Skip(55.0, 5.0)


async def test_a_server_that_answers_again_starts_afresh():
    from core.experts.uid import Grid
    from core.moe.client import ExpertServerRef
    from core.moe.finder import ExpertFinder
    from net import Identity

    finder = ExpertFinder(dht=None, project="p", grid=Grid("ffn", (2,)), failure_backoff=5.0)  # type: ignore[arg-type]
    server = ExpertServerRef(Identity.generate().peer_id)
    for _ in range(3):  # three incidents, each after the previous skip ended
        finder.report_failure(server)
        finder._skipped[server.peer_id] = Skip(0.0, finder._skipped[server.peer_id].backoff)
    assert finder._skipped[server.peer_id].backoff == 20.0
    finder.report_latency(server, 0.1)
    finder.report_failure(server)
    assert finder._skipped[server.peer_id].backoff == 5.0


class _Records:
    """Stands in for the DHT's get: what each name holds now, and how often it was read."""

    def __init__(self) -> None:
        self.held: dict[object, list[object]] = {}
        self.reads = 0

    async def get(self, key: object) -> list[object]:
        self.reads += 1
        return list(self.held.get(key, []))


async def test_a_failure_looks_again_for_the_servers_of_what_the_failed_server_served():
    from types import SimpleNamespace

    from core.experts.records import SERVING, ExpertAnnouncement, expert_key
    from core.experts.uid import Grid
    from core.moe.finder import ExpertFinder
    from net import Identity

    dht = _Records()
    finder = ExpertFinder(dht=dht, project="p", grid=Grid("ffn", (2,)), cache_ttl=60.0)  # type: ignore[arg-type]
    old, newcomer, other = (Identity.generate().peer_id for _ in range(3))

    def declare(uid: str, *authors: object) -> None:
        value = ExpertAnnouncement(uid, SERVING, 0, "00" * 32, 0.0, 8).encode()
        dht.held[expert_key("p", uid)] = [
            SimpleNamespace(value=value, author_peer_id=a) for a in authors
        ]

    declare("ffn.0", old)
    declare("ffn.1", other)
    assert [s.peer_id for s in await finder.servers("ffn.0")] == [old]
    assert [s.peer_id for s in await finder.servers("ffn.1")] == [other]
    declare("ffn.0", old, newcomer)  # a volunteer joined after the lookups were cached
    assert [s.peer_id for s in await finder.servers("ffn.0")] == [old]  # cached
    reads = dht.reads

    failed = (await finder.servers("ffn.0"))[0]
    for _ in range(8):  # the calls in flight when it died: one incident, one lookup
        finder.report_failure(failed)
    assert [s.peer_id for s in await finder.servers("ffn.0")] == [newcomer]
    assert [s.peer_id for s in await finder.servers("ffn.1")] == [other]
    assert dht.reads == reads + 1  # what the failed server did not declare stays cached


class _SlowRecords(_Records):
    """A DHT whose every read takes a second (round trips behind slow links)."""

    async def get(self, key: object) -> list[object]:
        import trio

        await trio.sleep(1.0)
        return await super().get(key)


async def test_with_keep_fresh_an_expired_answer_is_served_while_a_fresh_one_is_fetched(
    autojump_clock,
):
    from types import SimpleNamespace

    import trio

    from core.experts.records import SERVING, ExpertAnnouncement, expert_key
    from core.experts.uid import Grid
    from core.moe.finder import ExpertFinder
    from net import Identity, PeerID

    dht = _SlowRecords()
    finder = ExpertFinder(dht=dht, project="p", grid=Grid("ffn", (2,)), cache_ttl=5.0, stale_s=60.0)  # type: ignore[arg-type]
    first, second = (Identity.generate().peer_id for _ in range(2))

    def declare(*authors: object) -> None:
        value = ExpertAnnouncement("ffn.0", SERVING, 0, "00" * 32, 0.0, 8).encode()
        dht.held[expert_key("p", "ffn.0")] = [
            SimpleNamespace(value=value, author_peer_id=a) for a in authors
        ]

    async def timed_servers() -> tuple[set[PeerID], float]:
        start = trio.current_time()
        servers = {s.peer_id for s in await finder.servers("ffn.0")}  # ranked: any order
        return servers, trio.current_time() - start

    declare(first)
    async with trio.open_nursery() as nursery:
        await nursery.start(finder.keep_fresh)
        assert await timed_servers() == ({first}, 1.0)  # nothing cached: waited for
        declare(first, second)
        await trio.sleep(10.0)  # expired
        assert await timed_servers() == ({first}, 0.0)  # served stale, at once...
        assert await timed_servers() == ({first}, 0.0)  # (one lookup behind, not two)
        await trio.sleep(1.5)
        assert dht.reads == 2
        assert await timed_servers() == ({first, second}, 0.0)  # ...and fresh after it
        assert finder.stats.stale_hits == 2
        await trio.sleep(100.0)  # past stale_s: waited for again
        assert await timed_servers() == ({first, second}, 1.0)
        nursery.cancel_scope.cancel()
    # without keep_fresh, an expired answer is waited for
    await trio.sleep(10.0)
    assert await timed_servers() == ({first, second}, 1.0)
