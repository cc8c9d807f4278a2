"""What the trainer's choices cost in samples, without a swarm: the demo's model trained
in this process (experts local, ``LocalMixtureOfExperts``) on the same batches, once as
the reference (float32 on the wire, one batch at a time) and once per choice:

- ``--codecs raw/raw f16/bf16 q8/q8 q4/q4 q4/q3``: activations and their gradients
  through the codecs of ``[model.wire]`` (what the wire loses, gradients rounded at
  random as on the wire);
- ``--in-flight 1 2 3 4``: batches carried at once on replicas of the trainer-side
  layers (threads), with the session's weight prediction and staleness-aware rate.

    python benchmarks/trainer_local.py [--steps 200] [--codecs ...] [--in-flight ...]

Prints one JSON line per choice: the validation loss after the same number of samples
beside the reference's (run in the same process), their ratio, and for codecs the bytes
per value on the wire over float32's. Differences under ~1% are within one seed's noise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.demo import DemoOptions, demo_manifest
from core.experts import activations
from core.experts.activations import WireCodecs
from core.experts.registry import build_expert
from core.experts.spec import seed_for
from core.experts.uid import Grid
from core.families.mixtral import LocalGridMixture
from core.families.routing import GridGate
from core.project.manifest import ModelSection, TrainerOptimizerKind, load_manifest
from core.trainer.data import Corpus, load_corpus
from core.trainer.family import build_family_model
from core.trainer.model import LocalMixtureOfExperts, TrainerModel, build_model
from core.trainer.session import SessionSettings, TrainingSession


def demo_model(architecture: str = DemoOptions.architecture) -> tuple[ModelSection, int]:
    """The demo's model section and weights' seed (its default architecture: the one
    ``moehome demo`` and the emulated swarm train, on bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.toml"
        options = DemoOptions(architecture=architecture)
        path.write_text(demo_manifest(options, ("0" * 64, ""), "0" * 64))
        manifest = load_manifest(path)
    return manifest.model, manifest.weights.seed


def reference_model(m: ModelSection, seed: int, codecs: WireCodecs | None = None) -> TrainerModel:
    """The model a trainer of ``m`` trains, its experts local (the same initial weights
    as the published ones, the same routing): a Mixtral-family model for a family
    project, the byte model otherwise. ``codecs`` (the byte model's local mixtures
    alone emulate the wire) round activations and gradients as the wire would."""
    spec = m.expert_spec()
    if m.architecture != "byte":
        if codecs is not None:
            raise ValueError("wire codecs are emulated on the byte model only")

        def block(_layer: int, grid: Grid) -> nn.Module:
            experts = [build_expert(spec, seed=seed_for(seed, str(uid))) for uid in grid]
            return LocalGridMixture(
                GridGate(m.hidden, grid.shape), experts, m.k_best, beam_search=True
            )

        return build_family_model(m, block, seed=seed)
    return build_model(
        m,
        lambda _i, grid: LocalMixtureOfExperts(
            in_features=m.hidden,
            grid=grid,
            spec=spec,
            k_best=m.k_best,
            weights_seed=seed,
            codecs=codecs,
        ),
        seed=seed,
    )


def train(
    corpus: Corpus,
    steps: int,
    *,
    codecs: WireCodecs | None = None,
    in_flight: int = 1,
    eval_batches: int = 8,
    eval_every: int = 0,
    seed: int = 0,
    learning_rate: float | None = None,
    optimizer: TrainerOptimizerKind = "adamw",
    expert_learning_rate: float | None = None,
) -> dict[str, Any]:
    """The validation loss after ``steps`` batches; with ``eval_every``, also every that
    many steps (``curve``: [samples, loss] pairs, the start's included). ``seed`` draws
    the batches; the weights are the demo's whatever it is. The experts step with Adam
    at ``expert_learning_rate`` (default: the demo's rate), as the aggregators would."""
    m, weights_seed = demo_model("byte" if codecs is not None else DemoOptions.architecture)
    model = reference_model(m, weights_seed, codecs)
    options = DemoOptions()
    session = TrainingSession(
        model,
        corpus,
        SessionSettings(
            project="local",
            batch_size=options.batch_size,
            learning_rate=learning_rate or options.learning_rate,
            eval_batches=eval_batches,
            in_flight=in_flight,
            seed=seed,
            optimizer=optimizer,
            # the experts as the aggregators train them: Adam at the manifest's rate,
            # whatever the trainer's
            local_expert_rate=expert_learning_rate or options.learning_rate,
        ),
    )
    curve: list[list[float]] = []
    if eval_every:
        curve.append([0, session.evaluate()])
    started = time.perf_counter()
    free = list(range(in_flight))

    def carry(worker: int) -> int:
        session.step_on(worker)
        return worker

    if eval_every and in_flight > 1:
        raise ValueError("evaluations along the way: one batch at a time")

    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
        running: set[concurrent.futures.Future[int]] = set()
        begun = 0
        while True:
            while free and begun < steps:
                running.add(pool.submit(carry, free.pop()))
                begun += 1
            if not running:
                break
            done, running = concurrent.futures.wait(
                running, return_when=concurrent.futures.FIRST_COMPLETED
            )
            free.extend(f.result() for f in done)
            step = session.state.step
            if eval_every and step % eval_every == 0 and step < steps:
                curve.append([session.state.samples, session.evaluate()])
    loss = session.evaluate()
    if eval_every:
        curve.append([session.state.samples, loss])
    return {
        "loss": loss,
        "curve": curve,
        "steps": session.state.step,
        "stale_dropped": session.state.stale_steps,
        "staleness": {str(k): v for k, v in sorted(session.state.staleness.items())},
        "seconds": time.perf_counter() - started,
    }


def bytes_ratio(codecs: WireCodecs, hidden: int) -> float:
    """Bytes per value of the four tensors of an expert call (inputs, outputs and their
    gradients) over float32's, for a [256, hidden] batch of rows."""
    x = torch.randn(256, hidden)
    sent = sum(
        activations.wire_bytes(activations.encode(x, name))
        for name in (codecs.activations,) * 2 + (codecs.gradients,) * 2
    )
    return sent / (4 * 4 * x.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--codecs", nargs="*", default=["f16/bf16", "q8/q8", "q4/q4", "q4/q3"])
    parser.add_argument("--in-flight", nargs="*", type=int, default=[2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)  # several runs' threads share the machine's cores
    corpus = load_corpus()
    hidden = demo_model()[0].hidden
    reference = train(corpus, args.steps)

    def report(run: dict[str, Any], **choice: Any) -> None:
        line = {
            "benchmark": "trainer_local",
            **choice,
            "steps": args.steps,
            "reference_loss": round(reference["loss"], 4),
            "loss": round(run["loss"], 4),
            "loss_ratio": round(run["loss"] / reference["loss"], 4),
        }
        print(json.dumps(line), flush=True)

    for pair in args.codecs:
        codecs = WireCodecs(*pair.split("/"))
        run = train(corpus, args.steps, codecs=codecs)
        report(run, codecs=pair, bytes_ratio=round(bytes_ratio(codecs, hidden), 4))
    for n in args.in_flight:
        run = train(corpus, args.steps, in_flight=n)
        report(
            run,
            in_flight=n,
            staleness=run["staleness"],
            stale_dropped=run["stale_dropped"],
        )


if __name__ == "__main__":
    main()
