"""How ``moehome owner train`` shows its progress: a rich progress bar with the loss and
speed for a person, or one JSON object per line for programs (``--json``; the demo reads
those)."""

from __future__ import annotations

import math
import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.trainer.events import (
    Evaluated,
    ExpertsNote,
    TrainerEvent,
    TrainingProgressed,
    TrainingStarted,
    TrainingSummary,
    Waiting,
)


def json_line(event: TrainerEvent) -> None:
    sys.stdout.write(event.model_dump_json() + "\n")
    sys.stdout.flush()


def loss_text(loss: float | None) -> str:
    return "-" if loss is None or math.isnan(loss) else f"{loss:.3f}"


class TrainingProgress:
    """A context manager whose ``__call__`` takes the trainer's events."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("steps", total=None, status="joining the swarm")

    def __enter__(self) -> TrainingProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def __call__(self, event: TrainerEvent) -> None:
        if isinstance(event, TrainingStarted):
            resumed = event.resumed_at_step
            self.console.print(
                f"project {event.name} ({event.project}): "
                + (
                    f"{event.data_bytes / 1e6:.1f} MB of text from {event.files} files "
                    if event.data_tokens is None
                    else f"{event.data_tokens / 1e6:.2f} M tokens in {event.files} files "
                )
                + f"({event.data}); trainer-side layers on {event.device}"
                + (f"; resuming at step {resumed}" if resumed else "")
            )
            self.progress.update(
                self.task, total=event.steps, completed=resumed or 0, status="first evaluation"
            )
        elif isinstance(event, TrainingProgressed):
            self.progress.update(
                self.task,
                completed=event.step,
                status=(
                    f"loss {loss_text(event.loss)}  {event.samples_per_s:.1f} samples/s  "
                    f"{event.volunteers} volunteers answering  "
                    f"versions {event.version_min}-{event.version_max}"
                    + (f"  {event.in_flight} in flight" if event.in_flight > 1 else "")
                    + (
                        f"  noise scale ~{event.noise_scale:.0f}"
                        if event.noise_scale is not None
                        else ""
                    )
                ),
            )
        elif isinstance(event, ExpertsNote):
            self.console.print(
                f"experts not learning: {event.note}" if event.note else "experts learning again"
            )
        elif isinstance(event, Waiting):
            self.progress.update(self.task, status="waiting for volunteers to serve the experts")
        elif isinstance(event, Evaluated):
            self.console.print(
                f"step {event.step}: validation loss {loss_text(event.loss)}"
                if not math.isnan(event.loss)
                else f"step {event.step}: not evaluated (too few volunteers answered)"
            )
        elif isinstance(event, TrainingSummary):
            self.progress.update(self.task, completed=event.steps)
            self.console.print(
                f"done: {event.steps} steps, {event.samples} samples, "
                f"{event.samples_per_s:.1f} samples/s; validation loss "
                f"{loss_text(event.initial_loss)} -> {loss_text(event.final_loss)}"
            )
            for agg in event.aggregators:
                if agg.unreachable is not None:
                    self.console.print(f"aggregator {agg.peer[-12:]}: {agg.unreachable}")
                    continue
                rejected = ", ".join(f"{k} {v}" for k, v in sorted(agg.rejected.items()))
                self.console.print(
                    f"aggregator {agg.peer[-12:]}: {agg.accepted} contributions accepted, "
                    f"rejected: {rejected or 'none'}; {agg.rounds} rounds"
                )
