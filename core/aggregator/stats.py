"""What an aggregator counts: contributions accepted and refused (by code), rounds,
bans, per contributor its rounds and how much of its input the robust rule kept, and
how late the experts' contributions were when their rounds applied them."""

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
    #: its input the robust rule kept (1: untouched), forgiven the noise of fewer samples
    #: than the round's typical input (core/aggregator/credit.py ``credited_shares``)
    compared_rounds: int = 0
    influence_sum: float = 0.0
    #: the samples of its contributions that rounds applied: its work, whatever share
    #: of it the rule kept (credit is these times that share: core/aggregator/credit.py)
    samples: int = 0

    def report(self) -> ContributorReport:
        return ContributorReport(
            accepted=self.accepted,
            rejected=dict(self.rejected),
            rounds=self.rounds,
            influence=self.influence_sum / self.compared_rounds if self.compared_rounds else None,
            samples=self.samples,
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
    #: the samples of the experts' contributions a round applied, by how many versions
    #: old the weights they were computed on were (0: the version the round replaces);
    #: the trunk's apart. Samples, not contributions: a volunteer's small contribution
    #: (what it computed between its last send and a new version) weighs as little as
    #: it moves the step
    lateness: Counter[int] = field(default_factory=Counter)
    #: over the same samples: seconds from acceptance to their round (this aggregator's
    #: clock) and from signing to their round (the contributor's clock, in whole
    #: seconds: what the volunteer held them for is the difference)
    round_wait_s_sum: float = 0.0
    age_s_sum: float = 0.0

    def applied(self, versions_late: int, round_wait_s: float, age_s: float, samples: int) -> None:
        """Count a contribution of ``samples`` an expert's round applied."""
        self.lateness[max(0, versions_late)] += samples
        self.round_wait_s_sum += samples * max(0.0, round_wait_s)
        self.age_s_sum += samples * max(0.0, age_s)

    def lateness_report(self) -> dict[str, Any]:
        """The lateness figures of AggregatorReport (none before a round applied one)."""
        n = self.lateness.total()
        if n == 0:
            return {}
        return {
            "lateness": [self.lateness.get(k, 0) for k in range(max(self.lateness) + 1)],
            "mean_versions_late": sum(k * c for k, c in self.lateness.items()) / n,
            "mean_round_wait_s": self.round_wait_s_sum / n,
            "mean_age_s": self.age_s_sum / n,
        }


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
                "samples": c.samples,
            }
            for who, c in stats.contributors.items()
        },
        "lateness": {str(k): v for k, v in stats.lateness.items()},
        "round_wait_s_sum": stats.round_wait_s_sum,
        "age_s_sum": stats.age_s_sum,
    }


def load_statistics(data: dict[str, Any]) -> AggregatorStatistics:
    stats = AggregatorStatistics(
        accepted=int(data["accepted"]),
        rejected=Counter({str(k): int(v) for k, v in data["rejected"].items()}),
        rounds=int(data["rounds"]),
        banned_peers=int(data["banned_peers"]),
        # states written before these figures were counted lack them
        lateness=Counter({int(k): int(v) for k, v in data.get("lateness", {}).items()}),
        round_wait_s_sum=float(data.get("round_wait_s_sum", 0.0)),
        age_s_sum=float(data.get("age_s_sum", 0.0)),
    )
    for who, c in data["contributors"].items():
        stats.contributors[str(who)] = ContributorStatistics(
            accepted=int(c["accepted"]),
            rejected=Counter({str(k): int(v) for k, v in c["rejected"].items()}),
            rounds=int(c["rounds"]),
            compared_rounds=int(c["compared_rounds"]),
            influence_sum=float(c["influence_sum"]),
            samples=int(c.get("samples", 0)),  # counted since 2026-11-28
        )
    return stats
