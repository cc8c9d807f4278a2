"""The trunk: the trainer-side layers (embeddings, attention, gating, norm, head), shared
by a project's trainers the way DiLoCo shares a model between workers.

One trainer's synchronous loop cannot use a growing swarm; several trainers can, but each
trains its own copy of the trunk unless their copies meet. They meet through the
aggregator, as the volunteers' expert gradients do:

1. A trainer trains its copy (its own Adam, the *inner* optimizer) for ``sync_every``
   steps from the version it last took (its *anchor*), then sends the change
   ``anchor - copy`` (a pseudo-gradient: SGD on it moves toward the copy), signed, under
   the reserved uid ``trunk``, and goes on training.
2. The aggregator waits for the change of every listed trainer (or ``round_seconds``),
   applies their sum with an *outer* SGD with Nesterov momentum and publishes the result
   as a new version. DiLoCo averages the changes (rate 0.7, momentum 0.9) after
   hundreds of inner steps; moehome's trainers meet every few steps, where a mean keeps
   one trainer's progress of several. Measured in the emulated swarm (4 volunteers, 2
   trainers of 160 samples each; one trainer of all 320 reaches 3.22): mean, 0.7/0.9,
   every 5 steps 3.73; sum, rate 1, no momentum, every 2 steps 3.46; the same with
   momentum 0.5: 3.31. Those runs were 10 steps per trainer, where momentum's early
   push shows; over 60 steps it costs: benchmarks/concurrency_local.py (3 seeds, every
   arrangement of 2-6 trainers and 1-3 in flight) gives 2-6% less loss without momentum,
   and the emulated swarm (32 volunteers, 2 trainers x 3, 960 samples) a loss ratio of
   1.235 against 1.321. The defaults: the sum, rate 1, no momentum, every 2 steps.
3. Each trainer takes the first version that includes its change and *rebases*: its copy
   becomes ``new + (copy - sent)``, keeping what it learned since it sent.

The trainers never wait for each other: sending and rebasing happen between steps. Pure
bookkeeping here; the trainer's session does the sending and fetching.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from core.experts.uid import Grid
from core.project.manifest import Manifest, ModelSection
from core.trainer.model import build_model

#: parameter name -> float32 tensor on the CPU
Params = dict[str, torch.Tensor]


class _Gate(nn.Module):
    """A mixture's trainer-side part alone: its gating projection, named and initialized
    as in the remote mixture (core/moe/mixture.py)."""

    def __init__(self, hidden: int, grid: Grid) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, sum(grid.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the aggregator's trunk holds weights; it never runs")


def shares_trunk(manifest: Manifest) -> bool:
    """The trainers share the trunk when the manifest lists several (one trainer keeps
    its own: nothing to meet)."""
    return len(manifest.trainers) >= 2


def build_trunk(model: ModelSection, *, seed: int) -> nn.Module:
    """The trainer-side layers alone, as every trainer starts them: the trainer's model
    of the same architecture and seed has parameters of the same names and values."""
    if model.architecture != "byte":
        from core.trainer.family import family_trunk

        return family_trunk(model, seed=seed)
    return build_model(model, lambda _layer, grid: _Gate(model.hidden, grid), seed=seed)


def snapshot(module: nn.Module) -> Params:
    """A copy of ``module``'s parameters (float32, CPU)."""
    return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}


def change(anchor: Mapping[str, torch.Tensor], now: Mapping[str, torch.Tensor]) -> Params:
    """What a trainer sends: ``anchor - now``, the step that would take the anchor to now."""
    return {n: anchor[n] - now[n] for n in anchor}


def rebase(
    current: Mapping[str, torch.Tensor],
    base: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
) -> Params:
    """``new + (current - base)``: the new version, plus what the copy learned since
    ``base``."""
    return {n: new[n] + (current[n] - base[n]) for n in new}


@dataclass
class TrunkSync:
    """One trainer's state in sharing the trunk: when to send its change, and which new
    version it may rebase onto (only one that includes its change, once sent: rebasing
    onto one that does not would drop the change here and count it twice later)."""

    sync_every: int
    #: the version the copy last took, and its weights
    anchor: Params
    version: int = 0
    #: steps and samples trained since the change last sent (or since the start)
    steps: int = 0
    samples: int = 0
    #: the copy's weights when its change was sent, until a version includes it
    sent: Params | None = None
    sent_samples: int = 0
    #: versions after this one include the change sent (the version current when the
    #: aggregator accepted it: a round applies everything accepted before it)
    included_after: int | None = None

    def stepped(self, samples: int) -> None:
        self.steps += 1
        self.samples += samples

    #: training ended: what is left is sent whatever its steps (the final evaluation
    #: waits for a version that holds it)
    finishing: bool = False

    def due(self) -> bool:
        enough = self.steps >= self.sync_every or self.finishing
        return self.sent is None and enough and self.samples > 0

    def settled(self) -> bool:
        """Every change trained here is in a version taken (nothing to send, none sent
        and waiting for its version)."""
        return self.sent is None and self.samples == 0

    def take(self, copy: Params) -> tuple[Params, int, int]:
        """The change to send now (``anchor - copy``), the version it is based on and the
        samples behind it; ``copy`` is remembered as sent."""
        self.sent, self.sent_samples = copy, self.samples
        self.steps = self.samples = 0
        return change(self.anchor, copy), self.version, self.sent_samples

    def accepted(self, current_version: int) -> None:
        """The aggregator took the change while ``current_version`` was current."""
        self.included_after = current_version

    def refused(self) -> None:
        """The change was not taken: it stays in the copy, and goes with the next one."""
        self.samples += self.sent_samples
        self.sent, self.sent_samples, self.included_after = None, 0, None

    def may_rebase(self, version: int) -> bool:
        if version <= self.version:
            return False
        if self.sent is None:
            return True
        return self.included_after is not None and version > self.included_after

    def took(self, new: Params, version: int) -> Params:
        """Version ``version`` (weights ``new``) is taken: the anchor from now on. The
        base to rebase the copy from (``rebase(copy, base, new)``): the copy when it sent
        its change, or the old anchor when it sent none."""
        if not self.may_rebase(version):
            raise ValueError(f"version {version} cannot be rebased onto now")
        base = self.sent if self.sent is not None else self.anchor
        self.anchor, self.version = new, version
        self.sent, self.sent_samples, self.included_after = None, 0, None
        return base
