"""The control API's contract: what the node's status, events, history and project list
look like, and the bodies of its commands. The node builds these, the API serves them
(and their OpenAPI schema at ``/v1/openapi.json``), the CLI and the tray read them.

Models the node sends ignore keys they do not know (a newer node may add figures) so
that an older tray keeps working; models the node receives forbid them (a typo is an
error, not a silent no-op)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.control.invite import MAX_PEERS, PeerAddress
from core.control.limits import ProjectId

#: "working" and "paused" once the node serves a project; "error" when it cannot join.
#: "waiting": serving, but the work is not counted now (the aggregator does not answer,
#: or needs no more of it): the reason says which.
NodeState = Literal["no project", "starting", "working", "waiting", "paused", "error"]


class _Sent(BaseModel):
    """A model the node sends: frozen, unknown keys ignored (a newer node may add some)."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class _Received(BaseModel):
    """A model the node receives: unknown keys are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ContributionCounts(_Sent):
    sent: int = 0
    accepted: int = 0
    given_up: int = 0
    #: The aggregators' refusals, by reason code.
    refused: dict[str, int] = {}


class DeviceStatus(_Sent):
    #: torch's name of the device the node computes on: "cuda:0", "mps", "cpu".
    device: str = ""
    #: The same in words: the GPU's name ("NVIDIA GeForce RTX 3060 (CUDA)"), "Apple GPU
    #: (MPS)" or "CPU" ("" from an older node).
    computes_on: str = ""
    #: Said when a GPU is there that the node cannot use, with what to do ("your GPU is not
    #: used: install the GPU build (...)"); "" otherwise.
    warning: str = ""
    #: How the memory budget was chosen, in words.
    memory: str = ""
    #: The budget the experts may fill, and what the node uses now (its process's
    #: resident memory, plus what it holds on the GPU), in GB.
    memory_budget_gb: float | None = None
    memory_used_gb: float | None = None
    benchmark: dict[str, Any] = {}
    network_rtt_ms: float | None = None


class Readings(_Sent):
    """The probes' last reading; None where this computer has no such sensor."""

    gpu_temp_c: float | None = None
    gpu_utilization: float | None = None
    gpu_power_w: float | None = None
    cpu_temp_c: float | None = None
    idle_seconds: float | None = None
    on_battery: bool | None = None


#: How other computers reach this node: "direct" (peers dialled it back), "relayed"
#: (only through a relay), "unreachable" (peers could not, and no relay holds a place),
#: "checking" (not known yet), "this computer only" (listening on loopback), "off".
Reach = Literal["checking", "direct", "relayed", "unreachable", "this computer only", "off"]


class NetworkStatus(_Sent):
    """How other computers reach this node, as far as it knows."""

    #: Full addresses (what an invite carries); loopback ones last.
    addresses: list[str] = []
    #: Handshakes with peers on other computers since the node started: proof that it
    #: can be reached at least from there.
    inbound_from_network: int = 0
    reach: Reach = "checking"
    #: This computer's public address as other peers see it (its router's, behind NAT).
    observed_ip: str | None = None
    #: In a sentence a volunteer can read.
    reachability: str = ""
    #: What the volunteer can do about it; empty when nothing is needed.
    advice: str = ""


class Lifetime(_Sent):
    """What this computer gave since its first start (kept across restarts)."""

    #: Seconds it was allowed to work (and served a project).
    working_s: float = 0.0
    #: Tokens computed: one token through one expert, forward or backward.
    samples: int = 0
    contributions_accepted: int = 0
    #: Unix time of the first record.
    since: float | None = None


class CreditDay(_Sent):
    """The credit of one UTC day (days since 1970-01-01), all aggregators together."""

    #: -1: the days before those listed one by one, summed (an aggregator lists 90)
    day: int
    credit: float


class Credit(_Sent):
    """This node's credit in the project it serves, as the project's aggregators signed
    it (core/project/credit_proof.py), checked now and then."""

    total: float = 0.0
    #: credit of the current UTC day
    today: float = 0.0
    #: taken back by bans
    revoked: float = 0.0
    #: aggregators whose statements it holds, of those the manifest lists
    aggregators: int = 0
    aggregators_listed: int = 0
    #: Unix time of the last statements (None: none yet)
    checked_at: float | None = None
    #: where the proof of it is (``moehome credit verify`` checks it)
    proof: str = ""
    #: its place on the project's leaderboard (the aggregators' signed accounts, which
    #: list the contributors with the most credit), of ``ranked`` contributors listed
    #: (None: not listed, or nothing earned yet)
    rank: int | None = None
    ranked: int = 0
    #: per UTC day, oldest first: what the dashboard plots
    days: list[CreditDay] = []


