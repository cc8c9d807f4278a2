"""Enough voices per expert (core/moe/voices.py): a trainer spreads each expert's work
over as many servers as its aggregator waits for, and otherwise keeps the order by
finish time."""

from __future__ import annotations

from collections import Counter

import pytest

from core.moe.voices import ExpertVoices


@pytest.mark.parametrize(
    ("voices", "sent", "ranked", "expected"),
    [
        # nothing sent yet: the order by finish time stands
        (3, [], ["a", "b", "c"], ["a", "b", "c"]),
        # one server heard of three wanted: the soonest of the others comes first
        (3, [("a", 100)], ["a", "b", "c"], ["b", "a", "c"]),
        (3, [("a", 100), ("b", 100)], ["a", "b", "c", "d"], ["c", "a", "b", "d"]),
        # three heard (each >= 1/9 of the rows): finish time decides again
        (3, [("a", 700), ("b", 150), ("c", 150)], ["a", "b", "c"], ["a", "b", "c"]),
        # below the floor counts as not heard: 100 of 1000 < 1/9
        (3, [("a", 800), ("b", 100), ("c", 100)], ["a", "b", "c", "d"], ["b", "a", "c", "d"]),
        # the others' ranking is kept: the soonest not heard is moved up, no more
        (3, [("a", 100), ("b", 100)], ["d", "a", "c", "b"], ["d", "a", "c", "b"]),
        (3, [("a", 100), ("b", 100)], ["a", "b", "d", "c"], ["d", "a", "b", "c"]),
        # the project asks for fewer voices than the expert has servers: two suffice
        (2, [("a", 100), ("b", 30)], ["a", "b", "c"], ["a", "b", "c"]),
        (2, [("a", 100), ("b", 10)], ["a", "b", "c"], ["b", "a", "c"]),
        # an expert with fewer servers than voices: each of them is needed
        (3, [("a", 100)], ["a", "b"], ["b", "a"]),
        (3, [("a", 100), ("b", 20)], ["a", "b"], ["a", "b"]),
        # one voice, or one server: nothing to spread
        (1, [("a", 100)], ["a", "b"], ["a", "b"]),
        (3, [("a", 100)], ["a"], ["a"]),
        # a server that is gone (not among the ranked) is no voice: a third is needed
        (3, [("x", 1000), ("a", 100), ("b", 100)], ["a", "b", "c"], ["c", "a", "b"]),
    ],
)
def test_the_soonest_unheard_server_comes_first_while_voices_are_missing(
    voices, sent, ranked, expected
):
    v = ExpertVoices(voices, half_life_rows=1e9)
    for server, rows in sent:
        v.sent("e", server, rows)
    assert v.order("e", ranked) == expected


def test_experts_are_counted_apart():
    v = ExpertVoices(3, half_life_rows=1e9)
    v.sent("e1", "a", 100)
    assert v.order("e2", ["a", "b", "c"]) == ["a", "b", "c"]
    assert v.order("e1", ["a", "b", "c"]) == ["b", "a", "c"]


def test_old_rows_fade_with_the_half_life():
    v = ExpertVoices(2, half_life_rows=100)
    v.sent("e", "b", 100)
    v.sent("e", "a", 300)  # b's 100 rows count 100 / 2**3 = 12.5 now: under 1/6 of 312.5
    assert v.order("e", ["a", "b"]) == ["b", "a"]
    v = ExpertVoices(2, half_life_rows=1e9)
    v.sent("e", "b", 100)
    v.sent("e", "a", 300)  # without fading, 100 of 400 is heard
    assert v.order("e", ["a", "b"]) == ["a", "b"]


def test_a_router_that_always_prefers_one_server_still_reaches_enough_voices():
    # the server expected to finish first is always "a" (a swarm with room to spare):
    # over many calls, three servers each keep at least the floor share, and the
    # fastest still gets most of the work
    v = ExpertVoices(3, half_life_rows=2000)
    got: Counter[str] = Counter()
    for _ in range(2000):
        server = v.order("e", ["a", "b", "c", "d"])[0]
        v.sent("e", server, 16)
        got[server] += 16
    total = sum(got.values())
    floor = v.floor(4)
    heard = [s for s in "abcd" if got[s] / total >= floor * 0.9]
    assert len(heard) >= 3, got
    assert got["a"] / total > 0.6, got
    assert got["d"] == 0, got  # a fourth voice is not needed, and gets nothing


def test_servers_gone_long_ago_are_forgotten():
    v = ExpertVoices(3, half_life_rows=100)
    for i in range(50):
        v.sent("e", f"gone{i}", 10)
    for _ in range(100):
        v.sent("e", "a", 100)  # 100 half-lives later
    assert set(v._rows["e"]) == {"a"}


@pytest.mark.parametrize(("voices", "half_life"), [(0, 10.0), (3, 0.0)])
def test_nonsense_settings_are_refused(voices, half_life):
    with pytest.raises(ValueError, match="need voices"):
        ExpertVoices(voices, half_life_rows=half_life)
