"""The project manifest: what a person writes (TOML) and what gets checked (the commented
template ``owner new`` writes: core/project/template.py).

Every mistake is reported with the path of the field (``model.expert.hidden: ...``),
all at once, before anything is signed or published.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.experts.codec_names import ActivationCodec, WireCodecs
from core.experts.spec import ExpertSpec, SpecError
from core.experts.uid import ExpertUID, Grid
from core.project.schedule import Schedule, ScheduleKind

#: The robust aggregation rules a manifest may name; core/aggregator/robust.py implements
#: exactly these (its table is typed by this, and a test ties the two).
RuleName = Literal["centered_clip", "median", "trimmed_mean", "mean"]

MAX_MANIFEST_BYTES = 64 * 1024
#: Experts a project may have in one mixture layer and in all. A manifest comes from
#: the network: every count made of its fields is bounded before anything is sized by
#: it (a grid of 4096^4 x 64 layers fits in 24 KiB and froze the node that counted it).
#: 16,384 per layer is 64x the largest datacenter MoE (DeepSeek-V3: 256 routed).
MAX_EXPERTS_PER_LAYER = 16_384
MAX_EXPERTS = 65_536
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,47}$"
NAME = Annotated[str, Field(pattern=NAME_PATTERN)]


class ManifestError(ValueError):
    """The manifest has mistakes; ``problems`` lists them as 'field: message'."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("the manifest has mistakes:\n  " + "\n  ".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ProjectSection(_Strict):
    name: NAME
    description: Annotated[str, Field(max_length=2000)] = ""
    min_app_version: Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+$")] = "0.1.0"


class ExpertSection(_Strict):
    #: ffn: the byte model's block (norm, residual and biases inside); swiglu: a
    #: Mixtral-style expert (``w2(act(w1 x) * w3 x)``, no bias, no norm)
    kind: Literal["ffn", "swiglu"] = "ffn"
    hidden: Annotated[int, Field(ge=1, le=65536)]
    inner: Annotated[int, Field(ge=0, le=524288)] = 0
    #: the default is each kind's own: gelu for ffn, silu (SwiGLU) for swiglu
    activation: Literal["gelu", "relu", "silu"] | None = None
    #: blocks stacked in each expert (a thick expert: compute per byte on the wire grows
    #: with it); ffn: residual blocks in sequence; swiglu: the first as above, each next
    #: one pre-normed (RMS) and residual; Mixtral export takes only 1
    blocks: Annotated[int, Field(ge=1, le=64)] = 1

    def spec(self) -> ExpertSpec:
        activation = self.activation or ("silu" if self.kind == "swiglu" else "gelu")
        return ExpertSpec(self.kind, self.hidden, self.inner, 0, activation, blocks=self.blocks)


class WireSection(_Strict):
    """How expert inputs and outputs (``activations``) and their gradients travel
    between trainers and volunteers (core/experts/activations.py)."""

    activations: ActivationCodec = "raw"
    gradients: ActivationCodec = "raw"

    def codecs(self) -> WireCodecs:
        return WireCodecs(self.activations, self.gradients)


#: The model families a manifest may name: ``byte`` is moehome's small built-in byte
#: model (core/trainer/model.py); ``mixtral`` is Hugging Face's Mixtral, its attention,
#: norms and rotary embeddings from ``transformers`` (core/families/mixtral.py), every
#: layer's sparse block a mixture of the volunteers' SwiGLU experts.
Architecture = Literal["byte", "mixtral"]
#: The dtype volunteers hold the experts' weights in and compute in (gradients are
#: summed in float32 whatever it is; aggregators keep float32 master weights).
#: bfloat16 for new projects (core/project/template.py); float32 where a manifest says
#: nothing, as every project published before the field existed.
ExpertDtype = Literal["bfloat16", "float16", "float32"]


