"""The demo's scenario (``moehome demo``): the whole system training a model on
127.0.0.1, every part its own process, started with the same commands a real swarm uses:

    moehome peer                      a bootstrap peer
    moehome owner init / publish      the owner signs and publishes a small char-level LM
    moehome aggregator run            verifies and robustly aggregates the gradients
    moehome node  (x N)               volunteers serving the experts
    moehome owner train --json        the trainer; its JSON lines drive the display here

Options add churn (a third of the volunteers killed with SIGKILL mid-run, after as many
new ones joined: nodes that were running, as a volunteer's app is, and join the project
then), attackers (extra volunteers that poison their gradients) and slow links
(volunteers whose every answer is late). Ctrl-C asks the trainer to stop (it evaluates,
checkpoints and reports), then stops everything else; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.control.client import JOIN_TIMEOUT_S, ControlError, find_node
from core.control.invite import make_invite
from core.control.models import ExpertsEvent
from core.demo.language import demo_language, sample_text
from core.demo.options import DemoOptions, wire_codecs
from core.demo.summary import demo_summary
from core.demo.supervisor import Proc, Swarm, free_port
from core.errors import UserFacingError
from core.paths import data_dir, identity_path
from core.trainer.events import TrainerEvent, TrainingProgressed, TrainingSummary, read_event
from core.trainer.progress import TrainingProgress
from net.identity import load_or_create
from net.testing.lab import Home, Lab, NatKind, missing_requirements, network_lab

log = logging.getLogger(__name__)

#: Every process of the demo listens on loopback: the demo never leaves this computer.
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
#: With --nat, each process has a namespace (and an address of 198.18.0.0/15) of its own,
#: and a port of its own: two machines behind one NAT cannot both keep the same port
#: outside, and hole punching aims at the port a peer listens on.
LAB_PORT = 4001
LAB_LISTEN = f"/ip4/0.0.0.0/tcp/{LAB_PORT}"
TRAINER_PORT = 4000


@dataclass
class Places:
    """Where the demo's processes run: all on this computer's loopback, or (``--nat``)
    in the network lab: the bootstrap peer, the owner and the aggregator on the public
    network; volunteers in two homes behind NAT routers, taking turns; the trainer in
    the second home."""

    lab: Lab | None = None
    _volunteers: int = 0
    #: the homes volunteers take turns in ("b" is the trainer's)
    volunteer_homes: str = "ab"

    @staticmethod
    def for_options(options: DemoOptions, lab: Lab | None = None) -> Places:
        return Places(lab, volunteer_homes="ac" if options.symmetric else "ab")

    def homes(self, options: DemoOptions) -> list[Home]:
        most = options.volunteers + options.attackers
        if options.churn:
            most += math.ceil(options.volunteers / 3)
        n = len(self.volunteer_homes)
        hosts = {h: (most + n - 1 - k) // n for k, h in enumerate(self.volunteer_homes)}
        hosts["b"] = hosts.get("b", 0) + 1  # the trainer
        nat: dict[str, NatKind] = {"c": "symmetric"}
        return [Home(h, hosts=hosts[h], nat=nat.get(h, "cone")) for h in sorted(hosts)]

    @staticmethod
    def public(options: DemoOptions) -> list[str]:
        # a second public relay, so that volunteers have one to move to when the
        # bootstrap peer is killed
        return ["bootstrap", "owner", "aggregator", *(["relay"] if options.kill_relay else [])]

    @property
    def listen(self) -> str:
        return LAB_LISTEN if self.lab else LOOPBACK

    def volunteer_listen(self) -> str:
        """For the volunteer just placed (:meth:`next_volunteer`)."""
        return f"/ip4/0.0.0.0/tcp/{LAB_PORT + self._volunteers}" if self.lab else LOOPBACK

    def trainer_listen(self) -> str:
        return f"/ip4/0.0.0.0/tcp/{TRAINER_PORT}" if self.lab else LOOPBACK

    def prefix(self, host: str) -> list[str]:
        return self.lab.host(host).command([]) if self.lab else []

    def aggregator_listen(self) -> tuple[str, int]:
        """(listen address, port) of the aggregator, whose address the manifest names."""
        if self.lab:
            return LAB_LISTEN, LAB_PORT
        port = free_port()
        return f"/ip4/127.0.0.1/tcp/{port}", port

    def aggregator_ip(self) -> str:
        return self.lab.host("aggregator").ip if self.lab else "127.0.0.1"

    def next_volunteer(self) -> str:
        """The host of the next volunteer (the volunteer homes in turn)."""
        self._volunteers += 1
        k = self._volunteers - 1
        n = len(self.volunteer_homes)
        return f"{self.volunteer_homes[k % n]}/{k // n}"

    def trainer(self) -> str:
        if not self.lab:
            return ""
        return f"b/{len(self.lab.home_hosts['b']) - 1}"


@contextmanager
def _places(options: DemoOptions) -> Iterator[Places]:
    places = Places.for_options(options)
    if not options.nat:
        yield places
        return
    why_not = missing_requirements()
    if why_not is not None:
        raise UserFacingError(f"--nat builds network namespaces and NAT routers: {why_not}")
    with network_lab(Places.public(options), places.homes(options)) as lab:
        places.lab = lab
        yield places


def demo_k_best(options: DemoOptions) -> int:
    """Experts per token of the demo's model: Mixtral's 2, the byte model's 4."""
    return 4 if options.architecture == "byte" else 2


