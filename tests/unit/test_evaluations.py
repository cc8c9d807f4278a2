"""Signed evaluations (core/protocol/evaluations.py) and the aggregator's store of them
(core/aggregator/evaluations.py): only the manifest's trainers are kept, a forged or
altered point is refused, the store stays bounded over a long run and its file survives
a kill in the middle of a write."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.aggregator.evaluations import (
    MAX_POINTS_PER_TRAINER,
    EvaluationRefused,
    EvaluationStore,
    thinned,
)
from core.protocol.aggregator_methods import AggregatorReport, ContributorReport
from core.protocol.evaluations import EvaluationPoint
from core.protocol.fields import MessageError
from core.protocol.signed_report import SignedReport
from net import Identity
from net.codec import pack

TRAINER = Identity.from_seed(b"t" * 32)
STRANGER = Identity.from_seed(b"s" * 32)
PROJECT = "ab" * 16


def point(t: float, loss: float = 3.0, who: Identity = TRAINER, step: int = 0) -> EvaluationPoint:
    return EvaluationPoint.sign(
        who,
        PROJECT,
        step=step or int(t),
        samples=16 * int(t),
        tokens=2048 * int(t),
        loss=loss,
        time=t,
    )


def test_a_point_round_trips_and_verifies() -> None:
    p = point(1000.0, 2.5)
    back = EvaluationPoint.decode(p.encode())
    assert back == p
    assert back.verify()


@pytest.mark.parametrize(
    "change",
    [
        {"loss": 1.0},
        {"step": 7},
        {"samples": 1},
        {"time": 5.0},
        {"project": "cd" * 16},
        {"trainer": STRANGER.public_key},
    ],
)
def test_an_altered_point_no_longer_verifies(change: dict[str, Any]) -> None:
    assert not replace(point(1000.0), **change).verify()


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        ([PROJECT, TRAINER.public_key, 1, 1, 1, float("nan"), 1.0, b"x" * 64], "loss"),
        ([PROJECT, TRAINER.public_key, 1, 1, 1, -1.0, 1.0, b"x" * 64], "loss"),
        ([PROJECT, TRAINER.public_key, -1, 1, 1, 1.0, 1.0, b"x" * 64], "step"),
        ([PROJECT, b"short", 1, 1, 1, 1.0, 1.0, b"x" * 64], "trainer"),
        ([PROJECT, TRAINER.public_key, 1, 1, 1, 1.0, float("inf"), b"x" * 64], "time"),
        ([PROJECT, TRAINER.public_key, 1, 1, 1, 1.0], "8 fields"),
    ],
)
def test_malformed_points_are_refused_with_the_field_named(obj: list[object], why: str) -> None:
    with pytest.raises(MessageError, match=why):
        EvaluationPoint.decode(pack(obj))


def test_an_oversized_point_is_refused_before_decoding() -> None:
    with pytest.raises(MessageError, match="at most"):
        EvaluationPoint.decode(b"\x00" * 10_000)


def store(path: Path | None = None) -> EvaluationStore:
    return EvaluationStore(path, PROJECT, {TRAINER.public_key})


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (point(10.0, who=STRANGER), "no such trainer"),
        (replace(point(10.0), loss=0.1), "signature"),
        (
            EvaluationPoint.sign(
                TRAINER, "cd" * 16, step=1, samples=1, tokens=1, loss=1.0, time=10.0
            ),
            "another project",
        ),
        (point(10_000.0), "future"),
    ],
)
def test_the_store_keeps_only_the_manifests_trainers_signed_points(
    bad: EvaluationPoint, why: str
) -> None:
    s = store()
    with pytest.raises(EvaluationRefused, match=why):
        s.add(bad, now=100.0)
    assert s.after(0.0, 10) == ([], False)


def test_points_come_back_in_time_order_in_pages_without_repeats() -> None:
    s = store()
    for t in (30.0, 10.0, 20.0, 20.0, 40.0):
        s.add(point(t), now=100.0)
    first, more = s.after(0.0, 2)
    assert [p.time for p in first] == [10.0, 20.0]
    assert more
    rest, more = s.after(first[-1].time, 2)
    assert [p.time for p in rest] == [30.0, 40.0]
    assert not more


@pytest.mark.parametrize("n", [0, 1, 5, 512, 513, 1000, 5000])
def test_thinning_keeps_at_most_the_limit_the_newest_and_the_oldest(n: int) -> None:
    points = [point(float(t + 1)) for t in range(n)]
    out = thinned(points, 512)
    assert len(out) == min(n, 512) or (n > 512 and 256 <= len(out) <= 512)
    if n:
        assert out[-1] == points[-1]
        assert out[0] == points[0]
        assert [p.time for p in out] == sorted(p.time for p in out)


def test_a_long_run_stays_bounded_and_keeps_its_start_and_end(tmp_path: Path) -> None:
    s = store(tmp_path / "evaluations.bin")
    for t in range(1, 3 * MAX_POINTS_PER_TRAINER):
        s.add(point(float(t)), now=1e9)
    kept = s.points[TRAINER.public_key]
    assert len(kept) <= MAX_POINTS_PER_TRAINER
    assert kept[0].time == 1.0
    assert kept[-1].time == 3 * MAX_POINTS_PER_TRAINER - 1
    again = store(tmp_path / "evaluations.bin")
    assert again.load() == len(kept)
    assert again.points[TRAINER.public_key] == kept


def test_a_torn_last_record_is_cut_off_and_later_points_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "evaluations.bin"
    s = store(path)
    for t in (1.0, 2.0, 3.0):
        s.add(point(t), now=100.0)
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])  # a kill -9 in the middle of the third record
    after_crash = store(path)
    assert after_crash.load() == 2
    after_crash.add(point(4.0), now=100.0)
    again = store(path)
    assert again.load() == 3
    assert [p.time for p in again.points[TRAINER.public_key]] == [1.0, 2.0, 4.0]


def test_a_record_of_a_trainer_the_manifest_dropped_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "evaluations.bin"
    EvaluationStore(path, PROJECT, {TRAINER.public_key, STRANGER.public_key}).add(
        point(5.0, who=STRANGER), now=100.0
    )
    s = store(path)
    assert s.load() == 0
    assert s.after(0.0, 10) == ([], False)


def report() -> AggregatorReport:
    return AggregatorReport(
        accepted=12,
        rounds=3,
        versions={"ffn.0.1": 3},
        contributors={"aa" * 32: ContributorReport(accepted=12, credit=96.5)},
    )


def test_a_signed_report_round_trips_and_an_altered_one_fails() -> None:
    agg = Identity.from_seed(b"a" * 32)
    signed = SignedReport.sign(agg, PROJECT, report(), issued=1000.0)
    back = SignedReport.decode(signed.encode())
    assert back.verify()
    assert back.report() == report()
    assert not replace(
        back, body=pack(report().model_copy(update={"accepted": 99}).model_dump())
    ).verify()
    assert not replace(back, aggregator=TRAINER.public_key).verify()
    assert not replace(back, issued=2000.0).verify()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x00" * (61 * 1024), "at most"),
        (pack(["p", b"a" * 32, float("nan"), b"", b"s" * 64]), "issued"),
        (pack(["p", b"a" * 32, 1.0, "body", b"s" * 64]), "body"),
        (pack(["p", b"a" * 32, 1.0, b""]), "5 fields"),
        ("not bytes", "bytes"),
    ],
)
def test_malformed_signed_reports_are_refused(data: object, why: str) -> None:
    with pytest.raises(MessageError, match=why):
        SignedReport.decode(data)
