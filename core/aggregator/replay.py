"""What an aggregator remembers so as to refuse a contribution, or a trainer's receipt,
twice, and when it may forget it.

A contribution's nonce stays known for ``NONCE_HORIZON_S`` after the contribution's
timestamp: a copy sent later is refused for its clock anyway (``CLOCK_SKEW_S``), like a
replay without a strike (core/protocol/refusals.py's NORMAL); the hour keeps a nonce for
the audit of the next contribution that carries its residual (a volunteer carries one
at most ``CARRY_HORIZON_S`` old: core/contributing/sender.py). A receipt's batch id stays
known while a contribution of its version can still be accepted: until its expert is
more than ``staleness_bound`` versions past it, when a copy is refused as stale.

So what the aggregator keeps, and writes after each round, follows the contributions of
the last hour and of the versions still open, not the project's whole history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from core.aggregator.verify import CLOCK_SKEW_S
from core.protocol.contributions import CARRY_HORIZON_S, Contribution

NONCE_HORIZON_S: Final = 3600.0
#: the expert of batch ids saved before they were kept with theirs (a state written
#: before 2026-11-27): forgotten once every expert is past the bound from the highest
#: version then
ANY_EXPERT: Final = "*"

assert NONCE_HORIZON_S >= CARRY_HORIZON_S + 2 * CLOCK_SKEW_S  # the audits' margin


@dataclass
class SeenContributions:
    #: nonce -> the timestamp its contribution was signed with
    nonces: dict[bytes, float] = field(default_factory=dict)
    #: batch id of a receipt -> (its expert, the version it was computed on)
    batches: dict[bytes, tuple[str, int]] = field(default_factory=dict)

    def remember(self, c: Contribution) -> None:
        self.nonces[c.nonce] = c.timestamp
        for r in c.receipts:
            self.batches[r.batch_id] = (c.uid, r.version)

    def forget(self, now: float, versions: Mapping[str, int], staleness_bound: int) -> int:
        """Forget what no contribution can be accepted with again; how many entries."""
        old = [n for n, signed in self.nonces.items() if now - signed > NONCE_HORIZON_S]
        for n in old:
            del self.nonces[n]
        lowest = min(versions.values(), default=0)
        closed = [
            b
            for b, (uid, version) in self.batches.items()
            if (lowest if uid == ANY_EXPERT else versions.get(uid, version)) - version
            > staleness_bound
        ]
        for b in closed:
            del self.batches[b]
        return len(old) + len(closed)

    def save(self) -> dict[str, Any]:
        return {
            "nonces": sorted([n, t] for n, t in self.nonces.items()),
            "batches": sorted([b, uid, v] for b, (uid, v) in self.batches.items()),
        }

    @classmethod
    def load(
        cls, state: Mapping[str, Any], now: float, versions: Mapping[str, int]
    ) -> SeenContributions:
        """From ``save``'s form, or from the lists of a state written before it
        (``seen_nonces``, ``seen_batches``): those nonces count as signed ``now``, those
        batch ids as of any expert at the highest version."""
        if "seen" in state:
            saved = state["seen"]
            return cls(
                {bytes(n): float(t) for n, t in saved["nonces"]},
                {bytes(b): (str(uid), int(v)) for b, uid, v in saved["batches"]},
            )
        highest = max(versions.values(), default=0)
        return cls(
            dict.fromkeys(_bytes(state.get("seen_nonces", ())), now),
            dict.fromkeys(_bytes(state.get("seen_batches", ())), (ANY_EXPERT, highest)),
        )


def _bytes(values: Iterable[Any]) -> list[bytes]:
    return [bytes(v) for v in values]
