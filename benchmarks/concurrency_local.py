"""What carrying several batches at once costs in samples, however they are arranged:
T trainers with N batches in flight each, the demo's model trained in this process on
the same batches as one trainer carrying one batch at a time (the reference).

A swarm's throughput needs batches in the air: the volunteers idle unless about
``capacity x step latency / batch`` samples are being carried. Whether they ride on one
trainer (in flight: stale gradients) or on several (the shared trunk: changes that meet
late), each batch's gradient is computed on weights that miss the others' updates. This
emulation isolates that cost, deterministically, without threads or a swarm:

- the trainers take the batches in turn; one with N in flight computes each gradient on
  its weights moved on by N-1 times its last update (the session's weight prediction)
  and applies it N-1 of its own steps later at the session's rate for that staleness
  (``optimizers.stale_rate``: ``lr / N`` on AdamW, ``lr`` on Muon), clipped as the
  session clips;
- with several trainers, the trunk meets as core/trainer/trunk.py says (TrunkSync and
  rebase are the real code): a change every ``sync_every`` steps, arriving ``delay``
  batches later; the aggregator's rule, the sum of every trainer's change with an outer
  SGD (Nesterov momentum), published ``delay`` batches after the last change arrived;
- the experts are shared and step after every batch (their rounds cost ~1.5% at 60
  steps, measured apart: the swarm's figure includes them, this one does not);
- ``ramp``: each trainer starts with one batch in flight and carries as many as the
  trainer's own policy says (core/trainer/concurrency.py ``batches_in_flight``, on
  core/trainer/noise_scale.py's estimate from its trunk gradients, the real code), up
  to N: the swarm's ``--ramp`` runs, so that their same-concurrency guard compares
  them with a reference that ramps as they do.

    python benchmarks/concurrency_local.py [--steps 60] [--seeds 1 2 3] \\
        [--arrangements 1:2 1:3 2:1 2:3 3:2 6:1] [--outer-momentum 0.5]

Prints one JSON line per arrangement: the mean validation loss over the seeds (each seed
draws other batches) beside the reference's, and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.aggregator.robust import momentum_share
from core.demo import DemoOptions
from core.project.manifest import TrainerOptimizerKind
from core.trainer.concurrency import batches_in_flight
from core.trainer.data import Corpus, load_corpus, sample_batch, validation_batches
from core.trainer.model import TrainerModel
from core.trainer.noise_scale import NoiseScale, gradient_sample
from core.trainer.optimizers import TrainerOptimizer, local_mixtures, stale_rate
from core.trainer.trunk import Params, TrunkSync, rebase

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_local import demo_model, reference_model


@dataclass(frozen=True)
class Arrangement:
    trainers: int
    in_flight: int

    @classmethod
    def parse(cls, text: str) -> Arrangement:
        trainers, in_flight = (int(v) for v in text.split(":"))
        if trainers < 1 or in_flight < 1:
            raise argparse.ArgumentTypeError(f"{text}: trainers and in flight from 1")
        return cls(trainers, in_flight)


def _trunk(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".experts." not in n}


def _snapshot(model: nn.Module) -> Params:
    return {n: p.detach().clone() for n, p in _trunk(model).items()}


def _share_experts(source: TrainerModel, target: TrainerModel) -> None:
    for a, b in zip(local_mixtures(source), local_mixtures(target), strict=True):
        b.experts = a.experts


@dataclass
class _Trainer:
    model: TrainerModel
    replica: TrainerModel
    optimizer: TrainerOptimizer
    sync: TrunkSync
    #: gradients in flight, each with the copy's update count when it was computed
    waiting: deque[tuple[Params, int]] = field(default_factory=deque)
    last_update: Params | None = None
    #: updates the copy has taken: its own steps and the other trainers' steps that
    #: came with the versions it rebased onto
    updates: int = 0
    #: the samples behind the version the copy last took (every trainer's)
    version_samples: int = 0
    #: the other trainers' update per step, from the last rebase (for the prediction)
    others_update: Params | None = None
    #: the other trainers' updates that landed between a gradient's computing and its
    #: applying, the recent mean (how far ahead to predict them)
    others_ahead: float = 0.0
    #: batches carried at once (fixed, or ramped by ``noise``)
    carrying: int = 1
    noise: NoiseScale | None = None


def train(corpus: Corpus, steps: int, arrangement: Arrangement, **options: Any) -> float:
    """Validation loss after ``steps`` batches applied (all trainers together; the
    batches still in flight at the end are dropped, as the swarm's run drops them);
    ``options``: :func:`curve`'s."""
    return curve(corpus, steps, arrangement, **options)[-1][1]


def curve(
    corpus: Corpus,
    steps: int,
    arrangement: Arrangement,
    *,
    seed: int,
    delay: int = 2,
    outer_learning_rate: float = 1.0,
    outer_momentum: float = 0.5,
    sync_every: int = 2,
    optimizer: TrainerOptimizerKind = "adamw",
    learning_rate: float | None = None,
    eval_every: int = 0,
    eval_batches: int = 8,
    expert_round: int = 1,
    expert_rate_scale: float = 1.0,
    expert_momentum: float = 0.0,
    expert_beta1: float = 0.9,
    count_others: bool = False,
    predict_others: bool = False,
    others_ahead: float | None = None,
    others_staleness: float = 0.0,
    expert_lag: int = 0,
    staleness_power: float | None = None,
    ramp: bool = False,
    carried: list[tuple[int, int]] | None = None,
) -> list[tuple[int, float]]:
    """(samples applied, validation loss of the first trainer's model) every
    ``eval_every`` batches applied (0: at the end only), the start's included. The
    experts step every ``expert_round`` batches (an aggregator's round) at the demo's
    rate times ``expert_rate_scale``. ``expert_momentum``: before their Adam (first moment
    ``expert_beta1``), a round's mean gradient joins a momentum as the aggregators' robust
    rule keeps one per volunteer (core/aggregator/robust.py; one volunteer here, equal
    rounds: 1 - momentum of the new one), and the momentum is what Adam steps on.

    Staleness between trainers: ``count_others`` counts the other trainers' steps that
    reach a trainer's copy (with a version it rebases onto) between a gradient's
    computing and its applying in the staleness-aware rate, beside its own;
    ``predict_others`` keeps the own prediction across a rebase and predicts the others'
    updates too (their last rebase's jump per step, times as many as landed lately).

    ``ramp``: each trainer carries from 1 up to ``arrangement.in_flight`` batches as its
    gradient noise scale says (the trainer's ``--ramp``); ``carried``, if given, gets
    (samples applied, batches carried) at the start and at every change of the first
    trainer's."""
    m, weights_seed = demo_model()
    options = DemoOptions()
    lr = learning_rate or options.learning_rate
    first = reference_model(m, weights_seed)
    trainers: list[_Trainer] = []
    for _ in range(arrangement.trainers):
        model = first if not trainers else copy.deepcopy(first)
        replica = copy.deepcopy(first)
        _share_experts(first, model)
        _share_experts(first, replica)
        trainers.append(
            _Trainer(
                model,
                replica,
                TrainerOptimizer(model, optimizer, lr, among=_trunk(model).values()),
                TrunkSync(sync_every=sync_every, anchor=_snapshot(model)),
                carrying=1 if ramp else arrangement.in_flight,
                noise=NoiseScale(options.batch_size) if ramp else None,
            )
        )
    if carried is not None:
        carried.append((0, trainers[0].carrying))
    coordinates = sum(p.numel() for p in _trunk(first).values())
    experts = [p for n, p in first.named_parameters() if ".experts." in n]
    # the experts at the demo's rate whatever the trainer's (the manifest sets theirs)
    expert_optimizer = torch.optim.Adam(
        experts, lr=options.learning_rate * expert_rate_scale, betas=(expert_beta1, 0.999)
    )
    expert_momenta: list[torch.Tensor | None] = [None for _ in experts]
    expert_batches = 0
    rounds: deque[list[torch.Tensor | None]] = deque()
    # the aggregator's trunk and its outer optimizer
    names = list(_trunk(first))
    shared = [nn.Parameter(p.detach().clone()) for p in _trunk(first).values()]
    outer = torch.optim.SGD(
        shared, lr=outer_learning_rate, momentum=outer_momentum, nesterov=outer_momentum > 0
    )
    version = 0
    arriving: list[tuple[int, int, Params, int]] = []  # (batch, trainer, change, samples)
    changes: dict[int, tuple[Params, int]] = {}
    total_samples = 0  # behind the newest version
    published: list[tuple[int, int, Params, int]] = []  # (batch, version, weights, samples)
    generator = torch.Generator().manual_seed(seed)
    evaluation = validation_batches(
        corpus.validation, options.batch_size, first.context, eval_batches
    )

    def evaluate() -> float:
        model = trainers[0].model
        model.eval()
        with torch.no_grad():
            losses = [float(model.objective(x, y)[1]) for x, y in evaluation]
        return sum(losses) / len(losses)

    def apply_oldest(t: _Trainer, stale: int) -> None:
        """Applies the oldest of ``t``'s gradients in flight, computed ``stale`` of its
        own steps ago, at the session's rate for that staleness."""
        gradient, computed_at = t.waiting.popleft()
        landed = t.updates - computed_at  # own steps (stale) and the others' since
        t.others_ahead = 0.8 * t.others_ahead + 0.2 * (landed - stale)
        params = _trunk(t.model)
        for name, p in params.items():
            p.grad = gradient[name]
        nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        for group in t.optimizer.param_groups:
            k = (landed if count_others else stale) + others_staleness
            group["lr"] = (
                stale_rate(optimizer, lr, round(k))
                if staleness_power is None
                else lr / (1 + k) ** staleness_power
            )
        before = _snapshot(t.model)
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
        t.last_update = {n: p.detach() - before[n] for n, p in params.items()}
        t.updates += 1

    out: list[tuple[int, float]] = [(0, evaluate())] if eval_every else []
    applied = 0
    batch = -1
    while applied < steps:
        batch += 1
        for item in [a for a in arriving if a[0] <= batch]:
            arriving.remove(item)
            _, who, delta, samples = item
            trainers[who].sync.accepted(version)
            changes[who] = (delta, samples)
            if len(changes) == len(trainers):
                for name, p in zip(names, shared, strict=True):
                    p.grad = torch.stack([c[name] for c, _ in changes.values()]).sum(dim=0)
                outer.step()
                outer.zero_grad(set_to_none=True)
                version += 1
                total_samples += sum(n for _, n in changes.values())
                weights = {n: p.detach().clone() for n, p in zip(names, shared, strict=True)}
                published.append((batch + delay, version, weights, total_samples))
                changes = {}
        t = trainers[batch % len(trainers)]
        stale = t.carrying - 1  # the batches carried beside this one: its staleness
        ready = [v for v in published if v[0] <= batch and t.sync.may_rebase(v[1])]
        if ready:
            _, number, weights, samples = ready[-1]
            own = t.sync.sent_samples
            base = t.sync.took(weights, number)
            copy_now = _snapshot(t.model)
            moved = rebase(copy_now, base, weights)
            # the other trainers' steps in this version beyond the last one taken
            others = (samples - t.version_samples - own) // options.batch_size
            t.version_samples = samples
            t.updates += others
            if others > 0:
                t.others_update = {n: (moved[n] - copy_now[n]) / others for n in moved}
            with torch.no_grad():
                for name, p in _trunk(t.model).items():
                    p.copy_(moved[name])
            if not predict_others:
                t.last_update = None
        # the gradient of this batch, on where the weights are predicted to be
        with torch.no_grad():
            for (name, p), q in zip(
                _trunk(t.model).items(), _trunk(t.replica).values(), strict=True
            ):
                q.copy_(p)
                if t.last_update is not None:
                    q.add_(t.last_update[name], alpha=stale)
                if predict_others and t.others_update is not None:
                    ahead = t.others_ahead if others_ahead is None else others_ahead
                    q.add_(t.others_update[name], alpha=ahead)
        x, y = sample_batch(corpus.train, options.batch_size, first.context, generator)
        t.replica.train()
        loss, _ = t.replica.objective(x, y)  # with a family's load-balancing term
        t.replica.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        # the experts step once a round, on the mean of its batches' gradients (the
        # aggregator's round); their gradients sum in .grad meanwhile
        expert_batches += 1
        if expert_batches == expert_round:
            rounds.append([None if p.grad is None else p.grad / expert_round for p in experts])
            expert_optimizer.zero_grad(set_to_none=True)
            if len(rounds) > expert_lag:
                # the round's gradients land ``expert_lag`` rounds late (computed on
                # the weights of that many versions ago)
                for i, (p, g) in enumerate(zip(experts, rounds.popleft(), strict=True)):
                    kept = expert_momenta[i]
                    if g is not None and expert_momentum > 0:
                        # the rule's share for equal rounds (no sample counts)
                        share = momentum_share(expert_momentum, None, None)
                        kept = g if kept is None else kept.lerp_(g, share)
                        expert_momenta[i] = kept
                        g = kept.clone()  # Adam gets a copy; the momentum stays
                    p.grad = g
                expert_optimizer.step()
                expert_optimizer.zero_grad(set_to_none=True)
            expert_batches = 0
        gradients = {n: p.grad.clone() for n, p in _trunk(t.replica).items()}  # type: ignore[union-attr]
        t.waiting.append((gradients, t.updates))
        if t.noise is not None:  # in the order the batches finish, as the session adds
            t.noise.add(gradient_sample(gradients.values(), coordinates))
        # the gradient of the batch carried `stale` steps ago lands now; a ramp that came
        # down lands two (the swarm's trainer starts no batch while one finishes)
        while len(t.waiting) > stale and applied < steps:
            apply_oldest(t, stale)
            applied += 1
            if eval_every and applied % eval_every == 0 and applied < steps:
                out.append((applied * options.batch_size, evaluate()))
            if len(trainers) > 1:
                t.sync.stepped(options.batch_size)
                if t.sync.due():
                    delta, _, samples = t.sync.take(_snapshot(t.model))
                    arriving.append((batch + delay, batch % len(trainers), delta, samples))
            if t.noise is not None:
                was = t.carrying
                t.carrying = batches_in_flight(
                    t.noise.sequences,
                    t.noise.pairs,
                    options.batch_size,
                    len(trainers),
                    t.carrying,
                    arrangement.in_flight,
                )
                if carried is not None and t is trainers[0] and t.carrying != was:
                    carried.append((applied * options.batch_size, t.carrying))
    out.append((applied * options.batch_size, evaluate()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="batches, all trainers together")
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument(
        "--arrangements",
        type=Arrangement.parse,
        nargs="*",
        default=[Arrangement.parse(a) for a in ("1:2", "1:3", "2:1", "2:3", "3:2", "6:1")],
    )
    parser.add_argument("--delay", type=int, default=2, help="batches a trunk change travels")
    parser.add_argument("--outer-learning-rate", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=DemoOptions.trunk_outer_momentum)
    parser.add_argument(
        "--optimizer",
        choices=["adamw", "muon"],
        default="adamw",
        help="the trainer-side layers' (the reference's too; experts: Adam)",
    )
    parser.add_argument("--lr", type=float, default=None, help="default: the demo's")
    parser.add_argument(
        "--expert-round",
        type=int,
        default=1,
        help="batches per expert step (the aggregators' rounds; the reference's too)",
    )
    parser.add_argument(
        "--expert-rate-scale", type=float, default=1.0, help="the experts' rate, x the demo's"
    )
    parser.add_argument(
        "--reference-expert-round",
        type=int,
        default=1,
        help="the reference's batches per expert step (1: every batch)",
    )
    parser.add_argument(
        "--count-others",
        action="store_true",
        help="the staleness-aware rate counts the other trainers' steps too",
    )
    parser.add_argument(
        "--predict-others",
        action="store_true",
        help="the weight prediction carries across rebases and predicts the others' steps",
    )
    parser.add_argument(
        "--expert-lag",
        type=int,
        default=0,
        help="rounds an expert round's gradients land late (the reference's: none)",
    )
    parser.add_argument(
        "--staleness-power",
        type=float,
        default=None,
        help="a gradient k updates old is applied at lr / (1 + k) ** this (default: as the "
        "session, core/trainer/optimizers.py stale_rate)",
    )
    parser.add_argument("--others-ahead", type=float, default=None)
    parser.add_argument("--others-staleness", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus()

    def mean_loss(
        arrangement: Arrangement, expert_round: int, rate_scale: float, expert_lag: int = 0
    ) -> float:
        losses = [
            train(
                corpus,
                args.steps,
                arrangement,
                seed=seed,
                delay=args.delay,
                outer_learning_rate=args.outer_learning_rate,
                outer_momentum=args.outer_momentum,
                optimizer=args.optimizer,
                learning_rate=args.lr,
                expert_round=expert_round,
                expert_rate_scale=rate_scale,
                count_others=args.count_others,
                predict_others=args.predict_others,
                others_ahead=args.others_ahead,
                others_staleness=args.others_staleness,
                expert_lag=expert_lag,
                staleness_power=args.staleness_power,
            )
            for seed in args.seeds
        ]
        return sum(losses) / len(losses)

    reference = mean_loss(Arrangement(1, 1), args.reference_expert_round, 1.0)
    for arrangement in args.arrangements:
        loss = mean_loss(arrangement, args.expert_round, args.expert_rate_scale, args.expert_lag)
        line = {
            "benchmark": "concurrency_local",
            "trainers": arrangement.trainers,
            "in_flight": arrangement.in_flight,
            "concurrent": arrangement.trainers * arrangement.in_flight,
            "steps": args.steps,
            "seeds": args.seeds,
            "outer_momentum": args.outer_momentum,
            "outer_learning_rate": args.outer_learning_rate,
            "optimizer": args.optimizer,
            "learning_rate": args.lr or DemoOptions.learning_rate,
            "expert_round": args.expert_round,
            "expert_rate_scale": args.expert_rate_scale,
            "reference_expert_round": args.reference_expert_round,
            "expert_lag": args.expert_lag,
            "staleness_power": args.staleness_power,
            "count_others": args.count_others,
            "predict_others": args.predict_others,
            "others_ahead": args.others_ahead,
            "others_staleness": args.others_staleness,
            "reference_loss": round(reference, 4),
            "loss": round(loss, 4),
            "loss_ratio": round(loss / reference, 4),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
