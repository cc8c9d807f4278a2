"""Credit: what an aggregator grants each volunteer for work that reached a round.

A round grants each of its contributors the samples its receipts bind, times the share
of its input the robust rule kept (core/aggregator/rounds.py ``combine``: 1 untouched,
0 discarded), forgiven the noise of an input of fewer samples than the round's typical
one (``credited_share``): work refused never reaches a round, a contribution held for an
audit reaches one only once it passed, and an input the rule threw away earns nothing.
Credit is booked per UTC day, so that a ban can take back the days it covers
(``revoke``), and a statement can say what a volunteer earned when.

Pure bookkeeping; the aggregator's core grants at each round, saves the ledger with its
state and replays the grants of rounds after it (core/aggregator/core.py). Bounded like
every per-identity record (identities are free to make): at most ``MAX_CONTRIBUTORS``
contributors, the smallest totals forgotten first, and ``MAX_DAYS`` days each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median_low
from typing import Any, Final

from core.protocol.credit import EARLIER_DAY

#: contributors whose credit is kept; past it the smallest total is forgotten
MAX_CONTRIBUTORS: Final = 10_000
#: days kept per contributor (the oldest are summed into one, ``EARLIER``)
MAX_DAYS: Final = 90
#: the day under which what is older than ``MAX_DAYS`` days is kept, summed (statements
#: carry it so: core/protocol/credit.py)
EARLIER: Final = EARLIER_DAY


def round_grants(samples: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, float]:
    """Each contributor's credit for one round: its samples in the round times its share
    (:func:`credited_shares`; clamped to [0, 1]; one without a share gets nothing).
    Contributors granted nothing are left out."""
    out: dict[str, float] = {}
    for who, n in samples.items():
        share = min(1.0, max(0.0, float(shares.get(who, 0.0))))
        if n > 0 and share > 0:
            out[who] = n * share
    return out


def credited_shares(
    kept: Mapping[str, float], weights: Mapping[str, float] | None
) -> dict[str, float]:
    """Each input's credited share of a round: what the robust rule kept of it, forgiven
    its noise (:func:`credited_share`) where ``weights`` says how many samples each
    input the rule compared stands for; the typical input is the lower median's (one
    input of many samples cannot raise it alone)."""
    weights = weights or {}
    known = [weights[w] for w in kept if w in weights]
    if not known:
        return {who: max(0.0, min(1.0, share)) for who, share in kept.items()}
    typical = median_low(known)
    # an input without a weight is taken for a typical one: what the rule kept
    return {
        who: credited_share(share, weights.get(who, typical), typical)
        for who, share in kept.items()
    }


def credited_share(kept: float, weight: float, typical: float) -> float:
    """The share of an input credited: what the rule kept, x sqrt(typical / weight)
    when the input stands for fewer samples than the round's typical (lower median) one.

    The rule clips what lies beyond the median distance to the aggregate, and an honest
    mean of n samples lies ~1/sqrt(n) out: a volunteer the trainer's routing gave 20
    samples of a round where the others had 2,000 lies ~10x as far and keeps ~1/10,
    though each of its samples was as honest (CI failed so: an honest volunteer at 0.295
    credit per sample, stop 67). Credit forgives that much and no more: a gradient 1,000x
    too large from such an input still earns ~1%, and an input of many samples is never
    judged more leniently than the rule did (nor is claiming fewer samples worth it:
    samples x share grows with them)."""
    kept = max(0.0, min(1.0, kept))
    if kept == 0.0 or weight <= 0.0:
        return kept
    return min(1.0, kept * max(1.0, math.sqrt(typical / weight)))


@dataclass
class CreditLedger:
    #: contributor (hex public key) -> UTC day -> credit
    days: dict[str, dict[int, float]] = field(default_factory=dict)
    #: contributor -> credit taken back by bans (kept to be shown)
    revoked: dict[str, float] = field(default_factory=dict)

    def grant(self, grants: Mapping[str, float], day: int) -> None:
        for who, credit in grants.items():
            if credit <= 0:
                continue
            book = self.days.setdefault(who, {})
            book[day] = book.get(day, 0.0) + credit
            while len(book) > MAX_DAYS:  # EARLIER counts among them
                _fold_oldest(book)
        if len(self.days) > MAX_CONTRIBUTORS:
            self._forget_smallest(len(self.days) - MAX_CONTRIBUTORS)

    def revoke(self, who: str, first_day: int, last_day: int) -> float:
        """Take back ``who``'s credit of the days ``first_day`` to ``last_day`` (a ban's
        period); the credit taken."""
        book = self.days.get(who, {})
        taken = 0.0
        for day in [d for d in book if first_day <= d <= last_day]:
            taken += book.pop(day)
        if taken:
            self.revoked[who] = self.revoked.get(who, 0.0) + taken
        return taken

    def total(self, who: str) -> float:
        return sum(self.days.get(who, {}).values())

    def on_day(self, who: str, day: int) -> float:
        return self.days.get(who, {}).get(day, 0.0)

    def totals(self) -> dict[str, float]:
        """Every contributor's total, largest first."""
        out = {who: sum(book.values()) for who, book in self.days.items()}
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def _forget_smallest(self, count: int) -> None:
        for who in list(self.totals())[-count:]:
            del self.days[who]
            self.revoked.pop(who, None)

    def save(self) -> dict[str, Any]:
        """Plain data for the aggregator's state file."""
        return {
            "days": {
                who: [[d, c] for d, c in sorted(book.items())] for who, book in self.days.items()
            },
            "revoked": dict(self.revoked),
        }

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> CreditLedger:
        days = {
            str(who): {int(d): float(c) for d, c in book}
            for who, book in data.get("days", {}).items()
        }
        revoked = {str(w): float(c) for w, c in data.get("revoked", {}).items()}
        return cls(days, revoked)


def _fold_oldest(book: dict[int, float]) -> None:
    """Sum the oldest day (past ``EARLIER``) into ``EARLIER``: a long-lived volunteer's
    book stays ``MAX_DAYS`` long."""
    oldest = min(d for d in book if d != EARLIER)
    book[EARLIER] = book.get(EARLIER, 0.0) + book.pop(oldest)
