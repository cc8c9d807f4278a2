"""Credit (core/aggregator/credit.py): granted at rounds for the samples the receipts bind
times the share the robust rule kept, booked per day, durable across a kill -9 at any
point of a round, taken back by bans."""

from __future__ import annotations

import pytest

from core.aggregator import credit as credit_module
from core.aggregator.core import AggregatorCore
from core.aggregator.credit import (
    EARLIER,
    CreditLedger,
    credited_share,
    credited_shares,
    round_grants,
)
from core.aggregator.rounds import RoundRule
from core.aggregator.verify import Rejected
from core.protocol.credit import day_of
from net import Identity
from tests.unit.test_aggregator_core import UID, contribution, make_core, settings


@pytest.mark.parametrize(
    ("samples", "kept", "grants"),
    [
        ({"a": 4, "b": 8}, {"a": 1.0, "b": 1.0}, {"a": 4.0, "b": 8.0}),
        ({"a": 4, "b": 8}, {"a": 0.5, "b": 1.0}, {"a": 2.0, "b": 8.0}),
        # thrown away by the rule, or not reported by it: nothing
        ({"a": 4, "b": 8}, {"a": 0.0, "b": 1.0}, {"b": 8.0}),
        ({"a": 4, "b": 8}, {"b": 1.0}, {"b": 8.0}),
        # a share is a share: out of [0, 1] is clamped
        ({"a": 4}, {"a": 1.7}, {"a": 4.0}),
        ({"a": 4}, {"a": -0.3}, {}),
        ({"a": 0}, {"a": 1.0}, {}),
    ],
)
def test_a_round_grants_samples_times_the_share_kept(samples, kept, grants):
    assert round_grants(samples, kept) == pytest.approx(grants)


@pytest.mark.parametrize(
    ("kept", "weight", "typical", "share"),
    [
        (1.0, 20.0, 2000.0, 1.0),  # untouched stays whole
        (0.1, 20.0, 2000.0, 1.0),  # 100x fewer samples: 10x as far is honest noise
        (0.05, 20.0, 2000.0, 0.5),  # and no farther
        (0.001, 20.0, 2000.0, 0.01),  # a x1000 gradient of few samples: ~1%
        (0.4, 2000.0, 20.0, 0.4),  # more samples than typical: as the rule kept
        (0.4, 2000.0, 2000.0, 0.4),
        (0.0, 20.0, 2000.0, 0.0),  # thrown away: nothing
        (1.7, 20.0, 2000.0, 1.0),  # clamped
        (0.5, 0.0, 2000.0, 0.5),
    ],
)
def test_a_share_is_forgiven_the_noise_of_fewer_samples_and_no_more(kept, weight, typical, share):
    assert credited_share(kept, weight, typical) == pytest.approx(share)


def test_a_round_credits_by_the_weights_of_the_inputs_it_compared():
    samples = {"few": 20, "b": 2000, "c": 2000, "bad": 20}
    kept = {"few": 0.1, "b": 1.0, "c": 0.5, "bad": 0.001}
    weights = {"few": 20.0, "b": 2000.0, "c": 2000.0, "bad": 20.0}
    # the typical weight is the lower median, 20: a third contributor of 2,000 makes it
    shares = credited_shares(kept, weights)
    assert shares == pytest.approx({"few": 0.1, "b": 1.0, "c": 0.5, "bad": 0.001})
    weights["d"], kept["d"], samples["d"] = 2000.0, 1.0, 2000
    shares = credited_shares(kept, weights)
    assert shares == pytest.approx({"few": 1.0, "b": 1.0, "c": 0.5, "d": 1.0, "bad": 0.01})
    assert round_grants(samples, shares) == pytest.approx(
        {"few": 20.0, "b": 2000.0, "c": 1000.0, "d": 2000.0, "bad": 0.2}
    )
    # without weights (a rule that keeps none, as the trunk's): what the rule kept
    assert credited_shares({"a": 1.3, "b": 0.2}, None) == {"a": 1.0, "b": 0.2}


def test_the_ledger_books_per_day_and_a_ban_takes_back_the_days_it_covers():
    ledger = CreditLedger()
    ledger.grant({"a": 4.0, "b": 2.0}, day=100)
    ledger.grant({"a": 6.0}, day=101)
    ledger.grant({"a": 1.0}, day=103)
    assert ledger.total("a") == 11.0
    assert ledger.on_day("a", 101) == 6.0
    assert list(ledger.totals()) == ["a", "b"]
    assert ledger.revoke("a", 101, 102) == 6.0
    assert ledger.total("a") == 5.0
    assert ledger.revoked == {"a": 6.0}
    assert ledger.revoke("a", 101, 102) == 0.0  # taken once
    again = CreditLedger.load(ledger.save())
    assert again == ledger


def test_a_long_lived_volunteers_oldest_days_are_summed_and_the_smallest_forgotten(
    monkeypatch,
):
    monkeypatch.setattr(credit_module, "MAX_DAYS", 3)
    monkeypatch.setattr(credit_module, "MAX_CONTRIBUTORS", 2)
    ledger = CreditLedger()
    for day in range(5):
        ledger.grant({"a": 1.0}, day)
    assert ledger.days["a"] == {EARLIER: 3.0, 3: 1.0, 4: 1.0}
    assert ledger.total("a") == 5.0
    ledger.grant({"b": 2.0}, 4)
    ledger.grant({"c": 0.5}, 4)  # a third: the smallest total goes
    assert set(ledger.days) == {"a", "b"}


def test_day_of_is_the_utc_day():
    assert day_of(0.0) == 0
    assert day_of(86_399.9) == 0
    assert day_of(86_400.0) == 1