class ModelSection(_Strict):
    architecture: Architecture = "byte"
    dtype: ExpertDtype = "float32"
    vocab_size: Annotated[int, Field(ge=2, le=1_000_000)] = 256
    hidden: Annotated[int, Field(ge=1, le=65536)]
    context: Annotated[int, Field(ge=1, le=65536)] = 128
    expert_prefix: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,15}$")] = "ffn"
    mixture_layers: Annotated[int, Field(ge=1, le=64)] = 1
    grid: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(min_length=1, max_length=4)]
    k_best: Annotated[int, Field(ge=1, le=64)] = 4
    k_min: Annotated[int, Field(ge=1, le=64)] = 1
    expert: ExpertSection
    wire: WireSection = WireSection()
    #: mixtral: attention heads (0: one per 64 of hidden, at least one) and key/value
    #: heads (0: as many as heads; fewer: grouped-query attention)
    heads: Annotated[int, Field(ge=0, le=1024)] = 0
    kv_heads: Annotated[int, Field(ge=0, le=1024)] = 0
    #: mixtral: the rotary embedding's base, the RMS norms' epsilon, the weight of the
    #: router's load-balancing loss (transformers' router_aux_loss_coef) and whether the
    #: output head shares the embedding's weights
    rope_theta: Annotated[float, Field(gt=0)] = 1e6
    rms_norm_eps: Annotated[float, Field(gt=0, lt=1)] = 1e-5
    router_aux_loss: Annotated[float, Field(ge=0, le=10)] = 0.01
    tie_embeddings: bool = False

    def expert_spec(self) -> ExpertSpec:
        """What every expert of the project is: the expert table's fields, computing in
        the project's ``dtype``."""
        return dataclasses.replace(self.expert.spec(), dtype=self.dtype)

    @property
    def attention_heads(self) -> int:
        return self.heads or max(1, self.hidden // 64)

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.attention_heads

    @model_validator(mode="after")
    def _family(self) -> ModelSection:
        if self.architecture == "byte":
            if self.expert.kind != "ffn":
                raise ValueError("architecture byte: expert.kind must be ffn")
            return self
        if self.expert.kind != "swiglu":
            raise ValueError(f"architecture {self.architecture}: expert.kind must be swiglu")
        if self.hidden % self.attention_heads:
            raise ValueError(f"heads ({self.attention_heads}) must divide hidden ({self.hidden})")
        if self.attention_heads % self.key_value_heads:
            raise ValueError(
                f"kv_heads ({self.key_value_heads}) must divide heads ({self.attention_heads})"
            )
        if (self.hidden // self.attention_heads) % 2:
            raise ValueError(
                f"hidden / heads = {self.hidden // self.attention_heads}: rotary embeddings "
                "need an even head width"
            )
        if self.k_best > self.experts_per_layer:
            raise ValueError(
                f"k_best ({self.k_best}) exceeds the {self.experts_per_layer} experts of a layer"
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ModelSection:
        if self.expert.hidden != self.hidden:
            raise ValueError(
                f"expert.hidden ({self.expert.hidden}) must equal model.hidden ({self.hidden})"
            )
        if self.k_min > self.k_best:
            raise ValueError(f"k_min ({self.k_min}) must not exceed k_best ({self.k_best})")
        if self.experts_per_layer > MAX_EXPERTS_PER_LAYER:
            raise ValueError(
                f"grid {self.grid} holds {self.experts_per_layer} experts per layer; "
                f"at most {MAX_EXPERTS_PER_LAYER}"
            )
        if self.expert_count > MAX_EXPERTS:
            raise ValueError(
                f"{self.mixture_layers} layers of {self.experts_per_layer} experts make "
                f"{self.expert_count}; at most {MAX_EXPERTS}"
            )
        try:
            self.expert.spec()
        except SpecError as exc:
            raise ValueError(f"expert.{exc}") from exc
        return self

    @property
    def experts_per_layer(self) -> int:
        """Counted, not listed (the grid's sizes are bounded, so is their product)."""
        return math.prod(self.grid)

    @property
    def expert_count(self) -> int:
        return self.experts_per_layer * self.mixture_layers

    def grids(self) -> list[Grid]:
        return [
            Grid(f"{self.expert_prefix}{layer}", tuple(self.grid))
            for layer in range(self.mixture_layers)
        ]

    def expert_uids(self) -> Iterator[str]:
        for grid in self.grids():
            for uid in grid:
                yield str(uid)


class AggregationSection(_Strict):
    rule: RuleName = "centered_clip"
    clip_radius: Annotated[float, Field(gt=0)] = 1.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    buckets: Annotated[int, Field(ge=1, le=64)] = 2
    trim_fraction: Annotated[float, Field(ge=0, lt=0.5)] = 0.2


class TrunkSection(_Strict):
    """How a project's trainers share the trainer-side layers (the *trunk*: embeddings,
    attention, gating, head) when the manifest lists two or more trainers (the method is
    DiLoCo's, core/trainer/trunk.py): each trains its copy for ``sync_every`` steps,
    sends the change as a contribution, and the aggregator applies the sum of the
    trainers' changes with an outer SGD with momentum, as a new version every trainer
    rebases onto."""

    sync_every: Annotated[int, Field(ge=1, le=100_000)] = 2
    outer_learning_rate: Annotated[float, Field(gt=0, le=10)] = 1.0
    #: 0: measured better than 0.5 at every arrangement of 2-6 trainers
    #: (benchmarks/concurrency_local.py; docs/decisions/009-throughput.md)
    outer_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    #: a round waits this long for every listed trainer's change, then applies those in
    round_seconds: Annotated[float, Field(gt=0)] = 5.0


class AuditSection(_Strict):
    """How trainers and aggregators check volunteers' work (core/moe/audit.py,
    core/aggregator/auditor.py)."""

    #: the share of expert answers a trainer recomputes: 0.05 catches a volunteer that
    #: cheats on every answer within 100 of them with probability 0.994
    answer_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    #: the share of an audited answer's rows recomputed (at least one row): a volunteer
    #: cheating on a whole answer is caught by any row, at a fraction of the cost
    answer_rows: Annotated[float, Field(gt=0, le=1)] = 0.25
    #: the weights of audited versions a trainer keeps in memory, MiB
    weights_mib: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    #: the share of accepted contributions an aggregator recomputes from what their
    #: receipts commit to (0.05: a cheater on every contribution is caught within 100 of
    #: them with probability 0.994; the swarm pays 5% more compute)
    contribution_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    #: memory a volunteer keeps the inputs and output gradients behind its contributions
    #: in until they are settled, MiB (a contribution that did not fit is discarded if
    #: audited: the volunteer loses that work, and is not blamed)
    kept_mib: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    #: how long a ban (published by the trainer or aggregator that caught a cheater)
    #: lasts
    ban_hours: Annotated[float, Field(gt=0, le=24 * 365)] = 24.0
    #: peers whose bans the owner lifted: every trainer and aggregator ignores them
    pardoned: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=1024)
    ] = []


class ScheduleSection(_Strict):
    """A learning-rate schedule with its weight decay and clipping (core/project/
    schedule.py): ``[training.schedule]`` for the trainer-side layers, counted in a
    trainer's steps; ``[training.expert_schedule]`` for the experts' optimizers at the
    aggregators, counted in each expert's versions. The rate is ``learning_rate`` times
    the schedule's factor at the step."""

    #: constant, cosine (to min_ratio at total) or wsd (warmup-stable-decay: constant,
    #: then linear to min_ratio over the last decay_fraction of total)
    kind: ScheduleKind = "constant"
    #: steps of linear warmup, from 1/(warmup+1) of the rate up to the rate
    warmup: Annotated[int, Field(ge=0, le=100_000_000)] = 0
    #: the step at which cosine and wsd reach min_ratio of the rate (and stay)
    total: Annotated[int, Field(ge=1, le=100_000_000)] = 10_000
    #: wsd: the last share of total over which the rate decays
    decay_fraction: Annotated[float, Field(gt=0, le=1)] = 0.2
    #: the final rate, as a share of learning_rate
    min_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    #: adamw: decoupled weight decay; adam and sgd: an L2 term added to the gradient
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.0
    #: the gradient's norm is clipped to this before each step (0: no clipping)
    clip_norm: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _warmup_within_total(self) -> ScheduleSection:
        if self.kind != "constant" and self.warmup >= self.total:
            raise ValueError(
                f"warmup ({self.warmup}) must be less than total ({self.total}): the "
                f"{self.kind} decay follows the warmup"
            )
        return self

    def schedule(self) -> Schedule:
        return Schedule(
            self.kind,
            self.warmup,
            self.total,
            self.decay_fraction,
            self.min_ratio,
            self.weight_decay,
            self.clip_norm,
        )


#: the trainer-side layers' optimizer (core/trainer/optimizers.py): AdamW for all, or
#: Muon for the hidden matrices and AdamW for the rest
TrainerOptimizerKind = Literal["adamw", "muon"]


class TrainingSection(_Strict):
    #: the experts' optimizer, at the aggregators
    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    #: the trainer-side layers' optimizer, at each trainer
    trainer_optimizer: TrainerOptimizerKind = "adamw"
    learning_rate: Annotated[float, Field(gt=0, le=10)] = 1e-3
    contribution_samples: Annotated[int, Field(ge=1)] = 512
    contribution_seconds: Annotated[float, Field(gt=0)] = 30.0
    staleness_bound: Annotated[int, Field(ge=0, le=1000)] = 4
    round_samples: Annotated[int, Field(ge=1)] = 4096
    round_seconds: Annotated[float, Field(gt=0)] = 60.0
    #: distinct volunteers whose gradients a version of an expert needs: with fewer, a
    #: round waits (a lone volunteer, or one attacker facing one honest volunteer,
    #: would decide the version alone)
    min_contributors: Annotated[int, Field(ge=1, le=1000)] = 3
    aggregation: AggregationSection = AggregationSection()
    trunk: TrunkSection = TrunkSection()
    audit: AuditSection = AuditSection()
    #: the trainer-side layers' schedule, in trainer steps (clipped at 1.0 by default,
    #: as the trainer always did)
    schedule: ScheduleSection = ScheduleSection(clip_norm=1.0)
    #: the experts' schedule at the aggregators, in each expert's versions
    expert_schedule: ScheduleSection = ScheduleSection()


class AggregatorEntry(_Strict):
    key: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="hex Ed25519 public key")]
    addrs: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=8)] = []


