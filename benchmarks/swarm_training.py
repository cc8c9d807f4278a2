"""The swarm against one process: the demo's model trained by `moehome demo`'s local swarm
(every part its own process on 127.0.0.1), then the same model (same initial weights,
same data, same batches, same number of samples) trained in this process with its
experts local and updated every step.

    python benchmarks/swarm_training.py [--volunteers 4] [--steps 100]

Prints one JSON line: samples/s and the validation loss reached by both (``swarm_*``,
``local_*``), and the loss both started from. The swarm pays for the network, for
volunteers being separate processes on the same cores, and for experts that learn only
when an aggregator finishes a round; the local run pays for none of these.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.demo import DemoOptions, demo_manifest, run_demo
from core.project.manifest import load_manifest
from core.trainer.data import STDLIB, load_corpus
from core.trainer.model import LocalMixtureOfExperts, build_model
from core.trainer.session import SessionSettings, TrainingSession
from core.trainer.train import TrainerOptions


def local_run(options: DemoOptions, steps: int) -> dict[str, float]:
    """The demo's model, experts in this process, the trainer's settings."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.toml"
        path.write_text(demo_manifest(options, ("0" * 64, ""), "0" * 64))
        manifest = load_manifest(path)
    m = manifest.model
    spec = m.expert_spec()
    seed = manifest.weights.seed
    model = build_model(
        m,
        lambda _i, grid: LocalMixtureOfExperts(
            in_features=m.hidden, grid=grid, spec=spec, k_best=m.k_best, weights_seed=seed
        ),
        seed=seed,
    )
    trainer = TrainerOptions(project="local", workdir=Path("."))
    session = TrainingSession(
        model,
        load_corpus(STDLIB, max_bytes=trainer.max_data_bytes),
        SessionSettings(
            project="local",
            batch_size=options.batch_size,
            learning_rate=trainer.learning_rate,
            eval_batches=trainer.eval_batches,
            seed=trainer.seed,
        ),
    )
    initial = session.evaluate()
    started = time.perf_counter()
    for _ in range(steps):
        session.train_step()
    seconds = time.perf_counter() - started
    return {
        "initial_loss": initial,
        "loss": session.evaluate(),
        "sps": session.state.samples / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volunteers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    options = DemoOptions(volunteers=args.volunteers, steps=args.steps, eval_every=args.steps)
    swarm = trio.run(lambda: run_demo(options, quiet=True, handle_signals=False))
    local = local_run(options, args.steps)
    print(
        json.dumps(
            {
                "volunteers": args.volunteers,
                "steps": swarm["steps"],
                "samples": swarm["samples"],
                "tokens_per_sample": 64,
                "swarm_sps": round(swarm["samples_per_s"], 2),
                "local_sps": round(local["sps"], 2),
                "swarm_loss": round(swarm["final_loss"], 4),
                "local_loss": round(local["loss"], 4),
                "initial_loss": round(swarm["initial_loss"], 4),
                "local_initial_loss": round(local["initial_loss"], 4),
                "swarm_expert_versions": [swarm["version_min"], swarm["version_max"]],
                "swarm_failed_steps": swarm["failed_steps"],
                "contributions_accepted": swarm["contributions_accepted"],
            }
        )
    )


if __name__ == "__main__":
    main()
