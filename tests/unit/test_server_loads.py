"""The trainer's choice of server (core/moe/load.py): the one expected to finish first."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable

import pytest

from core.moe.load import ServerLoads


@pytest.mark.parametrize(
    ("setup", "units", "now", "expected"),
    [
        # nothing known: spread by the work sent and not answered
        ([], 10, 0.0, ["a", "b"]),
        ([("sent", "a", 30)], 10, 0.0, ["b", "a"]),
        # a server twice as fast takes twice the backlog
        (
            [
                ("rate", "a", 100.0, 0.0),
                ("rate", "b", 50.0, 0.0),
                ("sent", "a", 60),
                ("sent", "b", 20),
            ],
            10,
            0.0,
            ["b", "a"],  # a: (60+10)/100 = 0.7 s; b: (20+10)/50 = 0.6 s
        ),
        (
            [
                ("rate", "a", 100.0, 0.0),
                ("rate", "b", 50.0, 0.0),
                ("sent", "a", 40),
                ("sent", "b", 20),
            ],
            10,
            0.0,
            ["a", "b"],  # a: 0.5 s; b: 0.6 s
        ),
        # a reported queue counts, and drains at the server's rate as time passes
        ([("rate", "a", 10.0, 0.0, 50.0), ("rate", "b", 10.0, 0.0)], 10, 0.0, ["b", "a"]),
        (
            [("rate", "a", 10.0, 0.0, 50.0), ("rate", "b", 10.0, 0.0, 0.0), ("sent", "b", 20)],
            10,
            5.0,
            ["a", "b"],
        ),
        # a server not measured yet is taken to be as fast as the typical one
        ([("rate", "a", 10.0, 0.0), ("sent", "a", 100)], 10, 0.0, ["b", "a"]),
        # equals keep their given order (the finder's ranking)
        ([("rate", "a", 10.0, 0.0), ("rate", "b", 10.0, 0.0)], 10, 0.0, ["a", "b"]),
    ],
)
def test_the_server_expected_to_finish_first_comes_first(setup, units, now, expected):
    loads = ServerLoads()
    for step in setup:
        if step[0] == "sent":
            loads.sent(step[1], step[2])
        else:
            _, server, rate, at, *queue = step
            loads.sent(server, 0)
            loads.ended(server, 0, at, rate=rate, queue=queue[0] if queue else None)
    assert loads.order(["a", "b"], units, now) == expected


def test_an_answer_ends_the_work_it_was_for_and_never_goes_below_zero():
    loads = ServerLoads()
    loads.sent("a", 10)
    loads.sent("a", 5)
    loads.ended("a", 10, 1.0, rate=5.0)
    assert loads.finish_time("a", 0, 1.0) == pytest.approx(1.0)  # 5 units at 5/s
    loads.ended("a", 50, 2.0)  # a call that failed and was counted twice: still >= 0
    assert loads.finish_time("a", 5, 2.0) == pytest.approx(1.0)


def test_nonsense_reports_are_ignored():
    loads = ServerLoads()
    loads.ended("a", 0, 0.0, rate=-3.0, queue=-1.0)
    loads.ended("a", 0, 0.0, rate=0.0)
    assert loads.finish_time("a", 10, 0.0) == 10  # still unmeasured


@pytest.mark.parametrize(
    ("answers", "given", "expected", "why"),
    [
        # a: 0.25 s of every call outside the server; b: none. Equal backlogs: b first
        ([("a", 0.30, 0.05), ("b", 0.05, 0.05)], "ab", "ba", "the far link costs time"),
        # a far server still wins when the near one's queue takes longer than the link
        (
            [("a", 0.30, 0.05), ("b", 0.05, 0.05), ("sent", "b", 40)],
            "ab",
            "ab",
            "b's backlog (40 units at 100/s = 0.4 s) outweighs a's 0.25 s link",
        ),
        # a server that claims more time than the call took gets no overhead, not less
        # (b is listed first: a lie that bought priority would put a before it)
        ([("a", 0.10, 9.0), ("b", 0.10, 0.10)], "ba", "ba", "a lie does not buy priority"),
        # a server never answered counts as near, so that it gets tried
        ([("a", 0.30, 0.05), ("b", 0.30, 0.05)], "abc", "cab", "c: not answered yet"),
        ([("a", 0.30, 0.05), ("b", 0.05, 0.05)], "acb", "cba", "c: as near as b, given first"),
    ],
)
def test_the_links_share_of_a_calls_time_counts(answers, given, expected, why):
    loads = ServerLoads()
    for server in "abc":  # every server measured at the same speed
        loads.ended(server, 0, 0.0, rate=100.0)
    for step in answers:
        if step[0] == "sent":
            loads.sent(step[1], step[2])
            continue
        server, elapsed, seconds = step
        loads.ended(server, 0, 0.0, elapsed=elapsed, seconds=seconds)
    assert loads.order(list(given), 10, 0.0) == list(expected), why


@pytest.mark.parametrize(
    ("rows", "servers", "units_per_row", "rate", "overhead", "parts"),
    [
        # one server, or nothing known of speed or links: one call
        (512, 1, 3.0, 192.0, 0.2, 1),
        (512, 16, 3.0, None, 0.2, 1),
        (512, 16, 3.0, 192.0, None, 1),
        # the emulated 0.125 samples/s volunteer: 8 s of work on one server; parts of at
        # least 4 x 0.2 s of compute: 10, but no more than 512 // 32 = 16 rows-wise
        (512, 16, 3.0, 192.0, 0.2, 10),
        # ...and never more than there are servers
        (512, 4, 3.0, 192.0, 0.2, 4),
        # a fast server (the demo's CPU volunteers): 0.08 s of work is not worth a split,
        # however near the link (MIN_PART_SECONDS)
        (512, 16, 3.0, 20_000.0, 0.001, 1),
        # a few rows are never split below MIN_PART_ROWS
        (40, 16, 3.0, 1.0, 0.2, 1),
        (64, 16, 3.0, 1.0, 0.2, 2),
        # a far link makes each part longer
        (512, 16, 3.0, 192.0, 1.0, 2),
    ],
)
def test_an_experts_rows_are_split_over_its_servers_when_the_work_is_long(
    rows, servers, units_per_row, rate, overhead, parts
):
    from core.moe.load import split_parts

    assert split_parts(rows, servers, units_per_row, rate, overhead) == parts


def test_the_split_uses_what_is_known_of_the_experts_servers():
    loads = ServerLoads()
    assert loads.parts(["a", "b"], 512, 3.0) == 1  # nothing known yet
    loads.sent("a", 10)
    loads.ended("a", 10, 1.0, rate=192.0, elapsed=1.0, seconds=0.8)  # 0.2 s of link
    loads.sent("b", 10)
    loads.ended("b", 10, 1.0, rate=192.0, elapsed=1.0, seconds=0.8)
    assert loads.parts(["a", "b"], 512, 3.0) == 2
    # a server not measured yet is taken to be typical
    assert loads.parts(["a", "b", "c", "d"], 512, 3.0) == 4


@pytest.mark.parametrize(
    ("free_at", "rates", "work", "level", "why"),
    [
        ([0.0, 0.0], [1.0, 1.0], 4.0, 2.0, "equal servers share the work"),
        ([0.0, 3.0], [1.0, 1.0], 2.0, 2.0, "a server busy past the level gets none"),
        ([0.0, 1.0], [1.0, 1.0], 3.0, 2.0, "the busy one joins once the level reaches it"),
        ([0.0, 0.0], [3.0, 1.0], 4.0, 1.0, "a faster server holds more of the work"),
        ([0.5, 2.0], [1.0, 1.0], 0.0, 0.5, "no work: the soonest free"),
    ],
)
def test_the_water_level_is_when_servers_free_at_different_times_finish_the_work(
    free_at, rates, work, level, why
):
    from core.moe.load import water_level

    assert water_level(free_at, rates, work) == pytest.approx(level), why


@pytest.mark.parametrize(
    ("rows", "room", "pieces", "why"),
    [
        (256, {"a": 128.0, "b": 128.0}, [(0, 128, "a"), (128, 256, "b")], "each filled in turn"),
        (256, {"a": 300.0, "b": 10.0}, [(0, 256, "a")], "the first holds it all"),
        (
            100,
            {"a": 10.0, "b": 60.0, "c": 60.0},
            [(0, 10, "a"), (10, 70, "b"), (70, 100, "c")],
            "in the order given, however small",
        ),
        (
            100,
            {"a": 0.0, "b": 40.0},
            [(0, 70, "b"), (70, 100, "a")],
            "no room: none; the rest shared out evenly",
        ),
        (
            300,
            {"a": 50.0, "b": 60.0},
            [(0, 145, "a"), (145, 300, "b")],
            "the rest shared out evenly",
        ),
        (
            64,
            {"a": 31.2, "b": 40.0},
            [(0, 32, "a"), (32, 64, "b")],
            "rooms rounded up: no row left over",
        ),
    ],
)
def test_an_experts_rows_are_laid_over_its_servers_room(rows, room, pieces, why):
    from core.moe.load import lay

    got = lay(rows, list(room), dict(room))
    assert [(p.start, p.stop, p.server) for p in got] == pieces, why


def _measured(loads: ServerLoads, servers: Iterable[str], rate: float = 96.0) -> None:
    for server in servers:  # the emulated 0.125 samples/s volunteer, 0.2 s links
        loads.sent(server, 10)
        loads.ended(server, 10, 0.0, rate=rate, elapsed=1.0, seconds=0.8)


def test_a_phase_is_levelled_over_the_servers_with_a_call_per_server_and_expert():
    """Eight experts of unequal rows over 32 servers that serve them all (the emulated
    swarm's 32 volunteers, one batch: 2,048 rows): every server gets about the mean,
    where equal parts of each expert sent to the soonest server left the busiest with
    1.44 times it (stop 65)."""
    loads = ServerLoads()
    servers = [f"s{i:02d}" for i in range(32)]
    _measured(loads, servers)
    rows = [300, 180, 260, 240, 310, 200, 278, 280]
    planned = loads.plan([(servers, r) for r in rows], 3.0, 0.0)
    per_server: dict[Hashable, int] = {}
    for expert, pieces in zip(rows, planned, strict=True):
        assert pieces is not None
        assert pieces[0].start == 0  # whole, in order
        assert pieces[-1].stop == expert
        assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))
        assert len({p.server for p in pieces}) == len(pieces)  # one piece per server
        for p in pieces:
            per_server[p.server] = per_server.get(p.server, 0) + p.rows
    mean = sum(rows) / len(servers)
    assert len(per_server) == len(servers)
    assert max(per_server.values()) <= mean + 1  # rooms are rounded up to whole rows
    assert sum(len(p or []) for p in planned) <= len(servers) + len(rows) - 1


def test_a_busy_server_gets_less_of_a_phase_and_short_work_goes_whole():
    loads = ServerLoads()
    _measured(loads, "abcd")
    loads.sent("a", 96.0 * 4)  # four seconds of work outstanding on a: past the level
    planned = loads.plan([(list("abcd"), 256), (list("abcd"), 20), ([], 64)], 3.0, 0.0)
    pieces, short, unserved = planned
    assert pieces is not None
    assert "a" not in {p.server for p in pieces}  # busy past the level
    # too few rows to split: one piece, placed with the rest (left to the choice when
    # sent, it took the soonest server, which the plan filled too)
    assert short is not None
    assert len(short) == 1
    assert short[0].rows == 20
    assert short[0].server != "a"
    assert unserved is None
    rows_on: dict[Hashable, int] = {}
    for p in [*pieces, *short]:
        rows_on[p.server] = rows_on.get(p.server, 0) + p.rows
    assert max(rows_on.values()) - min(rows_on.values()) <= 1  # b, c, d level
    # nothing worth splitting, or nothing known of the servers: nothing planned
    assert loads.plan([(list("abcd"), 20), (list("abcd"), 30)], 3.0, 0.0) == [None, None]
    assert ServerLoads().plan([(list("abcd"), 256)], 3.0, 0.0) == [None]


def test_experts_with_fewer_servers_are_cut_first():
    """An expert only two servers hold takes their room before one that all hold."""
    loads = ServerLoads()
    _measured(loads, "abcd")
    planned = loads.plan([(list("abcd"), 256), (["a", "b"], 256)], 3.0, 0.0)
    wide, narrow = planned
    assert narrow is not None
    assert wide is not None
    assert {p.server for p in narrow} == {"a", "b"}
    assert {p.server for p in wide} == {"c", "d"}


def test_a_server_an_experts_rounds_need_to_hear_gets_a_piece_of_it():
    """Laid in a fixed order, one expert of eight reached fewer than its rounds' 3
    voices in 14% of rounds at 4 servers (stop 65, simulated); a server the rounds have
    not heard enough of (core/moe/voices.py) takes the expert's first piece, of at
    least the share that counts it heard, or the whole of an expert not worth splitting."""
    loads = ServerLoads()
    _measured(loads, "abcd")
    requests = [(list("abcd"), 256), (list("abcd"), 256), (list("abcd"), 20)]
    plain = loads.plan(requests, 3.0, 0.0)
    assert plain[1] is not None
    assert plain[2] is not None
    assert "b" not in {p.server for p in plain[1]}  # the line gives it c, d and a
    assert [p.server for p in plain[2]] == ["a"]
    heard = loads.plan(requests, 3.0, 0.0, [[], ["b"], ["c"]], [0.0, 1 / 9, 1 / 9])
    second, short = heard[1], heard[2]
    assert second is not None
    assert short is not None
    assert second[0].server == "b"
    assert second[0].rows >= 256 / 9
    assert sum(p.rows for p in second) == 256
    assert [p.server for p in short] == ["c"]