class TrainerEntry(_Strict):
    key: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="hex Ed25519 public key")]


class WeightsSection(_Strict):
    seed: Annotated[int, Field(ge=0, lt=2**31)] = 0
    #: A folder of <uid>.safetensors files to publish instead of seeded initial weights.
    folder: str | None = None


class DataSection(_Strict):
    """What the trainers' data are tokenized with: ``bytes`` (256 byte values and an
    end-of-text id, 257 in all; the byte model has no end-of-text id) or the sha256 of
    a Hugging Face ``tokenizer.json`` (``moehome owner tokenizer`` prints it). Token
    shards made with another tokenizer are refused (core/data/loader.py)."""

    tokenizer: Annotated[str, Field(pattern=r"^(bytes|[0-9a-f]{64})$")] = "bytes"


class Manifest(_Strict):
    project: ProjectSection
    model: ModelSection
    data: DataSection = DataSection()
    training: TrainingSection = TrainingSection()
    aggregators: Annotated[list[AggregatorEntry], Field(max_length=64)] = []
    trainers: Annotated[list[TrainerEntry], Field(max_length=256)] = []
    weights: WeightsSection = WeightsSection()

    @model_validator(mode="after")
    def _vocabulary(self) -> Manifest:
        m = self.model
        if self.data.tokenizer == "bytes" and m.architecture != "byte" and m.vocab_size < 257:
            raise ValueError(
                f"model.vocab_size ({m.vocab_size}): bytes need 257 (256 byte values and "
                "the end of text)"
            )
        if self.data.tokenizer != "bytes" and m.architecture == "byte":
            raise ValueError("architecture byte reads bytes: data.tokenizer must be bytes")
        return self

    @field_validator("aggregators")
    @classmethod
    def _distinct(cls, v: list[AggregatorEntry]) -> list[AggregatorEntry]:
        keys = [a.key for a in v]
        if len(keys) != len(set(keys)):
            raise ValueError("the same aggregator key is listed twice")
        return v

    def to_obj(self) -> dict[str, Any]:
        """Plain data (canonical order comes from msgpack of sorted keys at signing)."""
        return self.model_dump(mode="python")


