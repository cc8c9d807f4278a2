"""The project page's pure parts (core/page/collect.py's figures, core/page/render.py):
the leaderboard sums the aggregators' signed accounts, throughput comes from the
trainers' signed evaluations, the chart's ticks are round, and whatever a peer wrote
reaches the HTML escaped."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from core.page.collect import loss_curves, throughput
from core.page.render import loss_chart, nice_ticks, render_html, write_page
from core.project.leaderboard import leaderboard, rank_of
from core.protocol.evaluations import EvaluationPoint
from net import Identity
from net.identity import peer_id_from_public_key
from tests.page_figures import number, read_figures

T1 = Identity.from_seed(b"1" * 32)
T2 = Identity.from_seed(b"2" * 32)
A, B, C = ("aa" * 32, "bb" * 32, "cc" * 32)


def point(who: Identity, t: float, samples: int, loss: float) -> EvaluationPoint:
    return EvaluationPoint.sign(
        who, "p", step=samples // 16, samples=samples, tokens=samples * 128, loss=loss, time=t
    )


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.0, 10.0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
        (2.13, 2.61, [2.2, 2.3, 2.4, 2.5, 2.6]),
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (5.0, 5.0, [5.0]),
        (0.0, float("nan"), [0.0]),
    ],
)
def test_ticks_are_round_and_inside_the_range(
    low: float, high: float, expected: list[float]
) -> None:
    assert nice_ticks(low, high) == pytest.approx(expected)


def test_the_leaderboard_sums_the_aggregators_and_ranks_by_credit() -> None:
    aggs: list[dict[str, Any]] = [
        {
            "contributors": {
                A: {"credit": 10.0, "accepted": 5, "rounds": 2, "samples": 12},
                B: {"credit": 30.0, "accepted": 1},
            }
        },
        {
            "contributors": {
                A: {"credit": 25.0, "accepted": 5, "credit_revoked": 0.0, "samples": 30}
            }
        },
        {"unreachable": "timed out"},
        {"contributors": {C: {"credit": 0.0, "accepted": 9, "credit_revoked": 40.0}}},
    ]
    rows = leaderboard(aggs)
    assert [(r["rank"], r["key"], r["credit"], r["accepted"]) for r in rows] == [
        (1, A, 35.0, 10),
        (2, B, 30.0, 1),
        (3, C, 0.0, 9),
    ]
    assert rows[2]["revoked"] == 40.0
    # the samples applied, summed (an account of an older aggregator lacks them: 0)
    assert [r["samples"] for r in rows] == [42, 0, 0]
    # a node's rank: its place, none with no credit or when not listed
    assert (rank_of(A, rows), rank_of(B, rows), rank_of(C, rows), rank_of("dd" * 32, rows)) == (
        1,
        2,
        None,
        None,
    )
    assert rows[0]["peer"] == str(peer_id_from_public_key(bytes.fromhex(A)))
    assert len(leaderboard(aggs, limit=2)) == 2


@pytest.mark.parametrize(
    ("points", "samples_per_s"),
    [
        ([], 0.0),
        ([(T1, 0.0, 0)], 0.0),
        ([(T1, 0.0, 0), (T1, 100.0, 1000)], 10.0),
        # the window: the last 600 s, from the last point before it
        ([(T1, 0.0, 0), (T1, 1000.0, 100), (T1, 1500.0, 5100)], 10.0),
        # two trainers add up
        ([(T1, 0.0, 0), (T1, 100.0, 1000), (T2, 0.0, 0), (T2, 50.0, 250)], 15.0),
        # a restarted trainer counting from 0 again gives no figure, not a negative one
        ([(T1, 0.0, 500), (T1, 100.0, 0)], 0.0),
    ],
)
def test_throughput_is_measured_from_the_signed_evaluations(
    points: list[tuple[Identity, float, int]], samples_per_s: float
) -> None:
    figures = throughput([point(w, t, s, 3.0) for w, t, s in points])
    assert figures["samples_per_s"] == pytest.approx(samples_per_s)
    assert figures["tokens_per_s"] == pytest.approx(samples_per_s * 128)


def test_the_chart_draws_one_line_per_trainer_inside_its_box() -> None:
    curves = loss_curves(
        [point(T1, 1000.0 + 60 * i, 16 * i, 5.0 - 0.1 * i) for i in range(20)]
        + [point(T2, 1500.0, 16, 4.0)]
    )
    chart = loss_chart(curves)
    assert chart is not None
    assert len(chart.lines) == 2
    assert chart.x_label == "minutes since the first evaluation"
    for line in chart.lines:
        for pair in line["points"].split():
            x, y = map(float, pair.split(","))
            assert 0 <= x <= 720
            assert 0 <= y <= 260
    assert loss_chart([]) is None


def test_the_figures_reader_reads_nested_and_void_elements() -> None:
    """tests/page_figures.py, which the page tests read pages with (a check of the
    checker): the innermost figure's text, void and self-closed elements skipped."""
    parsed = read_figures(
        '<div><span data-figure="a">1</span>/<span data-figure="b">2</span><br></div>'
        '<svg><line x1="0"/><text data-figure="t">x</text></svg>'
        '<table><tr data-row="r"><td data-figure="c">3,400</td></tr></table>'
    )
    assert parsed.figures == {"a": ["1"], "b": ["2"], "t": ["x"], "c": ["3,400"]}
    assert parsed.rows == {"r": 1}
    assert number("3,400") == 3400


