"""A swarm emulated at scale in one process: many slow volunteers behind slow links and
several trainers, on a machine with two cores.

Every part is the real one (libp2p peers on loopback, the DHT, expert servers with
receipts required, contributions, the aggregator's rounds, versions pulled, trainers
with batches in flight); only the volunteers' hardware is emulated:

* compute: a volunteer of speed ``v`` samples/s spends ``1 / (v * rows * 3)`` seconds
  per expert row forward and twice that backward (``rows``: expert rows per sample, a
  sample's tokens x k_best x mixture layers), sleeping whatever its real (tiny) expert
  did not take (``ServerConfig.pace``);
* link: every answer leaves through an emulated uplink (``upload_mbit``, one answer at
  a time) and ``delay_ms`` later (``net/testing/link.py``, the peer's ``RpcConfig.link``):
  a call's round trip grows by the delay.

So the swarm's capacity, the sum of its volunteers' speeds, is known, and is low enough
that this machine's CPU does not decide the result: what is measured is how much of the
capacity the trainers' scheduling turns into trained samples.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from core.demo.emulated_host import (
    HostSpec,
    add_dht_statistics,
    dht_statistics_path,
    serve_volunteers,
    start_host,
    start_peer,
    summed_dht_statistics,
)
from core.demo.options import DemoOptions
from core.demo.scenario import demo_k_best, demo_manifest
from core.experts import records as expert_records
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from core.roles.aggregator import aggregate
from core.trainer.data import STDLIB, load_corpus
from core.trainer.events import Evaluated, TrainerEvent, TrainingProgressed
from core.trainer.train import TrainerOptions, train_on
from net import Peer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmulationOptions:
    volunteers: int = 4
    trainers: int = 1
    #: batches each trainer carries at once (with ``ramp``: at most, from one up as the
    #: gradient noise scale grows)
    in_flight: int = 2
    ramp: bool = False
    #: the emulated volunteers: speed, and their links' delay and upload rate
    samples_per_s: float = 0.5
    delay_ms: float = 0.0
    upload_mbit: float = 20.0
    #: the last this many volunteers sit behind a link ``slow_delay_ms`` long instead
    slow: int = 0
    slow_delay_ms: float = 250.0
    #: sequences to train on, all trainers together
    samples: int = 640
    batch_size: int = 16
    #: the manifest's [model.wire]
    wire: str = "raw"
    #: once every token has its k_min answers, how long to wait for the other experts
    timeout_after_k_min: float = 5.0
    #: how often each volunteer declares its experts in the DHT (their records live 3x
    #: that, at most as long as the namespace allows): one process runs every
    #: volunteer's DHT work, which real volunteers each run on their own machine. With
    #: 16 volunteers at the nodes' 30 s, the event loop lagged 2 s and more and the
    #: declarations timed out; at 180 s it lags 0.3-0.7 s
    announce_seconds: float = 30.0
    #: the aggregator's rounds, in samples the whole swarm trains between two (at its
    #: capacity): the experts learn as often per sample whatever the swarm's size and
    #: speed (the demo on its real hardware: ~10 steps of 16). Volunteers contribute
    #: once a round, just before it closes. A batch whose backward pass comes rounds
    #: after its forward pass finds its weights kept (ExpertBackend.previous)
    round_samples: float = 64.0
    #: processes hosting the volunteers (core/demo/emulated_host.py); 0: this one
    volunteer_processes: int = 0
    #: the first this many volunteers cheat with ``attack`` (a gradient attack or an
    #: answer cheat, as ``moehome demo --attack``)
    attackers: int = 0
    attack: str = "sign-flip"
    seed: int = 0
    #: each trainer evaluates every so many of its steps (0: at its start and end only);
    #: the run's ``evaluations`` list them
    eval_every: int = 0
    #: the trainers' learning rate (None: the demo's, which the experts' is too)
    trainer_learning_rate: float | None = None
    demo: DemoOptions = field(default_factory=DemoOptions)

    def rows_per_sample(self) -> int:
        d = self.demo
        return 64 * demo_k_best(d) * d.mixture_layers  # context x k_best x layers

    def seconds_per_row(self) -> float:
        """Forward seconds per expert row of one volunteer (backward: twice)."""
        return 1.0 / (self.samples_per_s * self.rows_per_sample() * 3)


Report = Callable[[dict[str, Any]], None]


async def run_emulated(
    options: EmulationOptions, workdir: Path, report: Report | None = None
) -> dict[str, Any]:
    """Run the emulated swarm until the trainers trained ``options.samples`` sequences;
    the figures (throughput over the measured window, the trainers' summaries)."""
    started = time.monotonic()
    progress: list[tuple[float, int]] = []  # (time, samples so far, all trainers)
    trained = [0] * options.trainers
    #: (trainer, its step, validation loss, seconds since the start) of every evaluation
    evaluations: list[tuple[int, int, float, float]] = []
    summaries: list[dict[str, Any]] = []
    round_seconds = options.round_samples / (options.volunteers * options.samples_per_s)
    demo = replace(
        options.demo,
        volunteers=options.volunteers,  # the manifest's min_contributors follows it
        wire=options.wire,
        batch_size=options.batch_size,
        contribution_seconds=round_seconds / 2,
        round_seconds=round_seconds,
    )
    corpus = await trio.to_thread.run_sync(load_corpus, STDLIB)
    async with trio.open_nursery() as nursery:
        boot = await start_peer(nursery, [])
        bootstrap = boot.addrs()[:1]
        aggregator = await start_peer(nursery, bootstrap)
        trainers = [await start_peer(nursery, bootstrap) for _ in range(options.trainers)]
        manifest = workdir / "owner" / "emulated.toml"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(
            demo_manifest(
                demo,
                (aggregator.identity.public_key.hex(), aggregator.addrs()[0]),
                [t.identity.public_key.hex() for t in trainers],
            )
        )
        prepared = await trio.to_thread.run_sync(
            prepare, manifest, OwnerKey.generate(), (), workdir / "owner"
        )
        owner = await start_peer(nursery, bootstrap)
        await nursery.start(serve_project, owner, prepared)
        project = prepared.signed.project_id
        await nursery.start(aggregate, aggregator, prepared.signed, workdir / "aggregator")
        uids = list(prepared.signed.manifest.model.expert_uids())
        per = min(demo.experts_per_volunteer, len(uids))
        experts = [
            [uids[(i * per + j) % len(uids)] for j in range(per)] for i in range(options.volunteers)
        ]
        hosts = max(1, options.volunteer_processes)
        slow = range(options.volunteers - options.slow, options.volunteers)
        specs = [
            HostSpec(
                bootstrap=bootstrap,
                project=project,
                experts=experts[h::hosts],
                host=h,
                workdir=str(workdir),
                seconds_per_row=options.seconds_per_row(),
                delay=options.delay_ms / 1000,
                upload=options.upload_mbit * 1e6 / 8,
                announce_seconds=options.announce_seconds,
                announce_ttl=min(3 * options.announce_seconds, expert_records.RULE.max_ttl_s),
                # volunteer v is on host v % hosts, its index there v // hosts
                attacking=[v // hosts for v in range(h, options.attackers, hosts)],
                attack=options.attack,
                slow=[v // hosts for v in range(h, options.volunteers, hosts) if v in slow],
                slow_delay=options.slow_delay_ms / 1000,
            )
            for h in range(hosts)
        ]
        volunteers: list[str] = []  # peer ids, in volunteer order
        in_process: list[Peer] = []  # the volunteers' peers, when they run here
        if options.volunteer_processes > 0:
            hosted: dict[int, list[str]] = {}

            async def host(spec: HostSpec) -> None:
                hosted[spec.host] = await start_host(nursery, spec)

            async with trio.open_nursery() as starting:  # they join the project at once
                for spec in specs:
                    starting.start_soon(host, spec)
            # volunteer v is on host v % hosts, its index there v // hosts
            volunteers = [hosted[v % hosts][v // hosts] for v in range(options.volunteers)]
        else:
            volunteers = await serve_volunteers(nursery, specs[0], in_process)
        if report is not None:
            report({"event": "swarm", "volunteers": options.volunteers, "project": project})
        steps = max(1, options.samples // (options.batch_size * options.trainers))

        def on_report(i: int) -> Callable[[TrainerEvent], None]:
            def seen(event: TrainerEvent) -> None:
                if isinstance(event, TrainingProgressed):
                    trained[i] = event.samples
                    progress.append((time.monotonic(), sum(trained)))
                elif isinstance(event, Evaluated):
                    evaluations.append((i, event.step, event.loss, time.monotonic() - started))
                if report is not None:
                    report({"trainer": i, **event.model_dump()})

            return seen

        async def trainer(i: int) -> None:
            stop = trio.Event()
            summary = await train_on(
                trainers[i],
                TrainerOptions(
                    project=project,
                    workdir=workdir / f"trainer{i}",
                    steps=steps,
                    batch_size=options.batch_size,
                    log_every=1,
                    eval_every=options.eval_every or 10**9,
                    learning_rate=options.trainer_learning_rate or options.demo.learning_rate,
                    checkpoint_every=10**9,
                    seed=options.seed + i,
                    forward_timeout=60.0,
                    timeout_after_k_min=options.timeout_after_k_min,
                    device="cpu",
                    in_flight=options.in_flight,
                    ramp_in_flight=options.ramp,
                    # the final loss after the experts' round that applies the last
                    # steps (volunteers send just before a round closes, by time)
                    final_round_wait_s=2 * round_seconds + 10,
                ),
                data_dir=workdir / f"trainer{i}",
                report=on_report(i),
                stop=stop,
                corpus=corpus,
            )
            summaries.append(summary.model_dump())

        async with trio.open_nursery() as trainers_nursery:
            for i in range(options.trainers):
                trainers_nursery.start_soon(trainer, i)
        elapsed = time.monotonic() - started
        ours = [boot, aggregator, owner, *trainers]
        dht = {
            "volunteers": (
                volunteers_dht([dht_statistics_path(workdir, s.host) for s in specs])
                if options.volunteer_processes > 0
                else dht_rates(summed_dht_statistics(in_process), len(in_process) * elapsed)
            ),
            # the bootstrap peer, the aggregator, the owner and the trainers, each
            "others": dht_rates(summed_dht_statistics(ours), len(ours) * elapsed),
        }
        nursery.cancel_scope.cancel()
    return {
        "dht": dht,
        "samples": sum(s["samples"] for s in summaries),
        "samples_per_s": steady_rate(progress),
        "seconds": time.monotonic() - started,
        "trainers": summaries,
        "evaluations": evaluations,
        "attackers": volunteers[: options.attackers],
        "slow": [volunteers[v] for v in slow],
    }


def dht_rates(figures: Mapping[str, Any], peer_seconds: float) -> dict[str, Any]:
    """DHT statistics (``DhtStatistics.as_dict``, summed over peers) per peer and second,
    over ``peer_seconds`` (peers x seconds): requests sent and answered, by method, and
    the peers' own gets and puts by the keys' namespace."""
    if peer_seconds <= 0:
        return {}

    def rate(n: float) -> float:
        return round(n / peer_seconds, 3)

    def by(name: str) -> dict[str, float]:
        counts: Mapping[str, float] = figures.get(name) or {}
        return {k.removeprefix("dht."): rate(v) for k, v in sorted(counts.items())}

    return {
        "sent_per_s": rate(sum((figures.get("sent_by_method") or {}).values())),
        "served_per_s": rate(sum((figures.get("served_by_method") or {}).values())),
        "sent_by_method_per_s": by("sent_by_method"),
        "gets_per_s": by("gets_by_namespace"),
        "puts_per_s": by("puts_by_namespace"),
        "failed_per_s": rate(figures.get("queries_failed", 0)),
    }


def volunteers_dht(paths: Sequence[Path]) -> dict[str, Any]:
    """The volunteer hosts' DHT statistics (core/demo/emulated_host.py writes them every
    few seconds) per volunteer and second; a host whose file is missing or unreadable is
    left out."""
    total: dict[str, Any] = {}
    peer_seconds = 0.0
    for path in paths:
        try:
            figures = json.loads(path.read_text())
            peer_seconds += float(figures.pop("peers")) * float(figures.pop("seconds"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        add_dht_statistics(total, figures)
    return dht_rates(total, peer_seconds)


def steady_rate(progress: list[tuple[float, int]], skip: float = 0.2) -> float:
    """Samples per second after the first ``skip`` of the samples (the swarm warming
    up: first lookups, first connections)."""
    if len(progress) < 2:
        return 0.0
    total = progress[-1][1]
    start = next((p for p in progress if p[1] >= skip * total), progress[0])
    end = progress[-1]
    return (end[1] - start[1]) / max(end[0] - start[0], 1e-9)
