"""The trainer's events typed once (core/trainer/events.py): what ``owner train --json``
writes, the demo reads back; a person's progress display shows every kind."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from core.trainer.events import (
    AggregatorShown,
    Evaluated,
    ExpertsNote,
    TrainerEvent,
    TrainingProgressed,
    TrainingStarted,
    TrainingSummary,
    Waiting,
    read_event,
)
from core.trainer.progress import TrainingProgress, json_line

EVENTS: list[TrainerEvent] = [
    TrainingStarted(
        project="p",
        name="tiny",
        data="stdlib",
        data_bytes=2_000_000,
        files=12,
        resumed_at_step=None,
        steps=100,
        peer="12D3KooWtrainer",
        device="cpu",
    ),
    TrainingProgressed(
        step=10,
        steps=100,
        loss=3.2,
        samples=320,
        samples_per_s=41.5,
        volunteers=2,
        version_min=1,
        version_max=4,
        failed_steps=0,
        stale_steps=1,
        answered_by={"12D3KooWa": 30},
    ),
    ExpertsNote(note="aggregator 4rTz: 2 expert(s) wait for more volunteers"),
    Evaluated(step=10, loss=2.9),
    Waiting(step=10, failed_steps=3),
    TrainingSummary(
        steps=100,
        samples=3200,
        tokens=204_800,
        seconds=80.0,
        samples_per_s=40.0,
        initial_loss=5.6,
        final_loss=2.1,
        failed_steps=3,
        stopped_early=False,
        volunteers_answered=2,
        answered_by={"12D3KooWa": 300},
        version_min=5,
        version_max=9,
        aggregators=[
            AggregatorShown(key="k", peer="12D3KooWagg", accepted=12, rejected={"stale": 1}),
            AggregatorShown(key="k2", peer="12D3KooWagg2", unreachable="timed out"),
        ],
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.event)
def test_an_event_reads_back_from_its_json_line(event, capsys):
    json_line(event)
    line = capsys.readouterr().out
    assert line.endswith("\n")
    assert read_event(json.loads(line)) == event


def test_a_loss_that_is_no_number_stays_nan_on_the_line(capsys):
    json_line(Evaluated(step=0, loss=math.nan))
    line = capsys.readouterr().out
    assert '"loss":NaN' in line
    event = read_event(json.loads(line))
    assert isinstance(event, Evaluated)
    assert math.isnan(event.loss)


@pytest.mark.parametrize(
    "obj", [{"event": "swarm", "volunteers": 3}, {"event": "eval", "step": "ten"}, [1, 2], None]
)
def test_what_is_no_known_event_reads_as_none(obj):
    assert read_event(obj) is None


def test_a_newer_trainers_extra_figures_are_ignored():
    event = read_event({"event": "waiting", "step": 3, "failed_steps": 1, "joules": 9})
    assert event == Waiting(step=3, failed_steps=1)


def test_the_progress_display_shows_every_kind_of_event():
    out = io.StringIO()
    with TrainingProgress(Console(file=out, width=200)) as show:
        for event in EVENTS:
            show(event)
    text = out.getvalue()
    assert "project tiny (p): 2.0 MB of text from 12 files" in text
    assert "experts not learning: aggregator 4rTz" in text
    assert "step 10: validation loss 2.900" in text
    assert "done: 100 steps, 3200 samples, 40.0 samples/s; validation loss 5.600 -> 2.100" in text
    assert "aggregator 12D3KooWagg: 12 contributions accepted, rejected: stale 1" in text
    assert "aggregator 12D3KooWagg2: timed out" in text