class _Recording:
    """A round rule that remembers the shares it kept (the rule itself is frozen)."""

    def __init__(self, rule: RoundRule) -> None:
        self.rule = rule
        self.kept: dict[str, float] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.rule, name)

    def combine(self, *args, **kwargs):
        aggregate, kept = self.rule.combine(*args, **kwargs)
        self.kept.update(kept)
        return aggregate, kept


def _round_with_kept(core: AggregatorCore, monkeypatch) -> dict[str, float]:
    """Run a round of UID; the shares its robust rule kept."""
    recording = _Recording(core.rules[UID])
    monkeypatch.setitem(core.rules, UID, recording)
    core.run_round(UID)
    return recording.kept


def test_a_rounds_credit_is_what_the_receipts_and_the_robust_rule_justify(tmp_path, monkeypatch):
    core = make_core(settings(), tmp_path)
    honest = [Identity.from_seed(bytes([i]) * 32) for i in range(4)]
    for i, v in enumerate(honest):
        core.submit(*contribution(core, v, scale=1.0 + 0.01 * i, samples=4 + i))
    attacker = Identity.from_seed(b"x" * 32)
    core.submit(*contribution(core, attacker, scale=-500.0, samples=16))
    kept = _round_with_kept(core, monkeypatch)
    day = day_of(core.clock.wall())
    # each honest one's samples times the share kept, forgiven the noise of fewer samples
    # than the round's typical (lower median: 6) input
    for i, v in enumerate(honest):
        assert core.credit.on_day(v.public_key.hex(), day) == pytest.approx(
            (4 + i) * credited_share(kept[v.public_key.hex()], 4 + i, 6)
        )
    # the robust rule kept less of the outlier, so it earned less than its 16 samples
    mallory = attacker.public_key.hex()
    assert kept[mallory] < 0.5
    assert core.credit.total(mallory) == pytest.approx(16 * kept[mallory])
    assert core.credit.total(mallory) < 8
    # the account reports the samples applied beside the credit, whatever share was kept:
    # credit per sample is the share (an owner compares volunteers of unequal work so)
    assert [core.stats.contributors[v.public_key.hex()].report().samples for v in honest] == [
        4,
        5,
        6,
        7,
    ]
    assert core.stats.contributors[mallory].report().samples == 16


def _fill(core: AggregatorCore, volunteers: list[Identity]) -> None:
    for v in volunteers:
        core.submit(*contribution(core, v, samples=4))


@pytest.mark.parametrize(
    "dies", [None, "between_its_file_and_the_journal", "between_the_journal_and_the_state"]
)
def test_credit_survives_a_kill_at_any_point_of_a_round_and_is_granted_once(
    tmp_path, monkeypatch, dies
):
    volunteers = [Identity.from_seed(bytes([i]) * 32) for i in range(3)]
    core = make_core(settings(), tmp_path)
    _fill(core, volunteers)
    core.run_round(UID)  # a first round, saved whole
    first = {v.public_key.hex(): core.credit.total(v.public_key.hex()) for v in volunteers}
    assert all(c > 0 for c in first.values())
    _fill(core, volunteers)

    def die(*_args: object, **_kwargs: object) -> None:
        raise SystemExit("killed")

    if dies == "between_its_file_and_the_journal":
        monkeypatch.setattr(core._journal, "append", die)
    elif dies == "between_the_journal_and_the_state":
        monkeypatch.setattr(core, "_save_state", die)
    if dies is None:
        core.run_round(UID)
    else:
        with pytest.raises(SystemExit):
            core.run_round(UID)
    core.close()  # kill -9: nothing else is written
    monkeypatch.undo()

    again = make_core(settings(), tmp_path)
    assert again.versions[UID] == 2
    for v in volunteers:
        who = v.public_key.hex()
        assert again.credit.total(who) == pytest.approx(2 * first[who])
    again.close()
    # and once more: a restart after the recovery grants nothing again
    third = make_core(settings(), tmp_path)
    for v in volunteers:
        who = v.public_key.hex()
        assert third.credit.total(who) == pytest.approx(2 * first[who])


def test_a_ban_by_strikes_takes_back_the_credit_of_its_window(tmp_path):
    core = make_core(settings(max_invalid=2), tmp_path)
    mallory, honest = Identity.from_seed(b"m" * 32), Identity.from_seed(b"h" * 32)
    core.submit(*contribution(core, mallory, samples=4))
    core.submit(*contribution(core, honest, samples=4))
    core.run_round(UID)
    assert core.credit.total(mallory.public_key.hex()) > 0
    for _ in range(2):
        msg, parts = contribution(core, mallory, version=1)
        with pytest.raises(Rejected, match="payload_mismatch"):
            core.submit(msg, [p * 2 for p in parts])
    assert core.credit.total(mallory.public_key.hex()) == 0
    assert core.credit.revoked[mallory.public_key.hex()] > 0
    assert core.credit.total(honest.public_key.hex()) > 0
    core.close()
    # taken back for good
    again = make_core(settings(max_invalid=2), tmp_path)
    assert again.credit.total(mallory.public_key.hex()) == 0


def test_a_project_ban_takes_back_the_credit_of_the_day_before_it(tmp_path):
    core = make_core(settings(), tmp_path)
    mallory, honest = Identity.from_seed(b"m" * 32), Identity.from_seed(b"h" * 32)
    core.submit(*contribution(core, mallory, samples=4))
    core.submit(*contribution(core, honest, samples=4))
    core.run_round(UID)
    core.ban_contributor(mallory.public_key)
    assert core.credit.total(mallory.public_key.hex()) == 0
    assert core.credit.total(honest.public_key.hex()) > 0
