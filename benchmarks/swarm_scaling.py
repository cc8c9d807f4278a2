"""Throughput of an emulated swarm against its capacity (core/demo/emulated.py): slow
volunteers behind slow links, every part real but their hardware; then the issue's
summary with the activation codec and the demo's slow-link ratio measured beside.

    python benchmarks/swarm_scaling.py [--runs V:MS:T:F ...] [--grid] [--samples N]
                                       [--speed 0.125] [--wire q4z] [--skip-local]
                                       [--skip-demo] [--slow N --slow-ms 250]
                                       [--target-samples 1600 --eval-every 10]
                                       [--optimizer muon] [--expert-rates 1.5e-3 3e-3]
                                       [--swarm-expert-rate 7.5e-4]

``--runs``: configurations as volunteers:delay_ms:trainers:in_flight (default: the
goals' sizes, 4, 16 and 32 volunteers at 100 ms); ``--grid``: every volunteers (4, 8,
16, 32) x delay (0, 100, 200) x trainers (1, 4) with ``in_flight_for``'s batches;
``--slow N``: the last N volunteers of each configuration sit ``--slow-ms`` away instead.

One JSON line per configuration: ``samples_per_s`` (all trainers, after the first fifth
of the samples), ``capacity_samples_per_s`` (the sum of the emulated volunteers'
speeds), ``utilization`` (their ratio); how much of the experts' work each trained
sample got (``expert_work_per_sample``: 1 when every call of its k experts in every
layer came back in time, forward and backward) and ``utilization_full``
(``utilization`` x that: calls answered after ``timeout_after_k_min`` are dropped with
their backward pass never asked for, so a saturated swarm can train more samples per
second than its capacity, each with fewer experts); ``busy`` (the volunteers' work over
their capacity, late calls' work included); the bytes of activations on the wire over
float32's; the loss after the run beside the one-process reference trained on as many
samples (same initial weights, float32, experts updated every step). With 2 or more
trainers, they share their trainer-side layers through the aggregator
(core/trainer/trunk.py), and the loss is their mean.

Time to the same loss (``--target-samples 1600``, issue 41): first the one-process
reference at each ``--reference-rates`` (and the experts' ``--expert-rates``: Adam, the
aggregators') over ``--reference-seeds`` (one ``reference`` line); L* is its mean
validation loss after the target's samples at its best rates, which the swarm's trainers
and aggregators then take. Each trainer evaluates every ``--eval-every`` steps, and
each configuration's line adds ``curve`` (samples, loss), ``samples_to_target``,
``sample_efficiency`` (the target's samples over those), ``scaling_efficiency``
(utilization x that), ``seconds_to_target``, and ``same_concurrency_efficiency``: the
local emulation of the same trainers x batches in flight
(benchmarks/concurrency_local.py, the same seeds and rate; with ``--ramp`` ramped by the
trainer's own policy on its own noise-scale estimate, as the swarm's trainers ramp) over
the swarm's samples to L*; the same figures follow by the ``smoothed`` crossing
(time_to_loss.samples_to_smoothed: a line through the evaluations around the first
crossing, less moved by one evaluation's noise). The summary's
``scaling_efficiency_{4,16,32}v``, ``time_to_loss_speedup_32v_vs_4v`` (8 x E32 / E4:
time to L* at the same speed per volunteer) and ``same_concurrency_efficiency_min`` come
from the 100 ms lines by the smoothed crossing, each recipe's runs averaged
(``first_crossing``: the same by the first crossings); ``--local-only`` prints the local
emulations for lines printed before they carried theirs (before stop 56 none; before
stop 58 a ramped run's was not ramped: ``--local-only --ramp`` lines replace it). A run
must train past L* for its figures (``--samples``); with ``--speed`` above the default,
runs end sooner and utilization is lower (a batch's latency weighs more against its
compute).

Then, unless skipped: ``local`` (benchmarks/trainer_local.py: the wire codec against
float32 on the same batches, in this process) and ``demo`` (``moehome demo --steps 40``
with every volunteer 100 ms late against no delay, alternated), and the summary line.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmarks

from concurrency_local import Arrangement
from concurrency_local import curve as local_curve
from time_to_loss import Curve, efficiency, loss_at, mean_curve, samples_to, samples_to_smoothed
from trainer_local import bytes_ratio, demo_model, train

from core.demo.emulated import EmulationOptions, run_emulated
from core.demo.options import DemoOptions, wire_codecs
from core.experts.activations import WireCodecs
from core.trainer.data import STDLIB, load_corpus
from core.trainer.train import TrainerOptions

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    volunteers: int
    delay_ms: float
    trainers: int
    in_flight: int

    @classmethod
    def parse(cls, text: str) -> Run:
        v, ms, t, f = text.split(":")
        return cls(int(v), float(ms), int(t), int(f))


def in_flight_for(volunteers: int, trainers: int) -> int:
    """Batches each trainer carries: about 3 for every 8 volunteers, all trainers
    together (enough to keep each volunteer's queue fed at 100-200 ms), at least 2."""
    return max(2, math.ceil(3 * volunteers / 8 / trainers))


def samples_for(run: Run, batch_size: int, least: int = 320) -> int:
    """Samples to train: ten times what the trainers carry at once, so that the
    measured window (after the first fifth) starts well after the pipeline filled
    (with 12 batches in flight and 320 samples, the completions of batches started
    together bunched at the end and 32 volunteers seemed to train 1.26x their
    capacity)."""
    return max(least, 10 * run.trainers * run.in_flight * batch_size)


GOALS = [Run(4, 100, 1, 2), Run(16, 100, 1, 3), Run(32, 100, 2, 3)]
#: the trainers' held-out batches (TrainerOptions' count): the references evaluate on them
EVAL_BATCHES = TrainerOptions(project="", workdir=Path()).eval_batches


@dataclass(frozen=True)
class Target:
    """L*: the synchronous one-process reference's validation loss after ``samples``
    (the mean of its seeds, at its best learning rates: the trainer's and the
    experts'), on the trainers' held-out batches."""

    loss: float
    samples: int
    learning_rate: float
    optimizer: str
    seeds: tuple[int, ...]
    eval_every: int
    #: the experts' (Adam, as the aggregators step them): the swarm's manifest takes it
    expert_learning_rate: float = DemoOptions.learning_rate


def reference_target(
    samples: int,
    seeds: list[int],
    rates: list[float],
    optimizer: str,
    eval_every: int,
    expert_rates: list[float] | None = None,
) -> tuple[Target, dict[str, Any]]:
    """The target and the line that says how it was found: every pair of the trainer's
    ``rates`` and the experts' ``expert_rates`` (default: the demo's) tried, the best
    pair's loss."""
    corpus = load_corpus(STDLIB)
    steps = samples // EmulationOptions.batch_size
    losses: dict[tuple[float, float], float] = {}
    curves: dict[tuple[float, float], list[tuple[float, float]]] = {}
    for rate in rates:
        for expert_rate in expert_rates or [DemoOptions.learning_rate]:
            runs = [
                train(
                    corpus,
                    steps,
                    eval_batches=EVAL_BATCHES,
                    eval_every=eval_every,
                    seed=seed,
                    learning_rate=rate,
                    optimizer=optimizer,  # type: ignore[arg-type]
                    expert_learning_rate=expert_rate,
                )["curve"]
                for seed in seeds
            ]
            pair = (rate, expert_rate)
            curves[pair] = mean_curve([[(a, b) for a, b in c] for c in runs])
            losses[pair] = loss_at(curves[pair], samples)
    best = min(losses, key=lambda pair: losses[pair])
    target = Target(losses[best], samples, best[0], optimizer, tuple(seeds), eval_every, best[1])
    line = {
        "target_loss": round(target.loss, 4),
        "target_samples": samples,
        "optimizer": optimizer,
        "learning_rate": best[0],
        "expert_learning_rate": best[1],
        # the trainer's rates at the best experts' rate, and the experts' at the best
        # trainer's (the lines before stop 58: the first only, the experts at 3e-3)
        "losses_by_learning_rate": {
            str(r): round(v, 4) for (r, e), v in losses.items() if e == best[1]
        },
        "losses_by_expert_learning_rate": {
            str(e): round(v, 4) for (r, e), v in losses.items() if r == best[0]
        },
        "seeds": seeds,
        "curve": _printed(curves[best]),
    }
    return target, line


def swarm_curve(
    evaluations: list[tuple[int, int, float, float]], trainers: int, batch_size: int
) -> list[tuple[float, float]]:
    """The trainers' evaluations as one curve: a trainer's step s stands for s x
    trainers batches of the whole swarm; the trainers' losses at one step averaged,
    of each trainer its last evaluation at that step (the final one, after the experts'
    round, comes after the periodic one)."""
    last: dict[tuple[int, int], float] = {}
    for trainer, step, loss, _ in evaluations:
        last[(trainer, step)] = loss
    by_step: dict[int, list[float]] = {}
    for (_, step), loss in sorted(last.items(), key=lambda kv: kv[0][1]):
        by_step.setdefault(step, []).append(loss)
    return [
        (step * trainers * batch_size, sum(v) / len(v))
        for step, v in sorted(by_step.items())
        if len(v) == trainers and all(math.isfinite(x) for x in v)
    ]


def local_same_concurrency(
    trainers: int,
    in_flight: int,
    target: Target,
    samples: float,
    batch_size: int,
    ramp: bool = False,
) -> list[tuple[float, float]]:
    """The local emulation of ``trainers`` x ``in_flight`` batches in flight
    (benchmarks/concurrency_local.py: the target's seeds, rate and evaluations), the mean
    of its seeds' curves over twice ``samples`` (it may need more than the swarm did);
    ``ramp``: from one batch up to ``in_flight`` as the trainer's policy says, as the
    swarm's ``--ramp`` runs carry them."""
    corpus = load_corpus(STDLIB)
    steps = 2 * int(max(samples, target.samples)) // batch_size
    return mean_curve(
        [
            local_curve(
                corpus,
                steps,
                Arrangement(trainers, in_flight),
                seed=seed,
                optimizer=target.optimizer,  # type: ignore[arg-type]
                learning_rate=target.learning_rate,
                eval_every=target.eval_every,
                eval_batches=EVAL_BATCHES,
                ramp=ramp,
                expert_rate_scale=target.expert_learning_rate / DemoOptions.learning_rate,
            )
            for seed in target.seeds
        ]
    )


def time_to_target(
    options: EmulationOptions, target: Target, curve: list[tuple[float, float]], rate: float
) -> dict[str, Any]:
    """The swarm's samples and seconds to L*, its sample and scaling efficiency, and
    the same-concurrency guard: the local emulation of its trainers x batches in flight
    against the swarm; the first crossings of L*, then (``smoothed``) ``scores``'."""
    capacity = options.volunteers * options.samples_per_s
    needed = samples_to(curve, target.loss)
    sample_eff = efficiency(target.samples, needed)
    local = local_same_concurrency(
        options.trainers,
        options.in_flight,
        target,
        curve[-1][0],
        options.batch_size,
        ramp=options.ramp,
    )
    local_needed = samples_to(local, target.loss)
    line = {
        "target_loss": round(target.loss, 4),
        "target_samples": target.samples,
        "curve": _printed(curve),
        "samples_to_target": None if needed is None else round(needed, 1),
        "seconds_to_target": None if needed is None else round(needed / rate, 1),
        "sample_efficiency": _round(sample_eff),
        "scaling_efficiency": _round(None if sample_eff is None else rate / capacity * sample_eff),
        "local_same_concurrency_samples_to_target": (
            None if local_needed is None else round(local_needed, 1)
        ),
        # the swarm against the local emulation of the same concurrency: what the
        # swarm itself adds (rounds, late and dropped calls, the wire)
        "same_concurrency_efficiency": _round(guard(needed, local_needed)),
        "local_same_concurrency_curve": _printed(local),
        # its experts' rate: the reference's best (the swarm's may differ, --swarm-expert-rate)
        "local_same_concurrency_expert_learning_rate": target.expert_learning_rate,
        # the local emulation ramped as the swarm did (lines before stop 58 did not)
        "local_same_concurrency_ramp": options.ramp,
    }
    return {**line, **scores({**line, "utilization": rate / capacity}, local)}


def guard(needed: float | None, local_needed: float | None) -> float | None:
    """The same-concurrency guard: the local emulation's samples to L* over the swarm's
    (None when either never reached it)."""
    return None if needed is None or local_needed is None else local_needed / needed


def scores(line: dict[str, Any], local: Curve | None) -> dict[str, Any]:
    """A line's figures by the smoothed crossing of L* (time_to_loss.samples_to_smoothed)
    of its curve and of the local emulation's (``local``; None: unknown)."""
    target, target_samples = line["target_loss"], line["target_samples"]
    needed = samples_to_smoothed(line["curve"], target)
    local_needed = None if local is None else samples_to_smoothed(local, target)
    sample_eff = efficiency(target_samples, needed)
    return {
        "samples_to_target_smoothed": None if needed is None else round(needed, 1),
        "sample_efficiency_smoothed": _round(sample_eff),
        "scaling_efficiency_smoothed": _round(
            None if sample_eff is None else line["utilization"] * sample_eff
        ),
        "local_same_concurrency_samples_to_target_smoothed": (
            None if local_needed is None else round(local_needed, 1)
        ),
        "same_concurrency_efficiency_smoothed": _round(guard(needed, local_needed)),
    }


def _printed(curve: Curve) -> list[list[float]]:
    """A curve as the lines print it: whole samples, losses to 4 places."""
    return [[int(a), round(b, 4)] for a, b in curve]


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def batch_seconds(calls: list[dict[str, Any]], compute_s: float) -> dict[str, Any]:
    """Where a training batch's time went, per applied step (all trainers): its whole
    time (``batch_s``), what it waited on the swarm (``batch_wait_s``: finding servers,
    forward calls, backward calls, summed over the mixture layers; late and dropped
    batches' waits included, rare), the rest (``batch_trainer_s``: the trainer's own
    layers, its optimizer, the hops between its threads and the event loop) and, for
    scale, ``batch_compute_s``: the experts' work of one batch with every volunteer on
    it at once (its samples over the capacity). Empty for lines before stop 64."""
    steps = sum(c.get("steps", 0) for c in calls)
    if not steps:
        return {}
    total = sum(c["step_s"] for c in calls) / steps
    wait = {k: sum(c[f"{k}_s"] for c in calls) / steps for k in ("plan", "forward", "backward")}
    return {
        "batch_s": round(total, 3),
        "batch_wait_s": {k: round(v, 3) for k, v in wait.items()},
        "batch_trainer_s": round(total - sum(wait.values()), 3),
        "batch_compute_s": round(compute_s, 3),
    }


def measure(options: EmulationOptions, target: Target | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="moehome-scaling-") as tmp:
        out = trio.run(run_emulated, options, Path(tmp))
    capacity = options.volunteers * options.samples_per_s
    summaries = out["trainers"]
    calls = [s["calls"] for s in summaries]
    loss = sum(s["final_loss"] for s in summaries) / len(summaries)
    reference = train(
        load_corpus(STDLIB),
        options.samples // options.batch_size,
        eval_batches=EVAL_BATCHES,
        learning_rate=options.trainer_learning_rate,
        optimizer=options.demo.trainer_optimizer,  # type: ignore[arg-type]
        # the reference's experts at its own best rate (the swarm's may be set apart)
        expert_learning_rate=(
            options.demo.learning_rate if target is None else target.expert_learning_rate
        ),
    )["loss"]
    forward, late, backward = (
        sum(c[key] for c in calls) for key in ("forward_rows", "late_rows", "backward_rows")
    )
    # a token's row through an expert costs 1 forward, 2 backward (the emulation's
    # rule); every token of a sample asks k_best experts in each mixture layer
    full = out["samples"] * options.rows_per_sample() * 3
    utilization = out["samples_per_s"] / capacity
    used = (forward + 2 * backward) / full
    wire_ratio = max(c["activation_bytes_ratio"] for c in calls)
    reached: dict[str, Any] = {}
    if target is not None:
        curve = swarm_curve(out["evaluations"], options.trainers, options.batch_size)
        reached = time_to_target(options, target, curve, out["samples_per_s"])
    return {
        "volunteers": options.volunteers,
        "delay_ms": options.delay_ms,
        "speed": options.samples_per_s,
        "optimizer": options.demo.trainer_optimizer,
        "learning_rate": options.trainer_learning_rate or options.demo.learning_rate,
        "expert_learning_rate": options.demo.learning_rate,
        "slow": options.slow,
        "slow_delay_ms": options.slow_delay_ms,
        "upload_mbit": options.upload_mbit,
        "round_samples": options.round_samples,
        "seed": options.seed,
        "trainers": options.trainers,
        "in_flight": options.in_flight,
        "ramp": options.ramp,
        "in_flight_reached": max(s["in_flight_reached"] for s in summaries),
        "in_flight_end": max(s["in_flight_end"] for s in summaries),
        "in_flight_mean": round(sum(s["in_flight_mean"] for s in summaries) / len(summaries), 2),
        "wire": options.wire,
        "rule": options.demo.rule,
        "trunk_momentum": options.demo.trunk_outer_momentum,
        "samples": out["samples"],
        "samples_per_s": round(out["samples_per_s"], 3),
        "capacity_samples_per_s": capacity,
        "utilization": round(utilization, 3),
        "expert_work_per_sample": round(used, 3),
        "utilization_full": round(utilization * used, 3),
        "busy": round(utilization * (forward + late + 2 * backward) / full, 3),
        "late_calls": sum(c["late_calls"] for c in calls),
        "expert_calls": sum(c["expert_calls"] for c in calls),
        "late_row_share": round(late / max(forward + late, 1), 4),
        "failed_calls": sum(c["failed_calls"] for c in calls),
        "failed_steps": sum(s["failed_steps"] for s in summaries),
        "activation_bytes_ratio": round(wire_ratio, 4),
        **batch_seconds(calls, options.batch_size / capacity),
        "loss": round(loss, 4),
        # the final evaluation came after every expert's round following the last step
        "final_round_applied": all((s["final_round"] or {}).get("applied") for s in summaries),
        # when not: the experts still behind and how long the wait took (with every
        # expert in time, the trunk's last change was what did not settle)
        "final_round_behind": sum(
            len((s["final_round"] or {}).get("behind", ())) for s in summaries
        ),
        "final_round_s": max(
            round((s["final_round"] or {}).get("seconds", 0.0), 1) for s in summaries
        ),
        # sequences carried at once, all trainers, over the gradient noise scale at the
        # end (the critical batch's order): above 1, concurrency costs samples
        "noise_scale": _mean([s["noise_scale"] for s in summaries]),
        "in_flight_over_noise_scale": _ratio(
            options.trainers * options.in_flight * options.batch_size,
            _mean([s["noise_scale"] for s in summaries]),
        ),
        # how late the experts' contributions landed (the aggregators' own account):
        # versions old at their round, seconds since signed, seconds at the aggregator
        **expert_lateness(summaries[0].get("aggregators", [])),
        "reference_loss": round(reference, 4),
        "loss_ratio": round(loss / reference, 4),
        "seconds": round(out["seconds"], 1),
        # what the DHT cost, per volunteer and second (and per other peer): requests
        # sent and answered, and the volunteers' own gets and puts by namespace
        "dht": out["dht"],
        **reached,
    }


def expert_lateness(accounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The aggregators' lateness figures (AggregatorReport), weighted by the
    contributions each applied."""
    counted = [(int(sum(a.get("lateness") or [])), a) for a in accounts]
    total: int = sum(n for n, _ in counted)
    if total == 0:
        return {"expert_versions_late": None, "contribution_age_s": None, "round_wait_s": None}

    def mean(key: str, digits: int) -> float:
        return round(sum(n * float(a[key]) for n, a in counted if n) / total, digits)

    return {
        "expert_versions_late": mean("mean_versions_late", 3),
        "contribution_age_s": mean("mean_age_s", 1),
        "round_wait_s": mean("mean_round_wait_s", 1),
    }


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


def _ratio(a: float, b: float | None) -> float | None:
    return round(a / b, 3) if b else None


def local_codec(wire: str, steps: int) -> dict[str, Any]:
    """The codec against float32 on the same batches, experts local (no swarm noise)."""
    corpus = load_corpus(STDLIB)
    codecs = WireCodecs(*wire_codecs(wire))
    reference = train(corpus, steps)["loss"]
    loss = train(corpus, steps, codecs=codecs)["loss"]
    return {
        "wire": wire,
        "steps": steps,
        "bytes_ratio": round(bytes_ratio(codecs, demo_model()[0].hidden), 4),
        "loss": round(loss, 4),
        "reference_loss": round(reference, 4),
        "loss_ratio": round(loss / reference, 4),
    }


def demo_rate(slow: bool, steps: int) -> float:
    rate: float = demo_run(slow, steps)["samples_per_s"]
    return rate


def demo_delay(pairs: int, steps: int) -> dict[str, Any]:
    """``moehome demo`` (its defaults, 4 volunteers) with every volunteer 100 ms late
    against none, alternated pair by pair on this noisy machine."""
    fast, slow = [], []
    for _ in range(pairs):
        fast.append(demo_rate(False, steps))
        slow.append(demo_rate(True, steps))
    return {
        "steps": steps,
        "samples_per_s": [round(r, 2) for r in fast],
        "samples_per_s_100ms": [round(r, 2) for r in slow],
        "ratio": round(sum(slow) / sum(fast), 3),
    }


def demo_run(
    slow: bool,
    steps: int,
    in_flight: int | None = None,
    eval_every: int | None = None,
    optimizer: str | None = None,
) -> Any:
    """``moehome demo``'s summary (its defaults but for what is given, 4 volunteers;
    ``slow``: every one 100 ms late)."""
    command = [sys.executable, "-m", "core.cli", "demo", "--steps", str(steps), "--json"]
    for flag, value in (
        ("--in-flight", in_flight),
        ("--eval-every", eval_every),
        ("--trainer-optimizer", optimizer),
    ):
        if value is not None:
            command += [flag, str(value)]
    if slow:
        command += ["--slow", "4", "--slow-ms", "100"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def demo_seconds_to(run: dict[str, Any], target: float) -> float | None:
    """Seconds of training a demo run needed to reach ``target``: its samples to it
    (its evaluations' curve) at its rate."""
    batch = run["samples"] / max(run["steps"], 1)
    curve = [(step * batch, loss) for step, loss in run["evaluations"]]
    needed = samples_to(curve, target)
    return None if needed is None else needed / run["samples_per_s"]


def demo_time_to_loss(
    steps: int, slow_steps: int, in_flights: list[int], eval_every: int, optimizer: str
) -> dict[str, Any]:
    """The demo's time to the same loss, every volunteer 100 ms late against none, each
    at its best batches in flight: L is the no-delay demo's loss after ``steps`` at its
    best setting; the late demo trains up to ``slow_steps`` to reach it."""
    fast = {f: demo_run(False, steps, f, eval_every, optimizer) for f in in_flights}
    target = min(run["final_loss"] for run in fast.values())
    fast_s = {f: demo_seconds_to(run, target) for f, run in fast.items()}
    slow = {f: demo_run(True, slow_steps, f, eval_every, optimizer) for f in in_flights}
    slow_s = {f: demo_seconds_to(run, target) for f, run in slow.items()}
    best_fast = min(s for s in fast_s.values() if s is not None)
    reached = [s for s in slow_s.values() if s is not None]
    return {
        "steps": steps,
        "slow_steps": slow_steps,
        "optimizer": optimizer,
        "target_loss": round(target, 4),
        "seconds_to_target": {str(f): _round(s) for f, s in fast_s.items()},
        "seconds_to_target_100ms": {str(f): _round(s) for f, s in slow_s.items()},
        "samples_per_s": {str(f): round(r["samples_per_s"], 2) for f, r in fast.items()},
        "samples_per_s_100ms": {str(f): round(r["samples_per_s"], 2) for f, r in slow.items()},
        "final_loss": {str(f): round(r["final_loss"], 4) for f, r in fast.items()},
        "final_loss_100ms": {str(f): round(r["final_loss"], 4) for f, r in slow.items()},
        "ratio": round(best_fast / min(reached), 3) if reached else None,
    }


def summary(
    lines: list[dict[str, Any]],
    local: dict[str, Any] | None,
    demo: dict[str, Any] | None,
    local_curves: dict[str, Curve] | None = None,
) -> dict[str, Any]:
    def best(volunteers: int, delay: float) -> dict[str, Any] | None:
        runs = [x for x in lines if (x["volunteers"], x["delay_ms"]) == (volunteers, delay)]
        return max(runs, key=lambda x: x["samples_per_s"], default=None)

    out: dict[str, Any] = {"benchmark": "swarm_scaling", "summary": True}
    at_16 = best(16, 100.0)
    if at_16 is not None:
        out["utilization_16v_100ms"] = at_16["utilization"]
        out["utilization_full_16v_100ms"] = at_16["utilization_full"]
    for delay in (100.0, 0.0, 200.0):
        small, large = best(4, delay), best(32, delay)
        if small is not None and large is not None:
            out["speedup_32v_vs_4v"] = round(large["samples_per_s"] / small["samples_per_s"], 2)
            out["speedup_delay_ms"] = delay
            break
    if lines:
        out["max_loss_ratio"] = max(x["loss_ratio"] for x in lines)
        out["swarm_activation_bytes_ratio"] = max(x["activation_bytes_ratio"] for x in lines)
    if local is not None:
        # bytes as the swarm sent them (deflated codes depend on the data); else the local
        out["activation_bytes_ratio"] = out.get(
            "swarm_activation_bytes_ratio", local["bytes_ratio"]
        )
        out["activation_loss_ratio"] = local["loss_ratio"]
    if demo is not None and "samples_per_s_100ms" in demo and "target_loss" not in demo:
        out["demo_delay_ratio"] = demo["ratio"]
    if demo is not None and "target_loss" in demo:
        out["demo_time_to_loss_ratio_100ms"] = demo["ratio"]
    out.update(time_to_loss_summary(lines, local_curves))
    return out


#: what makes lines runs of one recipe, whose figures are averaged (each key with its
#: value in the lines printed before the line carried it)
RECIPE = (
    ("volunteers", None),
    ("delay_ms", None),
    ("speed", None),
    ("trainers", 1),
    ("in_flight", 1),
    ("ramp", False),
    ("round_samples", 64.0),
    ("optimizer", "adamw"),
    ("learning_rate", None),
    ("expert_learning_rate", DemoOptions.learning_rate),
    ("upload_mbit", 20.0),
    ("wire", "q4z"),
    ("rule", "centered_clip"),
    ("slow", 0),
)


def recipe_of(line: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(line.get(key, default) for key, default in RECIPE)


def local_key(
    trainers: int,
    in_flight: int,
    optimizer: str,
    rate: float,
    ramp: bool = False,
    expert_rate: float = DemoOptions.learning_rate,
) -> str:
    """Which local emulation a line's guard compares with (its seeds and evaluations
    are the target's, the same for every line of a summary)."""
    experts = "" if expert_rate == DemoOptions.learning_rate else f":experts {expert_rate:g}"
    return f"{trainers}x{in_flight}:{optimizer}:{rate:g}" + (":ramp" if ramp else "") + experts


def local_key_of(line: dict[str, Any], ramp: bool | None = None) -> str:
    """``local_key`` of the concurrency a line names (a swarm line's, or a
    ``--local-only`` line's: the same fields); ``ramp``: the line's own unless given."""
    return local_key(
        line["trainers"],
        line["in_flight"],
        line["optimizer"],
        line["learning_rate"],
        bool(line.get("ramp", False)) if ramp is None else ramp,
        line.get("expert_learning_rate", DemoOptions.learning_rate),
    )


def local_curve_of(line: dict[str, Any], curves: dict[str, Curve]) -> tuple[Curve | None, bool]:
    """The local emulation a line's guard compares with, and whether the guard the line
    printed was of it. A line's run emulated its concurrency (ramped since stop 58):
    that emulation is its own curve, or for a line that does not carry one, ``curves``'
    of the same (deterministic) emulation. But a line that ramped while its emulation did
    not (the lines before stop 58) takes ``curves``' ramped one where given."""
    emulated_ramp = bool(line.get("local_same_concurrency_ramp", False))
    ramped = local_key_of(line)
    if bool(line.get("ramp", False)) != emulated_ramp and ramped in curves:
        return curves[ramped], False
    own = line.get("local_same_concurrency_curve")
    return own or curves.get(local_key_of(line, ramp=emulated_ramp)), True


def _recipe_means(
    lines: list[dict[str, Any]], figures: Any
) -> list[tuple[dict[str, Any], float | None, float | None, int]]:
    """(a line of the recipe, mean scaling efficiency, mean guard, runs) per recipe;
    a mean is None when a run did not reach L*."""
    by_recipe: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for x in lines:
        by_recipe.setdefault(recipe_of(x), []).append(x)
    out = []
    for runs in by_recipe.values():
        got = [figures(x) for x in runs]
        es, guards = [e for e, _ in got], [g for _, g in got]
        out.append((runs[0], _mean_known(es), _mean_known(guards), len(runs)))
    return out


def _mean_known(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else round(sum(values) / len(values), 3)  # type: ignore[arg-type]


def _efficiency_keys(lines: list[dict[str, Any]], figures: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    best: dict[int, tuple[float | None, float | None, int]] = {}
    recipes = _recipe_means(lines, figures)
    for line, e, guard, runs in recipes:
        v = line["volunteers"]
        if v not in best or (e or 0) > (best[v][0] or 0):
            best[v] = (e, guard, runs)
    for v in (4, 16, 32):
        if v in best:
            out[f"scaling_efficiency_{v}v"] = best[v][0]
            out[f"runs_{v}v"] = best[v][2]
    if 4 in best and 32 in best:
        # time to L* is target_samples / (E x capacity): at the same speed per volunteer
        # the ratio is 8 x E32 / E4, whatever speed each run emulated (faster emulated
        # volunteers, for runs long enough to reach L*, lower E: the ratio is then an
        # estimate of both)
        small, large = best[4][0], best[32][0]
        out["time_to_loss_speedup_32v_vs_4v"] = (
            round(32 * large / (4 * small), 2) if small and large is not None else None
        )
    if recipes:
        # the guard of the recipes the efficiencies are of, and of every recipe tried
        out["same_concurrency_efficiency_min"] = _min_known([g for _, g, _ in best.values()])
        out["same_concurrency_efficiency_min_all"] = _min_known([g for _, _, g, _ in recipes])
    return out


def _min_known(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else min(values)  # type: ignore[type-var]


def time_to_loss_summary(
    lines: list[dict[str, Any]], local_curves: dict[str, Curve] | None = None
) -> dict[str, Any]:
    """The issue's time-to-loss keys, of the 100 ms lines that measured them: each
    recipe's figures are the mean of its runs (one run cannot decide a goal within 15%:
    decision 013); per size, the recipe with the best scaling efficiency; the guard's
    minimum over those recipes (``_all``: over every recipe). By the smoothed crossing
    of L* (``scores``; a line's local emulation is its own curve, or ``local_curves``'
    of its concurrency), and under ``first_crossing`` by the figures the lines carry."""
    measured = [x for x in lines if "scaling_efficiency" in x and x["delay_ms"] == 100.0]
    curves = local_curves or {}

    def smoothed(x: dict[str, Any]) -> tuple[float | None, float | None]:
        local, _ = local_curve_of(x, curves)
        got = scores(x, local)
        return got["scaling_efficiency_smoothed"], got["same_concurrency_efficiency_smoothed"]

    def first(x: dict[str, Any]) -> tuple[float | None, float | None]:
        local, printed = local_curve_of(x, curves)
        if printed or local is None:
            return x["scaling_efficiency"], x["same_concurrency_efficiency"]
        needed = samples_to(x["curve"], x["target_loss"])
        return x["scaling_efficiency"], _round(guard(needed, samples_to(local, x["target_loss"])))

    out: dict[str, Any] = {}
    if not measured:
        return out
    out.update(_efficiency_keys(measured, smoothed))
    out["estimator"] = "smoothed crossing"
    out["first_crossing"] = _efficiency_keys(measured, first)
    out["target_loss"] = measured[0]["target_loss"]
    out["target_samples"] = measured[0]["target_samples"]
    return out


def recipe_condition(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--where``: a RECIPE key, and its value as the lines carry it
    (a number where the key's values are numbers)."""
    key, sep, value = text.partition("=")
    kinds = dict(RECIPE)
    if not sep or key not in kinds:
        raise argparse.ArgumentTypeError(
            f"{text!r}: KEY=VALUE with KEY one of {', '.join(k for k, _ in RECIPE)}"
        )
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    try:
        return key, float(value)
    except ValueError:
        return key, value


def of_recipe(line: dict[str, Any], where: list[tuple[str, Any]]) -> bool:
    """Whether a line's recipe has every ``KEY=VALUE`` of ``where`` (a key the line does
    not carry has its RECIPE default)."""
    defaults = dict(RECIPE)
    return all(line.get(key, defaults[key]) == value for key, value in where)


def summarize(paths: list[Path], where: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """The summary of lines this benchmark printed before (runs made apart: a run of
    every size takes most of an hour on two cores), and of ``local_same_concurrency``
    lines (``--local-only``) for swarm lines that do not carry their local curve;
    ``where``: only the swarm lines of recipes with these values (``--where``)."""
    lines, local, demo = [], None, None
    local_curves: dict[str, Curve] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            if not text.startswith("{"):
                continue
            line = json.loads(text)
            if line.get("benchmark") != "swarm_scaling" or line.get("summary"):
                continue
            if "volunteers" in line and of_recipe(line, where or []):
                lines.append(line)
            if "local_same_concurrency" in line:
                x = line["local_same_concurrency"]
                local_curves[local_key_of(x)] = [(a, b) for a, b in x["curve"]]
            local = line.get("local", local)
            demo = line.get("demo", demo)
    return summary(lines, local, demo, local_curves)


def print_local_curves(
    runs: list[Run], target: Target, samples: int, batch_size: int, ramp: bool = False
) -> None:
    """``--local-only``: a line of each run's concurrency's local emulation."""
    for trainers, in_flight in sorted({(r.trainers, r.in_flight) for r in runs}):
        local = local_same_concurrency(trainers, in_flight, target, samples, batch_size, ramp)
        line = {
            "trainers": trainers,
            "in_flight": in_flight,
            "ramp": ramp,
            "optimizer": target.optimizer,
            "learning_rate": target.learning_rate,
            "expert_learning_rate": target.expert_learning_rate,
            "seeds": list(target.seeds),
            "eval_every": target.eval_every,
            "samples_to_target": _round(samples_to(local, target.loss)),
            "curve": _printed(local),
        }
        print(json.dumps({"benchmark": "swarm_scaling", "local_same_concurrency": line}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Run.parse, nargs="*", default=None)
    parser.add_argument("--grid", action="store_true")
    parser.add_argument(
        "--samples", type=int, default=None, help="default: samples_for each configuration"
    )
    parser.add_argument("--speed", type=float, default=0.125, help="samples/s per volunteer")
    parser.add_argument("--upload-mbit", type=float, default=20.0)
    parser.add_argument("--wire", default="q4z")
    parser.add_argument("--round-samples", type=float, default=64.0)
    parser.add_argument(
        "--seed",
        type=int,
        default=EmulationOptions.seed,
        help="the trainers' batches (trainer i draws with seed + i): runs of one recipe at "
        "several seeds, averaged by --summarize, as the reference's seeds are",
    )
    parser.add_argument(
        "--ramp",
        action="store_true",
        help="each trainer starts with one batch in flight and carries more, up to the "
        "configuration's, as the gradient noise scale grows",
    )
    parser.add_argument(
        "--slow",
        type=int,
        default=0,
        help="the last this many volunteers sit behind a longer link (--slow-ms)",
    )
    parser.add_argument("--slow-ms", type=float, default=EmulationOptions.slow_delay_ms)
    parser.add_argument("--rule", default="centered_clip", help="the aggregators' rule")
    parser.add_argument(
        "--trunk-momentum",
        type=float,
        default=DemoOptions.trunk_outer_momentum,
        help="the outer momentum of the shared trunk (several trainers)",
    )
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
    parser.add_argument(
        "--target-samples",
        type=int,
        default=0,
        help="time to the same loss: L* is the one-process reference's loss after this "
        "many samples (issue 41: 1600); the trainers evaluate every --eval-every steps "
        "and each line says when they reached L* (0: not measured)",
    )
    parser.add_argument("--eval-every", type=int, default=10, help="trainer steps")
    parser.add_argument("--reference-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--reference-rates",
        type=float,
        nargs="+",
        default=[1e-3, 3e-3, 1e-2],
        help="the reference's learning rates tried; the swarm's trainers take the best",
    )
    parser.add_argument(
        "--expert-rates",
        type=float,
        nargs="+",
        default=[DemoOptions.learning_rate],
        help="the experts' rates (Adam) the reference tries beside each of --reference-rates; "
        "the swarm's aggregators take the best pair's (the demo's 3e-3 was never tuned)",
    )
    parser.add_argument(
        "--swarm-expert-rate",
        type=float,
        default=None,
        help="the aggregators' rate for the experts (the manifest's) instead of the "
        "reference's best: the robust rule's per-volunteer momentum comes before their Adam, "
        "which the reference's experts lack (the local emulation stays at the reference's)",
    )
    parser.add_argument(
        "--optimizer",
        choices=["adamw", "muon"],
        default="adamw",
        help="the trainer-side layers' ([training] trainer_optimizer), the reference's too",
    )
    parser.add_argument("--local-steps", type=int, default=200)
    parser.add_argument("--demo-pairs", type=int, default=2)
    parser.add_argument(
        "--demo-time-to-loss",
        action="store_true",
        help="the demo's time to the no-delay demo's step-200 loss, 100 ms against none, "
        "each at its best of --demo-in-flight (instead of its rate)",
    )
    parser.add_argument("--demo-in-flight", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument(
        "--local-only",
        action="store_true",
        help="with --target-samples: print the local emulation of each run's trainers x "
        "batches in flight (the guard's comparison, for lines that do not carry it) and stop",
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        help="print the summary of these files' lines (earlier runs' output) and stop",
    )
    parser.add_argument(
        "--where",
        type=recipe_condition,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="with --summarize: only the runs of recipes with these values (e.g. "
        "expert_learning_rate=1.5e-3: one recipe's summary beside the others')",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.summarize:
        print(json.dumps(summarize(args.summarize, args.where)), flush=True)
        return
    runs = args.runs if args.runs is not None else GOALS
    if args.grid:
        runs = [
            Run(v, ms, t, in_flight_for(v, t))
            for v in (4, 8, 16, 32)
            for ms in (0.0, 100.0, 200.0)
            for t in (1, 4)
        ]
    base = EmulationOptions(
        samples_per_s=args.speed,
        upload_mbit=args.upload_mbit,
        wire=args.wire,
        round_samples=args.round_samples,
        seed=args.seed,
        ramp=args.ramp,
        slow=args.slow,
        slow_delay_ms=args.slow_ms,
        announce_seconds=args.announce_seconds,
        volunteer_processes=args.volunteer_processes,
        demo=DemoOptions(
            rule=args.rule,
            trunk_outer_momentum=args.trunk_momentum,
            trainer_optimizer=args.optimizer,
        ),
    )
    target = None
    if args.target_samples:
        target, reference = reference_target(
            args.target_samples,
            args.reference_seeds,
            args.reference_rates,
            args.optimizer,
            args.eval_every,
            args.expert_rates,
        )
        print(json.dumps({"benchmark": "swarm_scaling", "reference": reference}), flush=True)
        base = replace(
            base,
            eval_every=args.eval_every,
            trainer_learning_rate=target.learning_rate,
            # the aggregators' rate for the experts (the manifest's): the reference's best
            # unless the swarm's own is given
            demo=replace(
                base.demo, learning_rate=args.swarm_expert_rate or target.expert_learning_rate
            ),
        )
    if args.local_only:
        if target is None:
            parser.error("--local-only needs --target-samples")
        print_local_curves(runs, target, args.samples or 0, base.batch_size, args.ramp)
        return
    lines = []
    for run in runs:
        options = replace(
            base,
            volunteers=run.volunteers,
            delay_ms=run.delay_ms,
            trainers=run.trainers,
            in_flight=run.in_flight,
            samples=args.samples or samples_for(run, base.batch_size),
        )
        line = measure(options, target)
        print(json.dumps({"benchmark": "swarm_scaling", **line}), flush=True)
        lines.append(line)
    local = demo = None
    if not args.skip_local:
        local = local_codec(args.wire, args.local_steps)
        print(json.dumps({"benchmark": "swarm_scaling", "local": local}), flush=True)
    if not args.skip_demo and args.demo_time_to_loss:
        demo = demo_time_to_loss(200, 300, args.demo_in_flight, 20, args.optimizer)
        print(json.dumps({"benchmark": "swarm_scaling", "demo": demo}), flush=True)
    elif not args.skip_demo:
        demo = demo_delay(args.demo_pairs, 40)
        print(json.dumps({"benchmark": "swarm_scaling", "demo": demo}), flush=True)
    print(json.dumps(summary(lines, local, demo)), flush=True)


if __name__ == "__main__":
    main()