def demo_manifest(
    options: DemoOptions,
    aggregator: tuple[str, str],
    trainers: str | Sequence[str],
    tokenizer: tuple[str, int] | None = None,
) -> str:
    """The demo project: a language model small enough for CPUs (Mixtral-style, or the
    byte model), contributions and rounds frequent enough that the experts' versions
    move within a minute. ``trainers``: the trainers' public keys (hex); ``tokenizer``:
    (sha256, vocabulary) of a mixtral project's tokenizer (None: bytes)."""
    agg_key, agg_addr = aggregator
    keys = [trainers] if isinstance(trainers, str) else list(trainers)
    trainer_tables = "\n".join(f'[[trainers]]\nkey = "{key}"\n' for key in keys)
    grid = ", ".join(str(n) for n in options.grid)
    activations, gradients = wire_codecs(options.wire)
    # the manifest's 3, unless the swarm has fewer servers per expert (every volunteer
    # serves every expert unless --experts splits them)
    experts = options.mixture_layers * math.prod(options.grid)
    per_expert = options.volunteers * min(options.experts_per_volunteer, experts) // experts
    min_contributors = min(3, max(1, per_expert))
    if options.architecture == "byte":
        model = f"""\
[model]
architecture = "byte"
vocab_size = 256
hidden = {options.hidden}
context = 64
mixture_layers = {options.mixture_layers}
grid = [{grid}]
k_best = {demo_k_best(options)}
k_min = 1

[model.expert]
kind = "ffn"
hidden = {options.hidden}
inner = {4 * options.hidden}
"""
    else:
        sha, vocab = tokenizer or ("bytes", 257)
        model = f"""\
[model]
architecture = "{options.architecture}"
dtype = "float32"  # the demo's cheats scale answers by 5%: bfloat16's audit may pass them
vocab_size = {vocab}
hidden = {options.hidden}
context = 64
mixture_layers = {options.mixture_layers}
grid = [{grid}]
k_best = {demo_k_best(options)}
k_min = 1
heads = 4
kv_heads = 2

[model.expert]
kind = "swiglu"
hidden = {options.hidden}
inner = {2 * options.hidden}

[data]
tokenizer = "{sha}"
"""
    return f"""\
[project]
name = "demo-lm"
description = "moehome demo: a language model of Python's own sources"

{model}
[model.wire]
activations = "{activations}"
gradients = "{gradients}"

[training]
optimizer = "adam"
trainer_optimizer = "{options.trainer_optimizer}"
learning_rate = {options.learning_rate}
contribution_samples = 2048
contribution_seconds = {options.contribution_seconds}
staleness_bound = 8
round_samples = 6144
round_seconds = {options.round_seconds}
min_contributors = {min_contributors}

[training.aggregation]
rule = "{options.rule}"

[training.audit]
answer_rate = {options.answer_audit_rate}
contribution_rate = {options.contribution_audit_rate}

[training.trunk]
sync_every = {options.trunk_sync_every}
round_seconds = {options.trunk_round_seconds}
outer_learning_rate = {options.trunk_outer_learning_rate}
outer_momentum = {options.trunk_outer_momentum}

[[aggregators]]
key = "{agg_key}"
addrs = ["{agg_addr}"]

{trainer_tables}
[weights]
seed = 1
"""


