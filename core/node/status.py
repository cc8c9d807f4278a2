"""The node's status, built by a pure function from a snapshot of its parts (so every
state and reason can be tested from a table, without a running node)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.control.models import (
    ContributionCounts,
    Credit,
    DeviceStatus,
    Lifetime,
    NetworkStatus,
    NodeState,
    Reach,
    Readings,
    Status,
)
from core.node.capacity import DevicePlan
from core.node.compute_device import ComputeDevice
from core.node.probes import Reading
from core.node.throttle import Decision


@dataclass(frozen=True)
class NodeSnapshot:
    project: str | None = None
    project_name: str = ""
    project_error: str = ""
    #: Why the project banned this node ("" when it did not).
    banned: str = ""
    #: Why the work done here does not reach the aggregators now: the aggregator does
    #: not answer, or needs none of it ("" when it does).
    contributions_problem: str = ""
    #: Whether an expert server runs for the project now.
    serving: bool = False
    #: Served experts and the version of their weights.
    experts: dict[str, int] = field(default_factory=dict)
    decision: Decision | None = None
    reading: Reading | None = None
    sent: int = 0
    #: Ended contributions by outcome ("accepted", "given_up", refusal codes).
    outcomes: Counter[str] = field(default_factory=Counter)
    samples_done: int = 0
    device_plan: DevicePlan | None = None
    #: What the node computes on, in words (and a GPU it cannot use).
    compute: ComputeDevice | None = None
    benchmark: dict[str, Any] = field(default_factory=dict)
    rtt_ms: float | None = None
    peers: int = 0
    peer_id: str = ""
    addresses: tuple[str, ...] = ()
    lifetime: Lifetime = field(default_factory=Lifetime)
    credit: Credit = field(default_factory=Credit)
    memory_used_bytes: int = 0
    inbound_from_network: int = 0
    #: what peers' dial-backs found: "public", "private" or "unknown"
    verdict: str = "unknown"
    observed_ip: str | None = None
    #: whether a relay holds a place for us (so peers reach us through it)
    relayed: bool = False
    #: the router forwarding our port (UPnP): None off, "" on, else why it failed
    port_mapping: str | None = None
    uptime_s: float = 0.0
    snoozed_until: float | None = None
    pid: int | None = None


def node_state(snap: NodeSnapshot) -> NodeState:
    if not snap.project:
        return "no project"
    if snap.banned or (snap.project_error and not snap.serving):
        return "error"
    if not snap.serving or snap.decision is None:
        return "starting"
    if not snap.decision.run:
        return "paused"
    # allowed to work, but nobody to work for: not "working" (the swarm is gone or not
    # reached yet)
    if not snap.peers:
        return "starting"
    # serving, but what it computes is not counted: not "working" either
    return "waiting" if snap.contributions_problem else "working"


def state_reason(state: NodeState, snap: NodeSnapshot) -> str:
    if state == "no project":
        return "join a project to start helping"
    if state == "error" and snap.banned:
        return f"banned from the project: {snap.banned}"
    if state == "error":
        return f"cannot join the project: {snap.project_error}"
    if state == "starting":
        if snap.serving and snap.decision is not None and snap.decision.run:
            return "waiting for the swarm: no peer answers yet"
        return "joining the project"
    if state == "waiting":
        return snap.contributions_problem
    assert snap.decision is not None
    return snap.decision.describe()


@dataclass(frozen=True)
class ReachView:
    reach: Reach
    sentence: str
    advice: str = ""


def reachability(
    addresses: tuple[str, ...],
    verdict: str = "unknown",
    observed_ip: str | None = None,
    relayed: bool = False,
    port_mapping: str | None = None,
) -> ReachView:
    """How other computers reach the node, in words, with what the volunteer can do:
    from what it listens on and what its peers' dial-backs found (``verdict``:
    "public", "private" or "unknown"; net/reach/reachability.py) and whether the router was
    asked to forward a port (``port_mapping``: None not asked, "" asked, else why it
    failed)."""
    if not addresses:
        return ReachView("off", "not listening")
    if all(_is_loopback(a) for a in addresses):
        return ReachView(
            "this computer only",
            "only programs on this computer can connect",
            "turn on “Reachable” under Limits → Network so that other computers can use this one",
        )
    # a peer on this computer sees us at loopback: no news about other computers
    seen = (
        f" (seen at {observed_ip})"
        if observed_ip and not observed_ip.startswith("127.") and observed_ip != "::1"
        else ""
    )
    port = _tcp_port(addresses)
    forward = (
        f"forward TCP port {port} on your router to this computer"
        if port
        else ("forward this node's TCP port on your router to this computer")
    )
    if port_mapping is None:
        forward = (
            f"tick “Ask the router to forward a port (UPnP)” under Limits → Network, or {forward}"
        )
    elif port_mapping:
        forward = f"{forward} (asked by UPnP, the router did not: {port_mapping})"
    if verdict == "public":
        return ReachView("direct", f"reachable directly: other computers connect to this one{seen}")
    if verdict == "private" and relayed:
        return ReachView(
            "relayed",
            f"reachable through a relay: your router or a firewall blocks direct connections{seen}",
            f"nothing is needed; to make connections direct and faster, {forward}",
        )
    if verdict == "private":
        return ReachView(
            "unreachable",
            f"not reachable yet: your router or a firewall blocks connections from other "
            f"computers{seen}, and no relay holds a place for this one yet",
            f"the node keeps looking for a relay; to be reached directly, {forward}",
        )
    return ReachView(
        "checking", "checking whether other computers can reach this one (peers connect back)"
    )


def _tcp_port(addresses: tuple[str, ...]) -> int | None:
    for addr in addresses:
        parts = addr.split("/")
        if len(parts) > 4 and parts[3] == "tcp" and parts[4].isdigit() and not _is_loopback(addr):
            return int(parts[4])
    return None


def _is_loopback(addr: str) -> bool:
    parts = addr.split("/")
    return len(parts) > 2 and (parts[2].startswith("127.") or parts[2] == "::1")


def reason_code(decision: Decision | None) -> str:
    return decision.reason.name.lower() if decision is not None and decision.reason else ""


def build_status(snap: NodeSnapshot) -> Status:
    state = node_state(snap)
    reading = snap.reading
    plan, compute = snap.device_plan, snap.compute
    return Status(
        state=state,
        reason=state_reason(state, snap),
        reason_code=reason_code(snap.decision),
        project=snap.project,
        project_name=snap.project_name,
        project_error=snap.project_error,
        # paused, the declarations are withdrawn: nobody is served
        experts={} if state == "paused" else dict(sorted(snap.experts.items())),
        contributions=ContributionCounts(
            sent=snap.sent,
            accepted=snap.outcomes["accepted"],
            given_up=snap.outcomes["given_up"],
            refused={k: n for k, n in snap.outcomes.items() if k not in ("accepted", "given_up")},
        ),
        samples_done=snap.samples_done,
        device=DeviceStatus(
            device=plan.device if plan else compute.device if compute else "",
            computes_on=compute.line if compute else "",
            warning=compute.warning if compute else "",
            memory=plan.why if plan else "",
            memory_budget_gb=round(plan.budget_bytes / 1e9, 2) if plan else None,
            memory_used_gb=round(snap.memory_used_bytes / 1e9, 2)
            if snap.memory_used_bytes
            else None,
            benchmark=snap.benchmark,
            network_rtt_ms=snap.rtt_ms,
        ),
        readings=Readings(
            gpu_temp_c=reading.gpu_temp_c if reading else None,
            gpu_utilization=reading.gpu_utilization if reading else None,
            gpu_power_w=reading.gpu_power_w if reading else None,
            cpu_temp_c=reading.cpu_temp_c if reading else None,
            idle_seconds=reading.idle_seconds if reading else None,
            on_battery=reading.on_battery if reading else None,
        ),
        peers=snap.peers,
        peer_id=snap.peer_id,
        lifetime=snap.lifetime,
        credit=snap.credit,
        network=network_status(snap),
        uptime_s=round(snap.uptime_s),
        snoozed_until=snap.snoozed_until,
        pid=snap.pid,
    )


def network_status(snap: NodeSnapshot) -> NetworkStatus:
    view = reachability(
        snap.addresses, snap.verdict, snap.observed_ip, snap.relayed, snap.port_mapping
    )
    return NetworkStatus(
        addresses=list(snap.addresses),
        inbound_from_network=snap.inbound_from_network,
        reach=view.reach,
        observed_ip=snap.observed_ip,
        reachability=view.sentence,
        advice=view.advice,
    )
