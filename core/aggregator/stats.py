"""What an aggregator counts: contributions accepted and refused (by code), rounds,
bans, and per contributor its rounds and how much of its input the robust rule kept."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from core.protocol.aggregator_methods import ContributorReport


@dataclass
class ContributorStatistics:
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    #: rounds it shared with other contributors, and the sum over those of the share of
    #: its input the robust rule kept (1: untouched)
    compared_rounds: int = 0
    influence_sum: float = 0.0

    def report(self) -> ContributorReport:
        return ContributorReport(
            accepted=self.accepted,
            rejected=dict(self.rejected),
            rounds=self.rounds,
            influence=self.influence_sum / self.compared_rounds if self.compared_rounds else None,
        )


@dataclass
class AggregatorStatistics:
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    banned_peers: int = 0
    #: per contributor (hex public key); only what its signature makes attributable
    contributors: dict[str, ContributorStatistics] = field(
        default_factory=lambda: defaultdict(ContributorStatistics)
    )


def save_statistics(stats: AggregatorStatistics) -> dict[str, Any]:
    """Plain data for the aggregator's state file: what it counted survives restarts."""
    return {
        "accepted": stats.accepted,
        "rejected": dict(stats.rejected),
        "rounds": stats.rounds,
        "banned_peers": stats.banned_peers,
        "contributors": {
            who: {
                "accepted": c.accepted,
                "rejected": dict(c.rejected),
                "rounds": c.rounds,
                "compared_rounds": c.compared_rounds,
                "influence_sum": c.influence_sum,
            }
            for who, c in stats.contributors.items()
        },
    }


def load_statistics(data: dict[str, Any]) -> AggregatorStatistics:
    stats = AggregatorStatistics(
        accepted=int(data["accepted"]),
        rejected=Counter({str(k): int(v) for k, v in data["rejected"].items()}),
        rounds=int(data["rounds"]),
        banned_peers=int(data["banned_peers"]),
    )
    for who, c in data["contributors"].items():
        stats.contributors[str(who)] = ContributorStatistics(
            accepted=int(c["accepted"]),
            rejected=Counter({str(k): int(v) for k, v in c["rejected"].items()}),
            rounds=int(c["rounds"]),
            compared_rounds=int(c["compared_rounds"]),
            influence_sum=float(c["influence_sum"]),
        )
    return stats
