"""One trainer's training state, without networking: the model, its optimizer, the data,
the steps, evaluation and checkpoints. Runs in a worker thread; the mixtures reach the
swarm through their portal. ``train.py`` wires it to a peer.

A step whose experts did not answer (``MoEError``, e.g. every volunteer of a token's
experts left mid-call) changes nothing and is counted as failed; the next batch is tried.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpoints import CheckpointStore, load_optimizer_state, optimizer_state
from core.moe.client import ExpertCallError
from core.moe.mixture import MoEError, RemoteMixtureOfExperts
from core.trainer.data import Corpus, sample_batch, validation_batches
from core.trainer.model import CharLanguageModel, language_model_loss

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


@dataclass
class SessionState:
    step: int = 0
    samples: int = 0  # sequences trained on
    failed_steps: int = 0
    initial_loss: float | None = None
    #: (step, validation loss) after each evaluation
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0


class TrainingSession:
    def __init__(
        self,
        model: CharLanguageModel,
        corpus: Corpus,
        settings: SessionSettings,
        checkpoints: Path | None = None,
    ) -> None:
        self.device = torch.device(settings.device)
        self.model = model.to(self.device)
        self.corpus = corpus
        self.settings = settings
        self.context = model.context
        self.optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.state = SessionState()
        self.store = CheckpointStore(checkpoints) if checkpoints is not None else None
        self._checkpoint_number = 0
        self._eval = validation_batches(
            corpus.validation, settings.batch_size, self.context, settings.eval_batches
        )

    # ------------------------------------------------------------ training

    def train_step(self) -> float | None:
        """One optimizer step on a fresh batch; its loss, or None when the swarm failed it."""
        x, y = sample_batch(
            self.corpus.train, self.settings.batch_size, self.context, self.generator
        )
        x, y = x.to(self.device), y.to(self.device)
        self.model.train()
        started = time.perf_counter()
        try:
            loss = language_model_loss(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
        except (MoEError, ExpertCallError) as exc:
            self.state.failed_steps += 1
            log.info("step %d failed (%s); trying the next batch", self.state.step, exc)
            return None
        nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.clip_norm)
        self.optimizer.step()
        self.state.step += 1
        self.state.samples += x.shape[0]
        self.state.train_seconds += time.perf_counter() - started
        return float(loss.detach())

    def evaluate(self) -> float:
        """Mean next-byte loss on the held-out batches (the same ones every time), in
        nats; NaN when the swarm could not answer."""
        self.model.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for x, y in self._eval:
                    x, y = x.to(self.device), y.to(self.device)
                    total += float(language_model_loss(self.model(x), y))
        except (MoEError, ExpertCallError) as exc:
            log.warning("evaluation failed: %s", exc)
            return math.nan
        loss = total / len(self._eval)
        if self.state.initial_loss is None:
            self.state.initial_loss = loss
        self.state.evaluations.append((self.state.step, loss))
        return loss

    def mixtures(self) -> list[RemoteMixtureOfExperts]:
        return [m for m in self.model.mixtures if isinstance(m, RemoteMixtureOfExperts)]

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
        tensors = {f"m/{k}": v.detach().cpu() for k, v in self.model.state_dict().items()}
        opt = optimizer_state(self.optimizer, "o", tensors)
        tensors["rng"] = self.generator.get_state()
        s = self.state
        meta = {
            "format": CHECKPOINT_FORMAT,
            "project": self.settings.project,
            "step": s.step,
            "samples": s.samples,
            "failed_steps": s.failed_steps,
            "initial_loss": s.initial_loss,
            "evaluations": [list(e) for e in s.evaluations],
            "train_seconds": s.train_seconds,
            "optimizer": opt,
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
        load_optimizer_state(self.optimizer, meta["optimizer"], "o", tensors)
        self.generator.set_state(tensors["rng"])
        self.state = SessionState(
            step=int(meta["step"]),
            samples=int(meta["samples"]),
            failed_steps=int(meta["failed_steps"]),
            initial_loss=meta["initial_loss"],
            evaluations=[(int(a), float(b)) for a, b in meta["evaluations"]],
            train_seconds=float(meta["train_seconds"]),
        )
        self._checkpoint_number = number
        return True
