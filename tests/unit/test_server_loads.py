"""The trainer's choice of server (core/moe/load.py): the one expected to finish first."""

from __future__ import annotations

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
