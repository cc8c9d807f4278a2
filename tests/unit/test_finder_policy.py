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
