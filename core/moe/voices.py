"""Enough voices per expert: a trainer spreads each expert's work over at least the
number of servers its aggregator waits for.

An aggregator sets a version of an expert only from ``[training] min_contributors``
distinct contributors (decision 010: one attacker facing one honest volunteer has no
majority), and a volunteer contributes only the gradients of the calls it answered. The
trainer sends each call to the server expected to finish first (core/moe/load.py); in a
swarm with room to spare that is the same one or two servers of an expert, call after
call, and the expert's round waits for a third voice that never gets any work: measured
in the clean demo (4 volunteers, 40 steps), 5 of 16 experts short of contributors at the
end, one round refusing its two contributors' surplus (``waiting_for_contributors``, a
red CI), and two volunteers answering 45 and 236 calls.

So the trainer counts, per expert, the rows each server got lately (a decayed sum with a
half-life of one round's samples). While fewer than ``voices`` of the expert's servers
hold a share of at least ``floor`` (1 / (3 x voices)), the soonest of the others gets
the next call; otherwise the order by finish time stands. The cost is bounded: the
servers beyond the fastest get about a ninth of an expert's rows each, the share a round
needs to hear them, and nothing more. Only calls that lead to contributions count (a
forward pass that keeps its graph for a backward pass, a backward pass computed anew).

Pure bookkeeping, no I/O, like ServerLoads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K")

#: a server's recent rows of an expert below this count as none (and are forgotten:
#: volunteers come and go, and a trainer runs for weeks)
FORGOTTEN_ROWS = 0.01


@dataclass
class ExpertVoices:
    """Rows sent to each server of each expert, lately."""

    #: distinct servers an expert's work must reach (the manifest's min_contributors)
    voices: int
    #: rows of an expert after which an earlier row counts half (a round's samples)
    half_life_rows: float
    _rows: dict[str, dict[Hashable, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )

    def __post_init__(self) -> None:
        if self.voices < 1 or self.half_life_rows <= 0:
            raise ValueError("need voices >= 1 and half_life_rows > 0")

    def sent(self, uid: str, server: Hashable, rows: int) -> None:
        """``rows`` of ``uid`` went to ``server``."""
        if rows <= 0:
            return
        per_server = self._rows[uid]
        decay = 0.5 ** (rows / self.half_life_rows)
        for other in list(per_server):
            per_server[other] *= decay
            if per_server[other] < FORGOTTEN_ROWS:  # a server gone long ago: forgotten
                del per_server[other]
        per_server[server] += rows

    def floor(self, servers: int) -> float:
        """The share of an expert's recent rows that counts a server as heard."""
        return 1.0 / (3 * min(self.voices, servers))

    def unheard(
        self, uid: str, servers: Sequence[K], key: Callable[[K], Hashable] | None = None
    ) -> list[K]:
        """``servers`` below the floor share of ``uid``'s recent rows, in their order,
        while fewer than ``voices`` of them hold it; none otherwise."""
        heard = self._heard(uid, servers, key)
        return [] if heard is None else [s for s, h in zip(servers, heard, strict=True) if not h]

    def order(
        self, uid: str, servers: Sequence[K], key: Callable[[K], Hashable] | None = None
    ) -> list[K]:
        """``servers`` (ranked by finish time) with the soonest under-heard one first
        while fewer than ``voices`` of them hold the floor share of ``uid``'s rows."""
        ranked = list(servers)
        heard = self._heard(uid, ranked, key)
        if heard is None:
            return ranked
        first = heard.index(False)
        return [ranked[first], *ranked[:first], *ranked[first + 1 :]]

    def _heard(
        self, uid: str, servers: Sequence[K], key: Callable[[K], Hashable] | None
    ) -> list[bool] | None:
        """Whether each server holds the floor share of ``uid``'s recent rows; None
        when enough of them do (or nothing was sent yet, or one server is all)."""
        ident: Callable[[K], Hashable] = key if key is not None else (lambda s: s)
        target = min(self.voices, len(servers))
        if target < 2:
            return None
        recent = self._rows.get(uid, {})
        shares = [recent.get(ident(s), 0.0) for s in servers]
        total = sum(shares)
        if total <= 0:
            return None
        floor = self.floor(len(servers))
        heard = [share / total >= floor for share in shares]
        return None if sum(heard) >= target else heard
