"""What a trainer reports while it trains, typed once: ``moehome owner train`` shows these
events (core/trainer/progress.py) or writes one JSON object per line (``--json``), and
the demo reads those lines back (core/demo). Unknown keys are ignored when read (a newer
trainer may add figures); a loss that is not a number is written as ``NaN``, as the
lines always were."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from core.protocol.aggregator_methods import AggregatorReport


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")


class TrainingStarted(_Event):
    event: Literal["start"] = "start"
    project: str
    name: str
    #: where the text comes from, how much, in how many files
    data: str
    data_bytes: int
    files: int
    #: tokens in the data, when they are token shards
    data_tokens: int | None = None
    #: the step its checkpoint resumed at (None: a fresh start)
    resumed_at_step: int | None
    steps: int
    peer: str
    #: where the trainer-side layers run
    device: str


class TrainingProgressed(_Event):
    event: Literal["progress"] = "progress"
    step: int
    steps: int
    #: the mean training loss since the last progress event
    loss: float
    samples: int
    samples_per_s: float
    #: volunteers whose answers were used since the last progress event
    volunteers: int
    version_min: int
    version_max: int
    failed_steps: int
    stale_steps: int
    #: expert answers so far, per volunteer (peer id; the demo compares them)
    answered_by: dict[str, int]
    #: the gradient noise scale so far, in sequences (the critical batch's order;
    #: core/trainer/noise_scale.py), of the trainer-side layers; None: not yet known
    noise_scale: float | None = None
    #: batches carried at once now
    in_flight: int = 1


class ExpertsNote(_Event):
    """Why the experts' versions do not move ("" once they move again)."""

    event: Literal["experts"] = "experts"
    note: str


class Evaluated(_Event):
    event: Literal["eval"] = "eval"
    step: int
    #: the validation loss (NaN: too few volunteers answered)
    loss: float


class Waiting(_Event):
    """No step succeeded: the swarm is short of experts."""

    event: Literal["waiting"] = "waiting"
    step: int
    failed_steps: int


class CallCounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    expert_calls: int = 0
    failed_calls: int = 0
    late_calls: int = 0
    forward_rows: int = 0
    late_rows: int = 0
    backward_rows: int = 0
    #: seconds the training batches waited on the swarm, summed: finding servers, the
    #: forward calls, the backward calls; ``step_s`` the applied steps' whole seconds
    #: (``steps`` of them; trainer compute is the rest)
    plan_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    #: activations and their gradients on the wire, per sample and over float32's
    activation_bytes_per_sample: float = 0.0
    activation_bytes_ratio: float = 0.0


class TrunkSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int
    changes_sent: int
    changes_accepted: int
    rebased: int


class AggregatorShown(AggregatorReport):
    """An aggregator of the manifest with its own account (core/project/owner.py
    ``AggregatorAccount``), or why it gave none."""

    key: str
    peer: str
    unreachable: str | None = None


class FinalRound(BaseModel):
    applied: bool
    seconds: float
    behind: list[str] = []


class TrainingSummary(_Event):
    event: Literal["summary"] = "summary"
    steps: int
    samples: int
    tokens: int
    seconds: float
    samples_per_s: float
    initial_loss: float | None
    final_loss: float | None
    failed_steps: int
    #: batches carried at once; gradients dropped as too stale; the applied ones by how
    #: many updates old their weights were
    in_flight: int = 1
    #: the most carried at once (below ``in_flight`` when they ramp up and did not reach it)
    in_flight_reached: int = 1
    #: the ramp's limit at the end, and its mean over the applied steps (it may come down)
    in_flight_end: int = 1
    in_flight_mean: float = 1.0
    stale_steps: int = 0
    staleness: dict[str, int] = {}
    stopped_early: bool
    volunteers_answered: int
    answered_by: dict[str, int]
    version_min: int
    version_max: int
    calls: CallCounts = CallCounts()
    #: this trainer's answer audits (core/moe/audit.py; None: the project audits none)
    audits: dict[str, Any] | None = None
    #: peers banned from the project (by this trainer's audits or another's), and why
    banned: dict[str, str] = {}
    #: the trainers' shared layers (None: one trainer)
    trunk: TrunkSummary | None = None
    aggregators: list[AggregatorShown] = []
    #: how each volunteer that answered was reached (directly, through a relay...)
    reached: dict[str, str] = {}
    #: with ``--final-round-wait``: whether every expert had a round after the last step
    #: before the final evaluation, the seconds waited, the experts without one
    final_round: FinalRound | None = None
    #: the gradient noise scale at the end, in sequences (None: not estimated)
    noise_scale: float | None = None


TrainerEvent = Annotated[
    TrainingStarted | TrainingProgressed | ExpertsNote | Evaluated | Waiting | TrainingSummary,
    Field(discriminator="event"),
]
_EVENTS: TypeAdapter[TrainerEvent] = TypeAdapter(TrainerEvent)


def read_event(obj: object) -> TrainerEvent | None:
    """A trainer's event from one of its JSON lines, decoded (None: not an event this
    version knows, or not one at all)."""
    try:
        return _EVENTS.validate_python(obj)
    except ValidationError:
        return None