@contextmanager
def _work_folder(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="moehome-demo-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_demo(
    options: DemoOptions, *, quiet: bool = False, handle_signals: bool = True
) -> dict[str, Any]:
    """Run the demo; the summary (see ``print_summary``)."""
    console = Console(stderr=True, quiet=quiet)
    # the processes' keys are made here; "created a new identity" lines are noise in a demo
    logging.getLogger("net.identity").setLevel(logging.WARNING)
    with _work_folder(options.workdir) as root, _places(options) as places:
        swarm = Swarm(root)
        summary: dict[str, Any] | None = None
        try:
            async with trio.open_nursery() as nursery:
                if handle_signals:
                    nursery.start_soon(_stop_when_terminated, nursery.cancel_scope)
                summary = await _run(options, swarm, places, console, handle_signals)
                nursery.cancel_scope.cancel()
            if summary is None:
                raise UserFacingError("stopped by SIGTERM or SIGHUP; every process with it")
        finally:
            # before the lab goes (its namespaces take what runs inside along)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(swarm.stop_all)
        if options.workdir is None:  # the run's folder goes now
            keep_results(summary, data_dir() / "demo-page")
        return summary


async def _stop_when_terminated(scope: trio.CancelScope) -> None:
    """SIGTERM (a supervisor, ``kill``) or SIGHUP (the terminal closed) stop the demo
    as a second Ctrl-C does: everything at once, no process left behind. (Its processes
    run in sessions of their own: the terminal's hangup does not reach them.)"""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return


def keep_results(summary: dict[str, Any], kept: Path) -> None:
    """The demo's project page and credit proof copied to ``kept``, where they outlive
    the run (replacing the last run's); the summary points there."""
    shutil.rmtree(kept, ignore_errors=True)
    if summary.get("page"):
        shutil.copytree(Path(summary["page"]).parent, kept)
        summary["page"] = str(kept / "index.html")
    proof = summary.get("proof")
    if proof:
        kept.mkdir(parents=True, exist_ok=True)
        copy = kept / f"{proof['volunteer']}.credit.proof"
        shutil.copyfile(proof["proof"], copy)
        proof["proof"] = str(copy)