def page_data(name: str = "demo-lm", reason: str = "answer failed its audit") -> dict[str, Any]:
    pts = [point(T1, 1000.0 + 60 * i, 160 * i, 5.0 - 0.2 * i) for i in range(6)]
    return {
        "generated": 2000.0,
        "project": {
            "id": "ab" * 16,
            "name": name,
            "description": "<b>bold</b> & co",
            "owner": "abcd-ef01-2345-6789",
            "serial": 2,
            "invite": "moehome://join/abab?peer=%2Fip4%2F127.0.0.1",
        },
        "status": {
            "experts_total": 4,
            "experts_covered": 3,
            "experts": {
                "ffn.0.0": [{"peer": "12D3KooWabcdefgh", "version": 3, "load": 0.1}],
                "ffn.0.1": [],
            },
            "volunteers": ["12D3KooWabcdefgh", "12D3KooWzyxwvuts"],
            "aggregators": [
                {
                    "peer": "12D3KooWagg",
                    "key": "k",
                    "accepted": 1234,
                    "rounds": 7,
                    "banned_peers": 1,
                    "versions": {"ffn.0.0": 3, "ffn.0.1": 5},
                },
                {"peer": "12D3KooWagg2", "key": "k2", "unreachable": "timed out"},
            ],
        },
        "loss": loss_curves(pts),
        "throughput": throughput(pts),
        "leaderboard": leaderboard([{"contributors": {A: {"credit": 1234.5, "accepted": 3}}}]),
        "bans": [
            {"peer": "12D3KooWcheat", "reason": reason, "until": 90_000.0, "by": "12D3KooWagg"}
        ],
    }


def test_the_page_shows_the_figures_it_was_given() -> None:
    parser = read_figures(render_html(page_data()))
    f = parser.figures
    assert f["name"] == ["demo-lm"]
    assert f["experts_covered"] == ["3"]
    assert f["experts_total"] == ["4"]
    assert f["volunteers"] == ["2"]
    assert f["accepted"] == ["1,234"]
    assert f["bans"] == ["1"]
    assert f["loss"] == ["4.000"]
    assert f["samples_per_s"] == ["2.7"]  # 800 samples in 300 s
    assert f["credit"] == ["1,234"] or f["credit"] == ["1,235"]
    assert f["invite"] == ["moehome://join/abab?peer=%2Fip4%2F127.0.0.1"]
    assert "answer failed its audit" in "".join(parser.text)
    assert "not reached: timed out" in " ".join(t.strip() for t in parser.text)


@pytest.mark.parametrize(
    ("name", "reason"), [("x", "<script>alert(1)</script>"), ("<img src=x onerror=alert(1)>", "r")]
)
def test_what_peers_wrote_is_escaped(name: str, reason: str) -> None:
    html = render_html(page_data(name=name, reason=reason))
    assert "<script>" not in html
    assert "<img" not in html
    assert "&lt;script&gt;" in html or "&lt;img" in html
    assert "<b>bold</b>" not in html


def test_a_page_without_evaluations_or_contributions_says_so() -> None:
    data = page_data()
    data |= {
        "loss": [],
        "leaderboard": [],
        "bans": [],
        "throughput": {"samples_per_s": 0.0, "tokens_per_s": 0.0},
    }
    parser = read_figures(render_html(data))
    text = " ".join(t.strip() for t in parser.text)
    assert "No trainer has reported an evaluation yet" in text
    assert "No contribution has reached a round yet" in text
    assert "Nobody is banned" in text
    assert parser.figures["loss"] == ["\u2013"]  # an en dash: no figure


def test_the_folder_holds_the_page_and_its_data(tmp_path: Path) -> None:
    page = write_page(page_data(), tmp_path / "page")
    assert page == tmp_path / "page" / "index.html"
    assert page.read_text().startswith("<!doctype html>")
    data = json.loads((tmp_path / "page" / "page.json").read_text())
    assert data["status"]["experts_covered"] == 3
    assert all(math.isfinite(p[4]) for c in data["loss"] for p in c["points"])