def parse_manifest(data: dict[str, Any]) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError([_describe(e) for e in exc.errors()]) from None


def load_manifest(path: Path) -> Manifest:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ManifestError([f"{path}: {exc.strerror}"]) from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError([f"{path}: larger than {MAX_MANIFEST_BYTES} bytes"])
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError([f"{path}: not valid TOML ({exc})"]) from exc
    return parse_manifest(data)


def _describe(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "manifest"
    msg = error["msg"].removeprefix("Value error, ")
    kind = error["type"]
    if kind == "extra_forbidden":
        msg = "unknown field (check its spelling and section)"
    elif kind == "string_pattern_mismatch" and loc.endswith("name"):
        msg = "lowercase letters, digits and '-' (at most 48, starting with a letter or digit)"
    elif kind == "string_pattern_mismatch" and loc.endswith("key"):
        msg = "64 hex digits (a public key, as `moehome aggregator key` prints it)"
    elif kind == "string_pattern_mismatch":
        msg = f"not of the form {error.get('ctx', {}).get('pattern', 'expected')}"
    elif kind == "list_type":
        msg = "should be a list in brackets, e.g. [4, 4]"
    return f"{loc}: {msg} (given: {error.get('input')!r:.60})"


def example_uid(manifest: Manifest) -> str:
    return str(next(iter(manifest.model.grids()[0])))


def check_uid(manifest: Manifest, uid: str) -> bool:
    parsed = ExpertUID.parse(uid)
    return any(parsed in grid for grid in manifest.model.grids())