async def _run(
    options: DemoOptions, swarm: Swarm, places: Places, console: Console, handle_signals: bool
) -> dict[str, Any]:
    total = options.volunteers + options.attackers
    console.print(
        f"[bold]moehome demo[/]: {options.volunteers} volunteers"
        + (f" + {options.attackers} attackers ({options.attack})" if options.attackers else "")
        + (f", {options.slow} behind {options.slow_ms:.0f} ms links" if options.slow else "")
        + (", churn" if options.churn else "")
        + (", volunteers and trainer behind NAT routers" if options.nat else "")
        + (" (one home's NAT symmetric)" if options.symmetric else "")
        + (", the bootstrap relay killed halfway" if options.kill_relay else "")
        + f"; {options.steps} steps; every process's files and log in {swarm.root}"
        + ("" if options.workdir else " (removed at the end; --workdir keeps them)")
    )
    starting = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with starting:
        task = starting.add_task("starting the swarm", total=4 + total + options.kill_relay)
        limits = (
            ["--relay-circuit-mib", str(options.relay_circuit_mib)]
            if options.relay_circuit_mib
            else []
        )

        async def init_owner() -> None:
            if not (swarm.folder("owner") / "config" / "owner" / "owner.key").exists():
                # the key the publisher signs with; kept in --workdir, so a second run with
                # the same folder is the same project and the trainer resumes its checkpoint
                await swarm.run_to_end("owner", ["owner", "init"])

        # Two cores start ten processes that import torch: the owner's key, which needs
        # no peer, is made beside the bootstrap peer's start.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(init_owner)
            boot = swarm.start(
                "bootstrap",
                ["peer", "-l", places.listen, *limits],
                role="bootstrap",
                prefix=places.prefix("bootstrap"),
            )
            bootstrap = await swarm.first_line(boot)
            starting.advance(task)
            if options.kill_relay:
                relay = swarm.start(
                    "relay",
                    ["peer", "-l", places.listen, "-b", bootstrap, *limits],
                    role="relay",
                    prefix=places.prefix("relay"),
                )
                await swarm.first_line(relay)
                starting.advance(task)

        agg_folder = swarm.folder("aggregator") / "data"
        agg_identity = load_or_create(identity_path(agg_folder, "aggregator"))
        agg_listen, port = places.aggregator_listen()
        agg_addr = f"/ip4/{places.aggregator_ip()}/tcp/{port}/p2p/{agg_identity.peer_id}"
        trainer_key = load_or_create(
            identity_path(swarm.folder("trainer") / "data", "trainer")
        ).public_key
        manifest = swarm.folder("owner") / "demo.toml"
        language = (
            await trio.to_thread.run_sync(demo_language, options, swarm.folder("owner"))
            if options.architecture != "byte"
            else None
        )
        pinned = None if language is None else (language.tokenizer, language.vocab_size)
        manifest.write_text(
            demo_manifest(
                options, (agg_identity.public_key.hex(), agg_addr), trainer_key.hex(), pinned
            )
        )
        owner = swarm.start(
            "owner",
            ["owner", "publish", str(manifest), "-b", bootstrap, "-l", places.listen],
            role="owner",
            prefix=places.prefix("owner"),
        )
        project_line = await swarm.first_line(owner, "project id:")
        project = project_line.split(":", 1)[1].strip()
        await swarm.first_line(owner)
        starting.advance(task)
        # how another volunteer on this computer joins: `moehome join <invite>`, or the
        # tray's wizard (the demo's peers listen on loopback only)
        invite = make_invite(project, [bootstrap]).link()
        # on one line whatever the terminal's width: it is copied whole
        console.print(f"invite: {invite}", soft_wrap=True, markup=False, highlight=False)

        agg = swarm.start(
            "aggregator",
            [
                "aggregator",
                "run",
                "--project",
                project,
                "-b",
                bootstrap,
                "-l",
                agg_listen,
            ],
            role="aggregator",
            prefix=places.prefix("aggregator"),
        )

        # up before the volunteers start: started beside them it came up 10-25 s later
        # than alone (measured; its weights fetch, chunk by chunk, then competes with
        # four volunteers fetching and announcing the same), and the trainer waited
        await swarm.first_line(agg)
        starting.advance(task)

        volunteers: list[Proc] = []
        counter = 0

        def launch_volunteer(role: str, *, join: bool = True) -> Proc:
            """A volunteer node serving the project, or (``join=False``) one that runs
            and will join it later."""
            nonlocal counter
            counter += 1
            name = f"volunteer-{counter}"
            folder = swarm.folder(name)
            key = load_or_create(folder / "data" / "identity.key").public_key.hex()
            # the demo runs while you use the machine: serve even when not idle (the
            # temperature limits still apply)
            (folder / "config" / "preferences.json").write_text(json.dumps({"idle_only": False}))
            where = places.next_volunteer() if places.lab else ""
            args = ["node", "-b", bootstrap, "--no-benchmark"]
            args += ["--project", project] if join else []
            args += ["-l", places.volunteer_listen()]
            args += ["--experts", str(options.experts_per_volunteer)]
            if role.startswith("attacker ("):  # "attacker (alie)"
                args += ["--attack", role.removeprefix("attacker (").removesuffix(")")]
            if role == "slow":
                args += ["--reply-delay-ms", str(options.slow_ms)]
            proc = swarm.start(name, args, role=role, prefix=places.prefix(where) if where else [])
            proc.where = where
            proc.public_key = key
            return proc

        roles = ["slow" if i < options.slow else "honest" for i in range(options.volunteers)]
        attacks = options.attack.split(",")  # several: the attackers take turns
        roles += [f"attacker ({attacks[i % len(attacks)]})" for i in range(options.attackers)]
        each_serves_all = options.experts_per_volunteer >= options.mixture_layers * math.prod(
            options.grid
        )
        standby = math.ceil(options.volunteers / 3) if options.churn else 0

        async def serving(proc: Proc) -> None:
            await swarm.first_line(proc)
            volunteers.append(proc)
            starting.advance(task)

        async with trio.open_nursery() as nursery:
            if each_serves_all:  # start together, in the order of their roles
                for proc in [launch_volunteer(role) for role in roles]:
                    nursery.start_soon(serving, proc)
            else:  # one after another: each sees what the earlier ones serve, takes the rest
                for role in roles:
                    await serving(launch_volunteer(role))
            # churn's newcomers run from the start, as a volunteer's app does, and join the
            # project mid-run: then joining takes a second or two, not a process's start
            # (6 s and more on two loaded cores, a race with the end of a short run)
            newcomers = [
                launch_volunteer("honest (joined late)", join=False) for _ in range(standby)
            ]
        volunteers += newcomers
        # once every volunteer serves: the trainer's first steps then spread over all
        # of them (routing learns each one's latency from its answers)
        trainer = swarm.start(
            "trainer",
            [
                "owner",
                "train",
                "--project",
                project,
                "-b",
                bootstrap,
                "--json",
                "--steps",
                str(options.steps),
                "--batch-size",
                str(options.batch_size),
                "--data",
                str(language.shards) if language and language.shards else options.data,
                "--eval-every",
                str(options.eval_every),
                "--log-every",
                "5",
                "--in-flight",
                str(options.in_flight),
                # the final loss after the experts' round that applies the last steps
                "--final-round-wait",
                str(2 * options.round_seconds + 10),
                "-l",
                places.trainer_listen(),
            ],
            threads=None,
            role="trainer",
            prefix=places.prefix(places.trainer()) if places.lab else [],
        )
        starting.advance(task)

    summary = await _follow_trainer(
        options, swarm, trainer, volunteers, newcomers, project, console, handle_signals, boot
    )
    # the last looks, at once (each its own processes): the model exported and sampled,
    # the project page (whose leaderboard, the aggregator's signed account, gives each
    # volunteer's credit), and the first volunteer's own proof of its credit. Through
    # the aggregator: the bootstrap peer may have been killed (--kill-relay)
    page: dict[str, Any] = {}

    async def sample() -> None:
        workdir = swarm.folder("trainer") / "data" / "trainer" / project
        summary["generated"] = await sample_text(
            swarm, project, agg_addr, workdir, places.prefix("owner")
        )

    async def make_page() -> None:
        page.update(await project_page(swarm, project, agg_addr, places.prefix("owner")))

    prover = next((p for p in volunteers if p.popen.poll() is None), None)  # churn kills

    async def prove() -> None:
        assert prover is not None
        summary["proof"] = await volunteer_proof(swarm, prover, project, agg_addr, places)

    with console.status("sampling the model, making the project page, proving a credit"):
        async with trio.open_nursery() as nursery:
            if options.sample and language is not None and summary.get("steps", 0) > 0:
                nursery.start_soon(sample)
            nursery.start_soon(make_page)
            if prover is not None:
                nursery.start_soon(prove)
    credit = {row["peer"]: row["credit"] for row in page.get("leaderboard", [])}
    for v in summary["per_volunteer"]:
        # none on the leaderboard: nothing reached a round (or a ban took it back)
        v["credit"] = credit.get(v["peer"], 0.0) if page else None
    summary["page"] = page.get("path")
    summary["project_id"] = project
    return summary


