"""Credit: what an aggregator grants each volunteer for work that reached a round.

A round grants each of its contributors the samples its receipts bind, times the share
of its input the robust rule kept (core/aggregator/rounds.py ``combine``: 1 untouched,
0 discarded): work refused never reaches a round, a contribution held for an audit
reaches one only once it passed, and an input the rule threw away earns nothing.
Credit is booked per UTC day, so that a ban can take back the days it covers
(``revoke``), and a statement can say what a volunteer earned when.

Pure bookkeeping; the aggregator's core grants at each round, saves the ledger with its
state and replays the grants of rounds after it (core/aggregator/core.py). Bounded like
every per-identity record (identities are free to make): at most ``MAX_CONTRIBUTORS``
contributors, the smallest totals forgotten first, and ``MAX_DAYS`` days each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from core.protocol.credit import EARLIER_DAY

#: contributors whose credit is kept; past it the smallest total is forgotten
MAX_CONTRIBUTORS: Final = 10_000
#: days kept per contributor (the oldest are summed into one, ``EARLIER``)
MAX_DAYS: Final = 90
#: the day under which what is older than ``MAX_DAYS`` days is kept, summed (statements
#: carry it so: core/protocol/credit.py)
EARLIER: Final = EARLIER_DAY


def round_grants(samples: Mapping[str, int], kept: Mapping[str, float]) -> dict[str, float]:
    """Each contributor's credit for one round: its samples in the round times the share
    of its input the robust rule kept (clamped to [0, 1]; one the rule did not report
    gets nothing). Contributors granted nothing are left out."""
    out: dict[str, float] = {}
    for who, n in samples.items():
        share = min(1.0, max(0.0, float(kept.get(who, 0.0))))
        if n > 0 and share > 0:
            out[who] = n * share
    return out


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
