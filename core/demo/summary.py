"""The demo's summary: what the trainer reported, the experts' versions, each volunteer's
work, as a dict (``--json``) and as tables."""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from core.demo.options import DemoOptions
from core.demo.supervisor import Proc
from core.protocol.aggregator_methods import ContributorReport
from core.trainer.events import Evaluated, TrainerEvent, TrainingStarted, TrainingSummary
from core.trainer.progress import loss_text
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)


def demo_summary(
    options: DemoOptions,
    trained: TrainingSummary,
    procs: list[Proc],
    events: list[TrainerEvent],
    relay_killed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``relay_killed``: the step at which the bootstrap relay was killed, and the expert
    answers per volunteer then (--kill-relay)."""
    rejected: Counter[str] = Counter()
    accepted = 0
    contributors: dict[str, ContributorReport] = {}
    contribution_audits: Counter[str] = Counter()
    for agg in trained.aggregators:
        accepted += agg.accepted
        if agg.audits is not None:  # the counts (not the problems, by kind)
            contribution_audits.update(agg.audits.model_dump(exclude={"problems"}))
        rejected.update(agg.rejected)
        contributors.update(agg.contributors)
    volunteers = []
    audits = trained.audits or {}
    excluded = set(audits.get("excluded", []))
    for p in procs:
        if not p.public_key:
            continue
        c = contributors.get(p.public_key, ContributorReport())
        peer = str(peer_id_from_public_key(bytes.fromhex(p.public_key)))
        answers = trained.answered_by.get(peer, 0)
        after_kill = None
        if relay_killed is not None:
            after_kill = answers - relay_killed["answered_by"].get(peer, 0)
        volunteers.append(
            {
                "name": p.name,
                "role": p.role,
                "peer": peer,
                "answers": answers,
                "answers_after_relay_killed": after_kill,
                "where": p.where or "this computer",
                "reached": trained.reached.get(peer, "not called"),
                "accepted": c.accepted,
                "rejected": c.rejected,
                "rounds": c.rounds,
                "influence": c.influence,
                "samples": c.samples,
                # a failed answer audit: the trainer calls it no more
                "excluded": peer in excluded,
            }
        )
    evals = [e for e in events if isinstance(e, Evaluated) and not _nan(e.loss)]
    start = next((e for e in events if isinstance(e, TrainingStarted)), None)
    return {
        "resumed_at_step": None if start is None else start.resumed_at_step,
        "volunteers": options.volunteers,
        "attackers": options.attackers,
        "attack": options.attack if options.attackers else None,
        "slow": options.slow,
        "churn": options.churn,
        "nat": options.nat,
        "symmetric": options.symmetric,
        "relay_killed_at_step": relay_killed["step"] if relay_killed else None,
        "rule": options.rule,
        "steps": trained.steps,
        "stopped_early": trained.stopped_early,
        "samples": trained.samples,
        "samples_per_s": trained.samples_per_s,
        "seconds": trained.seconds,
        "initial_loss": trained.initial_loss,
        "final_loss": trained.final_loss,
        "evaluations": [[e.step, e.loss] for e in evals],
        "failed_steps": trained.failed_steps,
        # batches the trainer carried at once, gradients dropped as too stale, and the
        # applied ones by how many updates old their weights were
        "in_flight": trained.in_flight,
        "stale_steps": trained.stale_steps,
        "staleness": trained.staleness,
        "wire": options.wire,
        "version_max": trained.version_max,
        "version_min": trained.version_min,
        "contributions_accepted": accepted,
        "contributions_rejected": dict(rejected),
        "per_volunteer": volunteers,
        "calls": trained.calls.model_dump(),
        "audits": audits,
        # the aggregators' audits of contributions: drawn, passed, failed, unrevealed,
        # unverifiable (discarded without blame)
        "contribution_audits": dict(contribution_audits),
        # peers banned from the project (by this trainer's audits or another's), why
        "banned": trained.banned,
    }


_FIGURES = ("expert answers", "accepted", "rejected", "influence", "credit")


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    if summary["resumed_at_step"]:
        console.print(f"(the trainer resumed its checkpoint at step {summary['resumed_at_step']})")
    if summary["stopped_early"]:
        console.print("(stopped before the last step)")
    console.print(
        f"\n[bold]summary[/]: {summary['steps']} steps, {summary['samples']} samples in "
        f"{summary['seconds']:.0f} s ({summary['samples_per_s']:.1f} samples/s); "
        f"validation loss {loss_text(summary['initial_loss'])} -> "
        f"{loss_text(summary['final_loss'])} nats/token"
    )
    calls = summary.get("calls", {})
    if "activation_bytes_per_sample" in calls:
        console.print(
            f"{summary['in_flight']} batch(es) in flight ({summary['stale_steps']} dropped as "
            f"too stale); activations on the wire as {summary['wire']}: "
            f"{calls['activation_bytes_per_sample'] / 1024:.0f} KiB per sample, "
            f"{calls['activation_bytes_ratio']:.2f} of float32's"
        )
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(summary["contributions_rejected"].items()))
    console.print(
        f"experts at versions {summary['version_min']}-{summary['version_max']}; contributions: "
        f"{summary['contributions_accepted']} accepted, rejected: {rejected or 'none'} "
        f"(aggregation: {summary['rule']})"
    )
    audits = summary.get("audits") or {}
    if audits:
        # settled by other servers' recomputations, where the weights could not be had
        by_quorum = audits.get("by_quorum", 0)
        quorum = f" ({by_quorum} by other servers)" if by_quorum else ""
        console.print(
            f"answer audits: {audits['audited']} recomputed{quorum} "
            f"({audits['seconds']:.1f} s), {audits['failed']} failed, "
            f"{audits['unverifiable']} without their version's weights; "
            f"{len(audits['excluded'])} volunteer(s) excluded"
        )
    drawn = summary.get("contribution_audits") or {}
    if drawn:
        console.print(
            f"contribution audits: {drawn['drawn']} drawn, {drawn['passed']} passed, "
            f"{drawn['failed']} failed, {drawn['unrevealed'] + drawn['unverifiable']} "
            "discarded unchecked"
        )
    for peer, why in (summary.get("banned") or {}).items():
        console.print(f"[bold red]banned[/] from the project: {peer[-8:]}: {why}")
    table = Table(title="volunteers")
    nat = summary.get("nat", False)
    columns = ["name", "role", "expert answers", "accepted", "rejected", "influence", "credit"]
    if nat:  # where it ran, and how the trainer (in another home) reached it at the end
        columns[2:2] = ["home", "reached"]
    for column in columns:
        table.add_column(column, justify="right" if column in _FIGURES else "left")
    for v in summary["per_volunteer"]:
        rejected_v = ", ".join(f"{k} {n}" for k, n in sorted(v["rejected"].items())) or "-"
        influence = "-" if v["influence"] is None else f"{100 * v['influence']:.1f}%"
        role = v["role"] + (" [bold red](excluded: failed an audit)[/]" if v["excluded"] else "")
        credit = "-" if v.get("credit") is None else f"{v['credit']:,.0f}"
        row = [v["name"], role, str(v["answers"]), str(v["accepted"]), rejected_v, influence]
        row.append(credit)
        if nat:
            row[2:2] = [v["where"], v["reached"]]
        table.add_row(*row)
    console.print(table)
    if summary.get("relay_killed_at_step") is not None:
        since = ", ".join(
            f"{v['name']} {v['answers_after_relay_killed']}" for v in summary["per_volunteer"]
        )
        console.print(
            f"the bootstrap peer (a relay) was killed at step {summary['relay_killed_at_step']}; "
            f"expert answers since: {since}"
        )
    console.print(
        "influence: the share of a volunteer's gradient the robust rule kept (forgiven the "
        "noise of fewer samples than the round's others), averaged over rounds (poisoned "
        "gradients are clipped to a small share); credit: the samples of "
        "its contributions that reached a round, times that share, as the aggregator "
        "signed it (the project page's leaderboard)"
    )
    proof = summary.get("proof")
    if proof:
        console.print(
            f"{proof['volunteer']} proved its own with `moehome credit`: "
            f"{proof['credit']:,.0f}; its proof, which anyone can check with `moehome credit "
            f"verify`: {proof['proof']}",
            highlight=False,
        )
    if summary.get("generated"):
        console.print("\n[bold]the trained model[/], exported and sampled (owner export, generate)")
        console.print(summary["generated"], markup=False, highlight=False)
    if summary.get("page"):
        page = Path(summary["page"])
        console.print(
            f"\n[bold]the project page[/] (owner page): {page.as_uri()}\n"
            "the loss over time, experts and who serves them, throughput, the credit "
            "leaderboard, bans and the invite, from signed data only; `moehome owner page "
            f"{summary.get('project_id', 'PROJECT')} -b ADDRESS --serve 127.0.0.1:8080` "
            "serves a live one of a running swarm",
            highlight=False,
        )