class Status(_Sent):
    state: NodeState
    #: Why, in a sentence a volunteer can read.
    reason: str
    #: The throttle's reason as a code ("too_hot", "user_active", ...); "" when working.
    reason_code: str = ""
    project: str | None = None
    project_name: str = ""
    project_error: str = ""
    #: Experts served now, with the version of their weights.
    experts: dict[str, int] = {}
    contributions: ContributionCounts = ContributionCounts()
    samples_done: int = 0
    device: DeviceStatus = DeviceStatus()
    readings: Readings = Readings()
    peers: int = 0
    peer_id: str = ""
    network: NetworkStatus = NetworkStatus()
    lifetime: Lifetime = Lifetime()
    credit: Credit = Credit()
    uptime_s: float = 0
    #: Unix time the snooze ends; None when not snoozed.
    snoozed_until: float | None = None
    pid: int | None = None


# ---------------------------------------------------------------- events


class _Event(_Sent):
    #: Increasing from 1 in each node process (a restarted node starts again at 1).
    id: int = 0
    #: Unix time.
    at: float = 0.0


class StateEvent(_Event):
    kind: Literal["state"] = "state"
    run: bool
    reason: str
    reason_code: str = ""


class PreferencesEvent(_Event):
    kind: Literal["preferences"] = "preferences"


class ContributionEvent(_Event):
    kind: Literal["contribution"] = "contribution"
    uid: str
    #: "accepted", "given_up" or the aggregator's refusal code.
    outcome: str


class ProjectEvent(_Event):
    kind: Literal["project"] = "project"
    project: str | None
    joined: bool


class ExpertsEvent(_Event):
    kind: Literal["experts"] = "experts"
    experts: list[str]


class ErrorEvent(_Event):
    kind: Literal["error"] = "error"
    message: str


class BenchmarkEvent(_Event):
    kind: Literal["benchmark"] = "benchmark"
    #: What is being measured; "done" with the figures at the end.
    what: str
    done: int
    total: int
    figures: dict[str, Any] | None = None


Event = Annotated[
    StateEvent
    | PreferencesEvent
    | ContributionEvent
    | ProjectEvent
    | ExpertsEvent
    | ErrorEvent
    | BenchmarkEvent,
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- history and projects


class HourOfWork(_Sent):
    #: Unix time of the hour's start.
    hour: int
    working_s: float
    samples: int
    gpu_temp_c_max: float | None = None
    cpu_temp_c_max: float | None = None


class MinuteReading(_Sent):
    #: Unix time of the minute's start.
    at: int
    gpu_temp_c: float | None = None
    cpu_temp_c: float | None = None
    gpu_utilization: float | None = None


class History(_Sent):
    hours: list[HourOfWork] = []
    temperatures: list[MinuteReading] = []


class ProjectSummary(_Sent):
    """What a volunteer sees of a project before saying yes (read off its verified
    manifest)."""

    project: str
    name: str = ""
    description: str = ""
    #: Fingerprint of the owner's key (the project id is bound to that key).
    owner: str = ""
    #: What it trains: the experts on offer and their shape.
    experts: int = 0
    mixture_layers: int = 0
    expert_kind: str = ""
    expert_parameters: int = 0


# ---------------------------------------------------------------- commands


class SnoozeRequest(_Received):
    #: Up to a week.
    seconds: Annotated[float, Field(gt=0, le=7 * 86400, allow_inf_nan=False)]


class JoinRequest(_Received):
    """Find (or join) a project; ``peers`` (from an invite) are where to start looking."""

    project: ProjectId
    peers: Annotated[list[PeerAddress], Field(max_length=MAX_PEERS)] = []


class Accepted(_Sent):
    """A command that goes on in the background was started."""

    started: bool = True


class Problem(_Sent):
    """What every refusal carries: a sentence, and field problems ("field: message")."""

    error: str
    problems: list[str] = []
