"""What an aggregator counts: contributions accepted and refused (by code), rounds,
bans, and per contributor its rounds and how much of its input the robust rule kept."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

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