async def project_page(
    swarm: Swarm, project: str, bootstrap: str, prefix: Sequence[str]
) -> dict[str, Any]:
    """The project page as the owner makes it (``moehome owner page``), in the owner's
    folder: its data (page.json) and ``path`` (its index.html); empty where the command
    failed (its log says why)."""
    folder = swarm.folder("owner") / "page"
    try:
        await swarm.run_to_end(
            "page", ["owner", "page", project, "-b", bootstrap, "--out", str(folder)], prefix
        )
        data = json.loads((folder / "page.json").read_text())
    except (UserFacingError, OSError, ValueError) as exc:
        log.warning("no project page: %s", exc)
        return {}
    return {**data, "path": str(folder / "index.html")}


async def volunteer_proof(
    swarm: Swarm, proc: Proc, project: str, bootstrap: str, places: Places
) -> dict[str, Any] | None:
    """A volunteer's credit as its own ``moehome credit`` proves it (its node's key, the
    aggregator's signed statement, verified; the proof file in its folder), or None
    where the command failed (its log says why)."""
    proof = swarm.folder(proc.name) / "credit.proof"
    args = ["credit", "--project", project, "-b", bootstrap, "--proof", str(proof), "--json"]
    prefix = places.prefix(proc.where) if proc.where else []
    try:
        text = await swarm.run_to_end(proc.name, args, prefix)
        total = float(json.loads(text)["total"])
    except (UserFacingError, ValueError, KeyError) as exc:
        log.warning("no credit proof for %s: %s", proc.name, exc)
        return None
    return {"volunteer": proc.name, "credit": total, "proof": str(proof)}


