"""Which refusals of a contribution are offences, and how long a volunteer waits after
one that says "come back later": pure, from tables."""

from __future__ import annotations

import pytest

from core.protocol.refusals import NORMAL, Refusal, in_words, is_offence, pause_after


@pytest.mark.parametrize(
    ("reason", "offence"),
    [
        # the normal course of a project: an honest volunteer meets them all
        ("waiting_for_contributors", False),
        ("stale", False),  # versions moved faster than it pulled them
        ("replay", False),  # a retry of one that got through
        ("slow_down", False),  # someone else at its address offended
        ("future_version", False),  # the owner reset the aggregator's state
        ("clock", False),
        ("banned_by_project", False),  # counted once, by whoever banned it
        # what no honest volunteer sends
        ("foreign_receipt", True),
        ("receipt_reused", False),  # a trainer's retry elsewhere, same receipt
        ("inflated_samples", True),
        ("payload_mismatch", True),
        ("non_finite", True),
        ("shape", True),
        ("bad_signature", True),
        ("not_a_trainer", True),
        ("something new", True),  # unknown: an offence until it is listed
    ],
)
def test_offences(reason, offence):
    assert is_offence(reason) is offence
    assert (reason in NORMAL) is not offence


@pytest.mark.parametrize(
    ("reason", "repeats", "round_seconds", "pause"),
    [
        ("waiting_for_contributors", 1, 60.0, 60.0),
        ("waiting_for_contributors", 2, 60.0, 120.0),
        ("waiting_for_contributors", 4, 60.0, 480.0),
        ("waiting_for_contributors", 5, 60.0, 600.0),  # at most ten minutes
        ("waiting_for_contributors", 100, 60.0, 600.0),
        ("slow_down", 1, 5.0, 5.0),
        ("banned", 2, 60.0, 120.0),  # no use sending until the ban ends
        ("stale", 3, 60.0, 0.0),  # pull the new weights and go on at once
        ("foreign_receipt", 1, 60.0, 0.0),
        ("waiting_for_contributors", 0, 60.0, 0.0),
    ],
)
def test_pause_after(reason, repeats, round_seconds, pause):
    assert pause_after(reason, repeats, round_seconds) == pause


def test_every_normal_refusal_and_ban_is_said_in_words_and_an_offence_by_its_code():
    for reason in NORMAL | {Refusal.BANNED}:
        words = in_words(reason)
        assert not words.startswith("rejected as invalid"), reason
        assert "_" not in words, reason  # no code names
    assert in_words("payload_mismatch") == "rejected as invalid (payload_mismatch)"
    assert in_words("something new") == "rejected as invalid (something new)"
