"""One trainer's training state, without networking: the model, its optimizer, the data,
the steps, evaluation and checkpoints. Runs in worker threads; the mixtures reach the
swarm through their portal. ``train.py`` wires it to a peer.

A step whose experts did not answer (``MoEError``, e.g. every volunteer of a token's
experts left mid-call) changes nothing and is counted as failed; the next batch is tried.

**Batches in flight.** A step through the swarm is four rounds of calls (forward and
backward through each mixture layer), each waiting for the slowest expert it needs: with
one batch at a time, a trainer spends most of a step waiting on links. With
``in_flight`` = N, N threads each carry a batch through a *replica* of the trainer-side
layers (``step_on``): it copies the weights of the master (``model``) as they are when
its batch starts, computes its gradients, and applies them to the master under a lock
(the optimizer and clipping are the master's). Meanwhile other batches may have moved
the master: a gradient computed on weights ``k`` updates old is applied when
``k <= max_staleness``, and dropped beyond (counted in ``stale_steps``; the histogram of
``k`` is in ``staleness``). Replicas, not one shared model: an optimizer step changes
parameters in place, which breaks the autograd graph of every batch in flight.

Stale gradients cost samples (measured on the demo's model, 200 steps of 16, one seed:
validation loss 2.33 one at a time; two in flight 2.65, four 2.97). Two remedies, both
from the asynchronous-SGD literature, cut that cost: a replica starts from where the
master is *predicted* to be when its gradients arrive (the master's last update, once
per batch ahead of it: SpecTrain-style weight prediction), and a gradient ``k`` updates
old is applied with the rate divided by ``1 + k`` (staleness-aware rate). Two in flight:
2.42 (+4%); four: 2.63 (+13%). docs/decisions/009-throughput.md has the table. On Muon
the full rate does better than the divided one (``optimizers.stale_rate``; decision 013).
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpoints import CheckpointStore
from core.moe.client import ExpertCallError
from core.moe.mixture import MoEError, RemoteMixtureOfExperts
from core.project.manifest import TrainerOptimizerKind
from core.project.schedule import Schedule
from core.trainer.batches import Batches, CorpusBatches
from core.trainer.data import Corpus
from core.trainer.model import TrainerModel
from core.trainer.noise_scale import NoiseScale, gradient_sample
from core.trainer.optimizers import TrainerOptimizer, stale_rate
from core.trainer.trunk import Params, rebase, snapshot

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class SessionSettings:
    project: str
    batch_size: int = 16
    learning_rate: float = 3e-3
    eval_batches: int = 4
    seed: int = 0
    #: trainer-side gradients are clipped to this norm (the first steps of a fresh model
    #: can be large)
    clip_norm: float = 1.0
    #: where the trainer-side layers compute ("cpu", "cuda", "cuda:1"); experts are remote
    device: str = "cpu"
    #: batches carried through the swarm at once (see the module's docstring)
    in_flight: int = 1
    #: a gradient computed on weights more than this many updates old is dropped
    #: (None: 2 x in_flight)
    max_staleness: int | None = None
    #: the manifest's [training.schedule]: the rate's warmup and decay by step, weight
    #: decay (AdamW's, decoupled) and the clipping norm (None: constant, ``clip_norm``)
    schedule: Schedule | None = None
    #: AdamW for every trainer-side parameter, or Muon for the hidden matrices
    #: (core/trainer/optimizers.py)
    optimizer: TrainerOptimizerKind = "adamw"
    #: a reference run's local experts on Adam at this fixed rate, as the aggregators
    #: train the volunteers' (None: with the trainer-side layers)
    local_expert_rate: float | None = None

    def trainer_schedule(self) -> Schedule:
        return self.schedule or Schedule(clip_norm=self.clip_norm)

    def staleness_bound(self) -> int:
        return 2 * self.in_flight if self.max_staleness is None else self.max_staleness


@dataclass
class SessionState:
    step: int = 0
    samples: int = 0  # sequences trained on
    failed_steps: int = 0
    initial_loss: float | None = None
    #: (step, validation loss) after each evaluation
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    #: gradients dropped because the master had moved more than max_staleness updates
    stale_steps: int = 0
    #: applied gradients by how many updates old their weights were
    staleness: Counter[int] = field(default_factory=Counter)


@dataclass(frozen=True)
class StepResult:
    loss: float
    #: the master's step count once this batch's gradients were applied
    step: int
    #: updates the master made between this batch's weights and its gradients
    staleness: int
    #: False when the gradients were dropped as too stale
    applied: bool = True


class TrainingSession:
    def __init__(
        self,
        model: TrainerModel,
        data: Corpus | Batches,
        settings: SessionSettings,
        checkpoints: Path | None = None,
        *,
        replica: Callable[[], TrainerModel] | None = None,
    ) -> None:
        """``data``: the batches (a corpus: the byte model's random windows of it, drawn
        from ``settings.seed``). ``replica`` builds another copy of ``model`` for a batch
        in flight (remote mixtures share their finder and caller); by default a deep
        copy."""
        if settings.in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self.device = torch.device(settings.device)
        self.model = model.to(self.device)
        self.settings = settings
        self.context = model.context
        self.batches: Batches = (
            CorpusBatches(data, settings.batch_size, self.context, settings.seed)
            if isinstance(data, Corpus)
            else data
        )
        self.schedule = settings.trainer_schedule()
        self.optimizer = TrainerOptimizer(
            model,
            settings.optimizer,
            settings.learning_rate,
            self.schedule.weight_decay,
            local_expert_rate=settings.local_expert_rate,
        )
        self.state = SessionState()
        #: Why the last evaluation gave no loss ("" before any failed).
        self.evaluation_error = ""
        self.store = CheckpointStore(checkpoints) if checkpoints is not None else None
        self._checkpoint_number = 0
        self._eval = self.batches.validation_batches(settings.eval_batches)
        # one batch at a time computes on the master itself; more, on replicas (and
        # evaluation then on a copy of its own, taken under the lock)
        make = replica or (lambda: copy.deepcopy(model))
        self._replicas = (
            [make().to(self.device) for _ in range(settings.in_flight + 1)]
            if settings.in_flight > 1
            else []
        )
        #: held to read or change the master's weights, optimizer and state
        self._lock = threading.Lock()
        #: batches on replicas now, and the master's last update (for the prediction)
        self._carried = 0
        self._last_update: list[torch.Tensor] = []
        #: a batch or an evaluation computes on the master itself now (one at a time)
        self._master_busy = False
        #: rebases of the shared trunk waiting for the master (rebase_trunk)
        self._rebases: list[tuple[Params, Params]] = []
        #: the gradient noise scale, from the batches' trainer-side gradients
        self.noise = NoiseScale(settings.batch_size)
        self._coordinates = sum(p.numel() for p in model.parameters())

    @property
    def in_flight(self) -> int:
        return self.settings.in_flight

    # ------------------------------------------------------------ training

    def train_step(self) -> float | None:
        """One optimizer step on a fresh batch; its loss, or None when the swarm failed it
        (or, with batches in flight, its gradients came too late)."""
        result = self.step_on(0)
        return result.loss if result is not None and result.applied else None

    def step_on(self, worker: int) -> StepResult | None:
        """One batch carried by ``worker`` (0 .. in_flight-1; each worker's calls come
        from one thread at a time): None when the swarm failed it; not ``applied`` when
        its gradients came too late (see the module's docstring)."""
        if not 0 <= worker < self.in_flight:
            raise ValueError(f"worker {worker} of {self.in_flight}")
        if not self._replicas:
            return self._step(self.model, self.state.step)
        model = self._replicas[worker]
        with self._lock:
            based_on = self.state.step
            _copy_weights(self.model, model)
            # the updates expected before this batch's own: one per other batch in flight
            _predict(model, self._last_update, ahead=self._carried)
            self._carried += 1
        try:
            return self._step(model, based_on)
        finally:
            with self._lock:
                self._carried -= 1

    def _step(self, model: TrainerModel, based_on: int) -> StepResult | None:
        if model is not self.model:
            return self._step_inner(model, based_on)
        with self._lock:
            self._master_busy = True
        try:
            return self._step_inner(model, based_on)
        finally:
            with self._lock:
                self._master_busy = False
                self._apply_rebases()

    def _step_inner(self, model: TrainerModel, based_on: int) -> StepResult | None:
        with self._lock:
            x, y = self.batches.next_batch()
        x, y = x.to(self.device), y.to(self.device)
        model.train()
        started = time.perf_counter()
        try:
            objective, loss = model.objective(x, y)
            model.zero_grad(set_to_none=True)
            objective.backward()  # type: ignore[no-untyped-call]
        except (MoEError, ExpertCallError) as exc:
            with self._lock:
                self.state.failed_steps += 1
            log.info("a step failed (%s); trying the next batch", exc)
            return None
        sample = gradient_sample((p.grad for p in model.parameters()), self._coordinates)
        with self._lock:
            self.noise.add(sample)  # in the order batches finish, stale ones too
            staleness = self.state.step - based_on
            if staleness > self.settings.staleness_bound():
                self.state.stale_steps += 1
                log.info("gradients %d updates old dropped", staleness)
                return StepResult(float(loss.detach()), self.state.step, staleness, False)
            if model is not self.model:
                for master, p in zip(self.model.parameters(), model.parameters(), strict=True):
                    master.grad = p.grad
            if self.schedule.clip_norm > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.schedule.clip_norm)
            # the schedule's rate at this step; on AdamW a stale gradient moves the
            # weights less (staleness-aware rate; optimizers.stale_rate)
            rate = self.schedule.rate(self.settings.learning_rate, self.state.step)
            for group in self.optimizer.param_groups:
                group["lr"] = stale_rate(self.optimizer.kind, rate, staleness)
            before = [p.detach().clone() for p in self.model.parameters()] if self._replicas else []
            self.optimizer.step()
            if self._replicas:
                self._last_update = [
                    p.detach() - b for p, b in zip(self.model.parameters(), before, strict=True)
                ]
            self.optimizer.zero_grad(set_to_none=True)
            self.state.step += 1
            self.state.samples += x.shape[0]
            self.state.staleness[staleness] += 1
            self.state.train_seconds += time.perf_counter() - started
            return StepResult(float(loss.detach()), self.state.step, staleness)

    def evaluate(self) -> float:
        """Mean next-byte loss on the held-out batches (the same ones every time), in
        nats; NaN when the swarm could not answer. With batches in flight, of the master's
        weights when the evaluation starts (one evaluation at a time)."""
        model = self._replicas[-1] if self._replicas else self.model
        with self._lock:
            step = self.state.step
            if model is not self.model:
                _copy_weights(self.model, model)
            else:  # a rebase waits: the evaluation is of one set of weights
                self._master_busy = True
        model.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for x, y in self._eval:
                    x, y = x.to(self.device), y.to(self.device)
                    total += float(model.objective(x, y)[1])
        except (MoEError, ExpertCallError) as exc:
            # the caller says it (a NaN): "not evaluated", once, not a line a second
            log.debug("evaluation failed: %s", exc)
            self.evaluation_error = str(exc)
            return math.nan
        finally:
            if model is self.model:
                with self._lock:
                    self._master_busy = False
                    self._apply_rebases()
        loss = total / len(self._eval)
        with self._lock:
            if self.state.initial_loss is None:
                self.state.initial_loss = loss
            self.state.evaluations.append((step, loss))
        return loss

    def trunk_weights(self) -> Params:
        """A copy of the master's trainer-side weights (float32, CPU)."""
        with self._lock:
            return snapshot(self.model)

    def rebase_trunk(self, base: Params, new: Params) -> None:
        """Move the master's trainer-side weights onto ``new``, a version of the shared
        trunk, keeping what they learned since ``base`` (core/trainer/trunk.py). While a
        batch computes on the master itself (one batch at a time), after its update: its
        autograd graph holds the weights, and changing them in place would break it. The
        optimizer's moments stay: they are this trainer's, as DiLoCo's inner ones."""
        with self._lock:
            self._rebases.append((base, new))
            if not self._master_busy:
                self._apply_rebases()

    def _apply_rebases(self) -> None:
        """(Holding the lock.)"""
        if not self._rebases:
            return
        weights = snapshot(self.model)
        for base, new in self._rebases:
            weights = rebase(weights, base, new)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(weights[name].to(p.dtype))
        self._rebases.clear()
        self._last_update = []  # the prediction of the next update would be off

    def mixtures(self) -> list[RemoteMixtureOfExperts]:
        """The remote mixtures of the master and of every replica."""
        models = [self.model, *self._replicas]
        return [m for model in models for m in model.remote_mixtures()]

    def wire_bytes(self) -> tuple[int, int]:
        """(bytes of activations and their gradients on the wire, the same values as
        float32), over every mixture layer since the session began."""
        stats = list({id(m.caller): m.caller.stats for m in self.mixtures()}.values())
        return sum(s.wire_bytes for s in stats), sum(s.float32_bytes for s in stats)

    def swarm_view(self) -> dict[str, Any]:
        """Who answered so far and which weights versions, over every mixture layer."""
        answered: dict[str, int] = {}
        versions: dict[str, int] = {}
        for m in self.mixtures():
            for peer, n in m.stats.answered_by.items():
                answered[peer] = answered.get(peer, 0) + n
            versions.update(m.stats.versions)
        return {"answered_by": answered, "versions": versions}

    # ------------------------------------------------------------ checkpoints

    def save(self) -> None:
        """Trainer-side weights, optimizer and data position, atomically (safetensors +
        msgpack; nothing pickled)."""
        if self.store is None:
            return
        with self._lock:  # batches in flight wait: the weights must not move meanwhile
            tensors = {f"m/{k}": v.detach().cpu() for k, v in self.model.state_dict().items()}
            opt = self.optimizer.state(tensors)
            s = self.state
            meta = {
                "format": CHECKPOINT_FORMAT,
                "project": self.settings.project,
                "step": s.step,
                "samples": s.samples,
                "failed_steps": s.failed_steps,
                "stale_steps": s.stale_steps,
                "staleness": [[k, v] for k, v in sorted(s.staleness.items())],
                "initial_loss": s.initial_loss,
                "evaluations": [list(e) for e in s.evaluations],
                "train_seconds": s.train_seconds,
                "optimizer": opt,
                # where the data goes on (the loader's cursor, or the generator's state)
                "data": self.batches.state_dict(),
            }
            self._checkpoint_number += 1
            self.store.save(self._checkpoint_number, meta, tensors)

    def restore(self) -> bool:
        """Load the newest checkpoint of this project, if any. True when resumed."""
        if self.store is None:
            return False
        latest = self.store.latest()
        if latest is None:
            return False
        number, meta, tensors = latest
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("project") != self.settings.project:
            log.warning("checkpoint %d is of another project or format; starting afresh", number)
            return False
        weights = {k[2:]: v for k, v in tensors.items() if k.startswith("m/")}
        self.model.load_state_dict(weights)
        if not self.optimizer.load(meta["optimizer"], tensors):
            log.warning(
                "checkpoint %d was trained with another trainer optimizer than %s: its "
                "weights go on, its moments start afresh",
                number,
                self.optimizer.kind,
            )
        if "data" in meta:
            self.batches.load_state_dict(meta["data"])
        elif "rng" in tensors:  # a checkpoint of before the data's cursor had a place
            self.batches.load_state_dict({"rng": tensors["rng"].numpy().tobytes()})
        self.state = SessionState(
            step=int(meta["step"]),
            samples=int(meta["samples"]),
            failed_steps=int(meta["failed_steps"]),
            stale_steps=int(meta.get("stale_steps", 0)),
            staleness=Counter({int(k): int(v) for k, v in meta.get("staleness", [])}),
            initial_loss=meta["initial_loss"],
            evaluations=[(int(a), float(b)) for a, b in meta["evaluations"]],
            train_seconds=float(meta["train_seconds"]),
        )
        self._checkpoint_number = number
        return True


def _predict(model: nn.Module, update: list[torch.Tensor], *, ahead: int) -> None:
    """Moves ``model``'s weights ``ahead`` times ``update`` further: where the master
    will be when this batch's gradients arrive, if it goes on as it just went."""
    if not update or ahead == 0:
        return
    with torch.no_grad():
        for p, u in zip(model.parameters(), update, strict=True):
            p.add_(u, alpha=ahead)


def _copy_weights(source: nn.Module, target: nn.Module) -> None:
    with torch.no_grad():
        for s, t in zip(source.parameters(), target.parameters(), strict=True):
            t.copy_(s)
