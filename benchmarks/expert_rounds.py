"""What the experts' rounds cost in samples to the same loss, and how far one run's
figure strays: the local emulation of one trainer carrying one batch at a time
(benchmarks/concurrency_local.py) with the experts stepping every batch (the reference,
what issue 41's guard compares a swarm with) and every 2, 4... batches (an aggregator's
round), over many seeds.

    python benchmarks/expert_rounds.py [--rounds 2 4] [--seeds 0 1 ... 15] [--lag 0]
                                       [--rate-scales 1 2] [--reference-rate-scale 0.5]
                                       [--momentum 0.9] [--beta1 0.9]

L* is the synchronous one-process reference's mean loss after ``--target-samples`` over
``--reference-seeds`` (swarm_scaling.py's, Muon at 1e-2: its recipe). Each seed's curve
gives its samples to L* (time_to_loss.samples_to_smoothed and the first crossing). One
JSON line per round size: the mean, standard deviation and range over the seeds, the
reference's (experts every batch) beside them, the ratio of the means (the guard that
rounds alone leave) and the mean of the per-seed ratios with its standard error;
``--rate-scales``: the experts' rate in rounds times each of these (one line each: a
round's mean gradient is of more samples than one batch's, so it may bear a larger step);
``--reference-rate-scale``: the reference's experts' rate (x the demo's 3e-3; 0.5 is
issue 41's tuned 1.5e-3), L*'s too. ``--momentum``: the rounds' experts step on a momentum of their
rounds, as the aggregators' robust rule keeps one per volunteer before their Adam (whose
first moment is ``--beta1``): the swarm's experts see two momenta, the reference's one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from concurrency_local import Arrangement, curve
from swarm_scaling import EVAL_BATCHES, reference_target
from time_to_loss import samples_to, samples_to_smoothed

from core.demo.options import DemoOptions
from core.trainer.data import STDLIB, load_corpus


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.mean(values), 1),
        "sd": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0,
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(16)))
    parser.add_argument("--lag", type=int, default=0, help="rounds the gradients land late")
    parser.add_argument("--rate-scales", type=float, nargs="+", default=[1.0])
    parser.add_argument("--reference-rate-scale", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.0, help="the robust rule's")
    parser.add_argument("--beta1", type=float, default=0.9, help="the rounds' Adam's")
    parser.add_argument("--samples", type=int, default=4400, help="each run's (past L*)")
    parser.add_argument("--target-samples", type=int, default=1600)
    parser.add_argument("--reference-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--optimizer", choices=["adamw", "muon"], default="muon")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the figures of one thread (the order of sums moves them ~1%)
    corpus = load_corpus(STDLIB)
    # L* at the reference's experts' rate, as swarm_scaling.py's --expert-rates sets it
    target, _ = reference_target(
        args.target_samples,
        args.reference_seeds,
        [args.lr],
        args.optimizer,
        args.eval_every,
        [DemoOptions.learning_rate * args.reference_rate_scale],
    )
    steps = args.samples // 16

    def reached(
        expert_round: int,
        lag: int,
        rate_scale: float,
        momentum: float = 0.0,
        beta1: float = 0.9,
    ) -> list[tuple[float | None, float | None]]:
        out = []
        for seed in args.seeds:
            c = curve(
                corpus,
                steps,
                Arrangement(1, 1),
                seed=seed,
                optimizer=args.optimizer,
                learning_rate=args.lr,
                eval_every=args.eval_every,
                eval_batches=EVAL_BATCHES,
                expert_round=expert_round,
                expert_lag=lag,
                expert_rate_scale=rate_scale,
                expert_momentum=momentum,
                expert_beta1=beta1,
            )
            out.append((samples_to_smoothed(c, target.loss), samples_to(c, target.loss)))
        return out

    reference = reached(1, 0, args.reference_rate_scale)
    for expert_round, rate_scale in [(r, x) for r in args.rounds for x in args.rate_scales]:
        got = reached(expert_round, args.lag, rate_scale, args.momentum, args.beta1)
        line: dict[str, Any] = {
            "benchmark": "expert_rounds",
            "expert_round": expert_round,
            "expert_lag": args.lag,
            "expert_rate_scale": rate_scale,
            "reference_rate_scale": args.reference_rate_scale,
            "momentum": args.momentum,
            "beta1": args.beta1,
            "seeds": args.seeds,
            "optimizer": args.optimizer,
            "learning_rate": args.lr,
            "target_loss": round(target.loss, 4),
            "target_samples": args.target_samples,
        }
        for i, name in ((0, "smoothed"), (1, "first_crossing")):
            pairs = [(r[i], g[i]) for r, g in zip(reference, got, strict=True)]
            if any(r is None or g is None for r, g in pairs):
                line[name] = None  # a seed never reached L* within --samples
                continue
            ref = [float(r) for r, _ in pairs]  # type: ignore[arg-type]
            rounds = [float(g) for _, g in pairs]  # type: ignore[arg-type]
            ratios = [r / g for r, g in zip(ref, rounds, strict=True)]
            line[name] = {
                "samples_to_target": spread(rounds),
                "reference_samples_to_target": spread(ref),
                "guard": round(statistics.mean(ref) / statistics.mean(rounds), 3),
                "guard_per_seed_mean": round(statistics.mean(ratios), 3),
                "guard_per_seed_se": round(
                    statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0,
                    3,
                ),
            }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