async def _follow_trainer(
    options: DemoOptions,
    swarm: Swarm,
    trainer: Proc,
    volunteers: list[Proc],
    newcomers: list[Proc],
    project: str,
    console: Console,
    handle_signals: bool,
    bootstrap: Proc,
) -> dict[str, Any]:
    events: list[TrainerEvent] = []
    summary: TrainingSummary | None = None
    churned = False
    #: with --kill-relay: expert answers per volunteer when the relay was killed
    relay_killed: dict[str, Any] | None = None
    assert trainer.popen.stdout is not None
    async with trio.open_nursery() as nursery:
        if handle_signals:
            nursery.start_soon(_forward_ctrl_c, trainer, console)
        with TrainingProgress(console) as show:
            while True:
                line = await trio.to_thread.run_sync(
                    trainer.popen.stdout.readline, abandon_on_cancel=True
                )
                if not line:
                    break
                try:
                    event = read_event(json.loads(line))
                except ValueError:
                    continue
                if event is None:
                    continue
                events.append(event)
                if isinstance(event, TrainingSummary):  # the demo prints its own
                    summary = event
                    continue
                show(event)
                if not isinstance(event, TrainingProgressed):
                    continue
                if options.churn and not churned and event.step >= options.steps // 3:
                    churned = True
                    nursery.start_soon(_churn, swarm, volunteers, newcomers, project, console)
                if options.kill_relay and relay_killed is None and event.step >= options.steps // 2:
                    swarm.kill(bootstrap)
                    relay_killed = {"step": event.step, "answered_by": event.answered_by}
                    console.print(
                        f"step {event.step}: killed the bootstrap peer, a relay the "
                        "volunteers use (SIGKILL)"
                    )
        nursery.cancel_scope.cancel()
    code = await trio.to_thread.run_sync(trainer.popen.wait)
    if summary is None:
        raise UserFacingError(
            f"the trainer exited with code {code} before its summary; "
            f"see {swarm.root / 'trainer'}/log.txt"
        )
    return demo_summary(options, summary, swarm.procs, events, relay_killed)


async def _churn(
    swarm: Swarm, volunteers: list[Proc], newcomers: list[Proc], project: str, console: Console
) -> None:
    """Newcomers join the project; once they serve, a third of the volunteers die."""
    for proc in newcomers:
        await swarm.first_line(proc)  # up (it was started with the swarm)
        await _join(swarm, proc, project)
        console.print(f"churn: {proc.name} joined")
    honest = [v for v in volunteers if v.role in ("honest", "slow") and v.popen.poll() is None]
    victims = honest[: len(newcomers)]
    for v in victims:
        swarm.kill(v)
        v.role += ", killed"
    console.print(f"churn: killed {', '.join(v.name for v in victims)} (SIGKILL)")


async def _join(swarm: Swarm, proc: Proc, project: str) -> None:
    """``proc``, a running node, joins ``project`` through its control API, as the tray
    does from an invite; returns once it serves (its experts declared in the DHT)."""
    client = await trio.to_thread.run_sync(find_node, swarm.root / proc.name / "data")
    try:
        await trio.to_thread.run_sync(client.join, project)
        with trio.fail_after(JOIN_TIMEOUT_S):
            since = 0
            while True:  # the node's event log, long-polled: "experts" once it serves
                events = await trio.to_thread.run_sync(client.events, since, 5.0)
                if any(isinstance(e, ExpertsEvent) and e.experts for e in events):
                    break
                since = max([since, *(e.id for e in events)])
    except (ControlError, trio.TooSlowError) as exc:
        raise UserFacingError(
            f"{proc.name} could not join the project ({exc}); see {swarm.root / proc.name}/log.txt"
        ) from exc
    finally:
        client.close()


async def _forward_ctrl_c(trainer: Proc, console: Console) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            if trainer.popen.poll() is None:
                console.print(
                    "stopping: the trainer evaluates and checkpoints first "
                    "(Ctrl-C again to stop now)"
                )
                trainer.popen.send_signal(signal.SIGTERM)
                break
    # leaving the receiver restores trio's own handling: a second Ctrl-C raises
    # KeyboardInterrupt, and run_demo's cleanup stops every process at once
