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
