"""Throughput of an emulated swarm against its capacity (core/demo/emulated.py): slow
volunteers behind slow links, all in this process, every part real but their hardware.

    python benchmarks/swarm_scaling.py [--volunteers 4 16] [--delay-ms 0 100]
                                       [--trainers 1] [--in-flight 4] [--samples 320]

Prints one JSON line per configuration: ``samples_per_s`` (all trainers, after the
first fifth of the samples), ``capacity_samples_per_s`` (the sum of the emulated
volunteers' speeds), ``utilization`` (their ratio), the calls that failed or came too
late, and the loss after the run beside the one-process reference trained on as many
samples (``loss``, ``reference_loss``, ``loss_ratio``; same initial weights, float32,
experts updated every step). With ``--trainers`` 2 or more, the trainers share their
trainer-side layers through the aggregator (core/trainer/trunk.py), and the loss is their
mean. Work in progress (issue 18): the summary line of the issue's goals is still to come.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmarks

from trainer_local import train

from core.demo.emulated import EmulationOptions, run_emulated
from core.trainer.data import STDLIB, load_corpus
from core.trainer.train import TrainerOptions


def run(options: EmulationOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="moehome-scaling-") as tmp:
        out = trio.run(run_emulated, options, Path(tmp))
    capacity = options.volunteers * options.samples_per_s
    summaries = out["trainers"]
    calls = [s["calls"] for s in summaries]
    loss = sum(s["final_loss"] for s in summaries) / len(summaries)
    # the trainers' evaluation: the same held-out batches (TrainerOptions' count)
    reference = train(
        load_corpus(STDLIB),
        options.samples // options.batch_size,
        eval_batches=TrainerOptions(project="", workdir=Path()).eval_batches,
    )["loss"]
    return {
        "volunteers": options.volunteers,
        "delay_ms": options.delay_ms,
        "upload_mbit": options.upload_mbit,
        "trainers": options.trainers,
        "in_flight": options.in_flight,
        "wire": options.wire,
        "samples": out["samples"],
        "samples_per_s": round(out["samples_per_s"], 3),
        "capacity_samples_per_s": capacity,
        "utilization": round(out["samples_per_s"] / capacity, 3),
        "failed_steps": sum(s["failed_steps"] for s in summaries),
        "failed_calls": sum(c["failed_calls"] for c in calls),
        "late_calls": sum(c["late_calls"] for c in calls),
        "expert_calls": sum(c["expert_calls"] for c in calls),
        "loss": round(loss, 4),
        "reference_loss": round(reference, 4),
        "loss_ratio": round(loss / reference, 4),
        "seconds": round(out["seconds"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--volunteers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 100.0])
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--speed", type=float, default=0.5, help="samples/s per volunteer")
    parser.add_argument("--upload-mbit", type=float, default=20.0)
    parser.add_argument("--wire", default="raw")
    parser.add_argument(
        "--announce-seconds",
        type=float,
        default=180.0,
        help="how often volunteers declare their experts (all of them share this CPU)",
    )
    parser.add_argument(
        "--volunteer-processes",
        type=int,
        default=2,
        help="processes hosting the volunteers (0: the benchmark's own)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    base = EmulationOptions(
        trainers=args.trainers,
        in_flight=args.in_flight,
        samples=args.samples,
        samples_per_s=args.speed,
        upload_mbit=args.upload_mbit,
        wire=args.wire,
        announce_seconds=args.announce_seconds,
        volunteer_processes=args.volunteer_processes,
    )
    for volunteers in args.volunteers:
        for delay in args.delay_ms:
            line = run(replace(base, volunteers=volunteers, delay_ms=delay))
            print(json.dumps({"benchmark": "swarm_scaling", **line}), flush=True)


if __name__ == "__main__":
    main()
