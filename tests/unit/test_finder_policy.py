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
