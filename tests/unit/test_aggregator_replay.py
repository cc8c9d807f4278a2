"""What an aggregator remembers against replays (core/aggregator/replay.py): nonces for an
hour after their contributions were signed, receipts' batch ids while their version is
open; what it forgets can no longer be accepted (refused for its clock or as stale,
without a strike), and its state stops growing with the project's history."""

from __future__ import annotations

import pytest

from core.aggregator.replay import ANY_EXPERT, NONCE_HORIZON_S, SeenContributions
from core.aggregator.store import StateFile
from core.aggregator.verify import Rejected
from net import Identity
from tests.clocks import ManualClock
from tests.unit.test_aggregator_core import (  # the fixture closes the cores made
    UID,
    _close_cores,  # noqa: F401
    contribution,
    make_core,
    settings,
)

NOW = 100_000.0


@pytest.mark.parametrize(
    ("nonces", "batches", "versions", "kept_nonces", "kept_batches"),
    [
        # a nonce signed within the hour stays; one signed earlier goes (its copy is
        # refused for its clock)
        ({b"new": NOW - 10, b"hour": NOW - NONCE_HORIZON_S}, {}, {}, {b"new", b"hour"}, set()),
        ({b"old": NOW - NONCE_HORIZON_S - 1, b"new": NOW}, {}, {}, {b"new"}, set()),
        # a batch id stays while its expert is at most the bound (2) past its version
        ({}, {b"b0": ("e", 0), b"b1": ("e", 1)}, {"e": 2}, set(), {b"b0", b"b1"}),
        ({}, {b"b0": ("e", 0), b"b1": ("e", 1)}, {"e": 3}, set(), {b"b1"}),
        # each by its own expert's version
        ({}, {b"b0": ("e", 0), b"f0": ("f", 0)}, {"e": 3, "f": 1}, set(), {b"f0"}),
        # an expert no longer served: kept (no version says it is closed)
        ({}, {b"g0": ("g", 0)}, {"e": 9}, set(), {b"g0"}),
        # a batch id of a state written before they were kept with their expert: it
        # goes once every expert is past the bound from the highest version then (5)
        ({}, {b"l": (ANY_EXPERT, 5)}, {"e": 9, "f": 7}, set(), {b"l"}),
        ({}, {b"l": (ANY_EXPERT, 5)}, {"e": 9, "f": 8}, set(), set()),
    ],
)
def test_what_no_contribution_can_be_accepted_with_is_forgotten(
    nonces, batches, versions, kept_nonces, kept_batches
):
    seen = SeenContributions(dict(nonces), dict(batches))
    forgotten = seen.forget(NOW, versions, staleness_bound=2)
    assert set(seen.nonces) == kept_nonces
    assert set(seen.batches) == kept_batches
    assert forgotten == len(nonces) + len(batches) - len(kept_nonces) - len(kept_batches)


def test_the_lists_of_an_older_state_load_and_save_as_the_new_form():
    old = {"seen_nonces": [b"n1", b"n2"], "seen_batches": [b"b1"]}
    seen = SeenContributions.load(old, NOW, {"e": 4, "f": 6})
    assert seen.nonces == {b"n1": NOW, b"n2": NOW}  # an hour more from now
    assert seen.batches == {b"b1": (ANY_EXPERT, 6)}
    again = SeenContributions.load({"seen": seen.save()}, NOW + 1, {})
    assert again == seen


def test_an_aggregator_forgets_old_contributions_and_still_refuses_their_copies(tmp_path):
    clock = ManualClock()
    core = make_core(settings(round_samples=4, staleness_bound=1), tmp_path, clock=clock)
    early = Identity.generate()
    first = contribution(core, early, version=0)
    core.submit(*first)
    with pytest.raises(Rejected, match="replay"):
        core.submit(*first)
    # versions move on: the first's receipt (version 0) is soon past the bound
    others = Identity.generate()
    for _ in range(3):
        core.submit(*contribution(core, others, version=core.versions[UID]))
        core.run_round(UID)
    assert core.versions[UID] == 3
    assert first[0].receipts[0].batch_id not in core.seen.batches
    assert first[0].nonce in core.seen.nonces  # signed within the hour
    # to an hour and a second after it was signed (by the computer's clock: the time
    # the test took so far is not counted twice)
    clock.advance(first[0].timestamp + NONCE_HORIZON_S + 1 - clock.wall())
    core.checkpoint()
    assert first[0].nonce not in core.seen.nonces
    # its copy is refused all the same, for its clock, and counts as nothing against it
    with pytest.raises(Rejected, match="clock"):
        core.submit(*first)
    rejected = core.stats.contributors[early.public_key.hex()].rejected
    assert dict(rejected) == {"replay": 1, "clock": 1}
    assert core.stats.banned_peers == 0
    # what is written is what is remembered, and a restart reads it back
    saved = StateFile(tmp_path / "seen.msgpack").load()
    assert saved is not None
    assert "seen_nonces" not in saved
    assert len(saved["seen"]["nonces"]) == len(core.seen.nonces)
    core.close()
    again = make_core(settings(round_samples=4, staleness_bound=1), tmp_path, clock=clock)
    assert again.seen == core.seen


def test_the_remembered_contributions_stay_bounded_over_a_long_project(tmp_path):
    """A contribution every minute for three hours: the state keeps the last hour's."""
    clock = ManualClock()
    core = make_core(settings(round_samples=4, staleness_bound=1), tmp_path, clock=clock)
    volunteer = Identity.generate()
    for _ in range(3 * 60):
        msg, parts = contribution(core, volunteer, version=core.versions[UID])
        # signed now by the aggregator's clock (the helper signs with the computer's)
        msg = type(msg).create(
            volunteer,
            project=msg.project,
            uid=msg.uid,
            base_version=msg.base_version,
            codec=msg.codec,
            params=list(msg.params),
            receipts=list(msg.receipts),
            parts=parts,
            timestamp=int(clock.wall()),
        )
        core.submit(msg, parts)
        core.run_round(UID)
        clock.advance(60.0)
    assert core.versions[UID] == 3 * 60
    assert len(core.seen.nonces) <= NONCE_HORIZON_S / 60 + 1
    assert len(core.seen.batches) <= core.settings.staleness_bound + 1
