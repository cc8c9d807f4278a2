"""agg.stats typed once (core/protocol/aggregator_methods.py AggregatorReport): what the
aggregator writes, the owner's status and the trainer read back; why the experts'
versions do not move, in words, from those accounts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.project.owner import AggregatorAccount, why_experts_wait
from core.protocol.aggregator_methods import (
    AggregatorReport,
    ContributionAuditReport,
    ContributorReport,
)


def test_a_report_reads_back_as_it_was_written():
    report = AggregatorReport(
        accepted=3,
        rejected={"stale": 1},
        rounds=2,
        versions={"ffn.0.0": 2},
        contributors={"ab": ContributorReport(accepted=3, rounds=2, influence=0.9)},
        audits=ContributionAuditReport(drawn=1, passed=1),
        pending_samples={"ffn.0.0": 64},
        short_of_contributors={"ffn.0.0": 1},
        lateness=[3, 1],
        mean_versions_late=0.25,
        mean_round_wait_s=12.5,
        mean_age_s=30.0,
    )
    assert AggregatorReport.model_validate(report.model_dump()) == report


def test_a_newer_aggregators_figures_are_ignored_and_wrong_types_refused():
    assert AggregatorReport.model_validate({"accepted": 1, "joules": 5}).accepted == 1
    with pytest.raises(ValidationError):
        AggregatorReport.model_validate({"versions": {"ffn.0.0": "two"}})


@pytest.mark.parametrize(
    ("accounts", "words"),
    [
        ([], ""),
        ([AggregatorAccount("k", "12D3KooWaggregatorA", AggregatorReport())], ""),
        (
            [AggregatorAccount("k", "12D3KooWaggregatorA", unreachable="timed out")],
            "aggregator regatorA cannot be reached (timed out)",
        ),
        (
            [
                AggregatorAccount(
                    "k",
                    "12D3KooWaggregatorB",
                    AggregatorReport(short_of_contributors={"ffn.1.0": 2, "ffn.0.0": 1}),
                )
            ],
            "aggregator regatorB: 2 expert(s) wait for more volunteers (a version needs 3 "
            "distinct contributors, the manifest's min_contributors; ffn.0.0 needs 1 more)",
        ),
    ],
)
def test_why_experts_wait_says_it_from_the_accounts(accounts, words):
    assert why_experts_wait(accounts, 3) == words


def test_an_account_shows_as_the_status_always_showed_it():
    shown = AggregatorAccount("k", "p", AggregatorReport(accepted=2)).to_obj()
    assert (shown["key"], shown["peer"], shown["accepted"]) == ("k", "p", 2)
    assert AggregatorAccount("k", "p", unreachable="x").to_obj() == {
        "key": "k",
        "peer": "p",
        "unreachable": "x",
    }
