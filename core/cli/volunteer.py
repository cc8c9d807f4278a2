"""The volunteer's commands: ``moehome node`` runs the node; ``status``, ``pause``,
``resume``, ``snooze``, ``join``, ``leave``, ``stop`` and ``prefs`` talk to it through its
control API; ``bench`` measures this device."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from core.cli.common import (
    BootstrapOpt,
    ListenOpt,
    data_folder,
    load_identity,
    run_async,
)
from core.control import ControlClient, ControlError, NodeNotRunning, find_node
from core.control.invite import InviteError, parse_invite
from core.control.models import Status

T = TypeVar("T")
log = logging.getLogger(__name__)

volunteer_app = typer.Typer()


@volunteer_app.command()
def node(
    project: Annotated[
        str | None, typer.Option(help="Project id to serve (else: join the swarm only).")
    ] = None,
    experts: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Most experts to serve (default: as many as fit)."),
    ] = None,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    fake_probes: Annotated[
        Path | None,
        typer.Option(hidden=True, help="Tests: read the machine's state from this JSON file."),
    ] = None,
    benchmark: Annotated[
        bool, typer.Option(help="Measure the device at start (cached after the first time).")
    ] = True,
    selftest: Annotated[
        bool,
        typer.Option("--selftest", help="Check this install (device, libp2p, an expert) and exit."),
    ] = False,
    attack: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="Demo/tests: poison contributions (sign-flip, alie) or answers "
            "(scaled-answers, noised-answers, lazy-answers, stale-answers).",
        ),
    ] = None,
    reply_delay_ms: Annotated[
        float,
        typer.Option(hidden=True, min=0, help="Demo/tests: answer requests this late."),
    ] = 0.0,
    exit_with_parent: Annotated[
        bool,
        typer.Option(
            "--exit-with-parent",
            hidden=True,
            help="Stop when the process that started this one ends (what the tray asks).",
        ),
    ] = False,
) -> None:
    """Run the volunteer node (what the tray starts): serves experts when allowed."""
    # the tray, known before the node's slow imports: a tray gone meanwhile has handed
    # this process to another parent already
    parent = os.getppid()
    link = None
    if reply_delay_ms > 0:  # the rig is loaded only when asked for
        from net.testing.link import EmulatedLink

        link = EmulatedLink(delay=reply_delay_ms / 1000)
    answer_hook = sums_hook = None
    if attack is not None:  # the rig is loaded only when asked for
        from core.demo.rig import KNOWN, node_hooks

        if attack not in KNOWN:
            typer.echo(f"error: --attack must be one of {', '.join(KNOWN)}", err=True)
            raise typer.Exit(2)
        answer_hook, sums_hook = node_hooks(attack)
    if selftest:
        _node_selftest()
        return
    from core.node.node import Node, NodeOptions
    from core.node.probes import FileProbes, probe_for_this_os
    from core.paths import config_dir

    data = data_folder()

    async def main() -> None:
        import trio

        options = NodeOptions(
            data_dir=data,
            config_dir=config_dir(),
            project=project,
            bootstrap=tuple(bootstrap or ()),
            listen=tuple(listen or ()),  # none: as the preferences say
            experts=experts,
            benchmark=benchmark,
            answer_hook=answer_hook,
            sums_hook=sums_hook,
            link=link,
        )
        probes = FileProbes(fake_probes) if fake_probes else probe_for_this_os()
        async with trio.open_nursery() as nursery:

            async def run_node(*, task_status: trio.TaskStatus[Node]) -> None:
                await Node(load_identity(False), options, probes=probes).run(
                    task_status=task_status
                )
                nursery.cancel_scope.cancel()  # stopped (control API): end the watcher too

            started = await nursery.start(run_node)
            for addr in started.peer.addrs():
                sys.stdout.write(addr + "\n")
            sys.stdout.flush()
            nursery.start_soon(_stop_on_sigterm, started.stop, nursery.cancel_scope)
            if exit_with_parent:
                nursery.start_soon(_stop_when_orphaned, parent, started.stop, nursery.cancel_scope)

    run_async(main)


async def _stop_on_sigterm(stop: Callable[[], None], scope: Any) -> None:
    """SIGTERM (what a supervisor sends) stops the node as cleanly as Ctrl-C: its
    declarations are withdrawn before it exits."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            stop()
            scope.cancel()
            return


async def _stop_when_orphaned(parent: int, stop: Callable[[], None], scope: Any) -> None:
    """The tray (pid ``parent``) started this node: when the tray is gone (quit without
    a word, killed, crashed), the node stops as cleanly as on SIGTERM, within a second."""
    # here, not at the top: trio and psutil would add ~0.2 s to every light command
    # (status, pause...) that this module also serves; core.cli is the top layer
    from core.orphans import until_orphaned

    await until_orphaned(parent)
    log.warning("the app that started this node is gone: stopping")
    stop()
    scope.cancel()


def _node_selftest() -> None:
    from core.node.selftest import run_selftest

    def report(name: str, ok: bool, detail: str) -> None:
        typer.echo(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    ok = run_async(run_selftest, report)
    ok = _training_text_check(report) and ok
    if not ok:
        raise typer.Exit(1)
    typer.echo("node selftest: ok")


def _training_text_check(report: Callable[[str, bool, str], None]) -> bool:
    """`moehome demo`'s default text is there (a packaged build carries its own copy)."""
    from core.data.errors import DataError
    from core.trainer.data import STDLIB, load_corpus

    try:
        corpus = load_corpus(STDLIB, max_bytes=2**20)
    except DataError as exc:
        report("training text", False, str(exc))
        return False
    report("training text", True, f"{corpus.total_bytes} bytes of {STDLIB} text for the demo")
    return True


#: What a command says when no node answers (the tray starts one; so does `moehome node`).
NOT_RUNNING = "error: the moehome node is not running; start the moehome app, or `moehome node`"


def _ask(action: Callable[[ControlClient], T]) -> T:
    """One command to the running node. A node that is not running, or a refusal, is one
    line on standard error (each field's problem on its own line) and exit code 1: never
    a traceback."""
    try:
        client = find_node(data_folder())
    except NodeNotRunning as exc:
        typer.echo(NOT_RUNNING, err=True)
        raise typer.Exit(1) from exc
    try:
        return action(client)
    except NodeNotRunning as exc:
        typer.echo(NOT_RUNNING, err=True)
        raise typer.Exit(1) from exc
    except ControlError as exc:
        for problem in exc.problems or [str(exc)]:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1) from exc
    finally:
        client.close()


def state_line(status: Status) -> str:
    """ "working", "paused: you are using the computer": the reason only when it says more
    than the state ("working: working" said nothing twice)."""
    if not status.reason or status.reason == status.state:
        return status.state
    return f"{status.state}: {status.reason}"


@volunteer_app.command("status")
def node_status(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What the running node is doing, and why."""
    status = _ask(lambda c: c.status())
    if as_json:
        typer.echo(status.model_dump_json(indent=2))
        return
    typer.echo(state_line(status))
    for uid, expert_version in status.experts.items():
        typer.echo(f"  serving {uid} (version {expert_version})")
    if status.device.computes_on:
        typer.echo(f"computing on: {status.device.computes_on}")
    if status.device.warning:
        typer.echo(f"  warning: {status.device.warning}")
    if status.network.reachability:
        typer.echo(f"network: {status.network.reachability}")
    if status.network.advice:
        typer.echo(f"  what you can do: {status.network.advice}")
    credit = status.credit
    if credit.checked_at is not None:
        rank = "" if credit.rank is None else f", #{credit.rank} of {credit.ranked} on the project"
        typer.echo(
            f"credit: {credit.today:,.0f} today, {credit.total:,.0f} in all{rank}, signed by "
            f"{credit.aggregators} of {credit.aggregators_listed} aggregator(s); "
            f"proof: {credit.proof}"
        )


@volunteer_app.command("pause")
def node_pause() -> None:
    """Pause the running node (until `moehome resume`)."""
    typer.echo(_ask(lambda c: c.pause()).reason)


@volunteer_app.command("resume")
def node_resume() -> None:
    """Resume the running node (also ends a snooze)."""
    typer.echo(_ask(lambda c: c.resume()).reason)


@volunteer_app.command("snooze")
def node_snooze(
    duration: Annotated[str, typer.Argument(help="How long: 30m, 1h, 3h, 1d.")] = "1h",
) -> None:
    """Pause the running node for a while; it resumes by itself."""
    seconds = _seconds(duration)
    typer.echo(_ask(lambda c: c.snooze(seconds)).reason)


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = duration.strip().lower()
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text) * 60
    except ValueError:
        value = -1
    if not 0 < value <= 7 * 86400:
        raise typer.BadParameter(f"{duration!r}: a duration up to a week, like 30m, 2h or 1d")
    return value


@volunteer_app.command("join")
def node_join(
    invite: Annotated[
        str, typer.Argument(help="The invite link (moehome://join/...) or the project id.")
    ],
) -> None:
    """Make the running node serve a project (it remembers it). The node first finds the
    project's signed manifest, through the invite's peers, and checks it."""
    try:
        parsed = parse_invite(invite)
    except InviteError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"looking for project {parsed.project}\N{HORIZONTAL ELLIPSIS}", err=True)
    status = _ask(lambda c: c.join(parsed.project, parsed.peers))
    typer.echo(f"joined {status.project_name or status.project}")
    typer.echo(state_line(status))


@volunteer_app.command("leave")
def node_leave() -> None:
    """Make the running node leave its project."""
    status = _ask(lambda c: c.leave())
    typer.echo(state_line(status))


@volunteer_app.command("stop")
def node_stop(
    wait: Annotated[float, typer.Option(help="Seconds to wait for it to end.", min=1)] = 30.0,
) -> None:
    """Stop the running node cleanly (it withdraws what it serves first); the tray app,
    when it runs, quits with it."""
    import time

    _ask(lambda c: c.shutdown())
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            client = find_node(data_folder())
            try:
                client.status()
            finally:
                client.close()
        except NodeNotRunning:
            typer.echo("the node stopped")
            return
        except ControlError:
            pass
        time.sleep(0.2)
    typer.echo(f"error: the node is still running after {wait:.0f} s", err=True)
    raise typer.Exit(1)


@volunteer_app.command("prefs")
def node_prefs(
    changes: Annotated[
        list[str] | None,
        typer.Argument(help='name=value pairs (values in JSON: 70, true, [0], "18:00").'),
    ] = None,
) -> None:
    """Show the running node's preferences, or change some (validated by the node)."""
    assignments = dict(_assignment(c) for c in changes or [])
    if assignments:
        prefs = _ask(lambda c: c.set_preferences(assignments))
    else:
        prefs = _ask(lambda c: c.preferences())
    for name, value in prefs.model_dump(mode="json").items():
        typer.echo(f"{name:<20} {json.dumps(value)}")


def _assignment(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise typer.BadParameter(f"{text!r}: write name=value")
    try:
        return name.strip(), json.loads(raw)
    except ValueError:
        return name.strip(), raw  # a bare word: a string


@volunteer_app.command()
def bench(
    again: Annotated[
        bool, typer.Option("--again", help="Measure even if cached figures exist.")
    ] = False,
    quick: Annotated[bool, typer.Option(help="A short run.")] = False,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Measure this device (cached per device, driver and torch version); with
    --bootstrap, also the round trip to a few peers of the swarm (not cached)."""
    from rich.progress import Progress

    from core.node.bench import cached_benchmark

    with Progress(transient=True) as progress:
        task = progress.add_task("benchmark", total=None)

        def step(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total)

        result = cached_benchmark(
            data_folder() / "device-benchmark.json", force=again, quick=quick, progress=step
        )
    if bootstrap:
        result.update(run_async(_network_rtt, bootstrap))
    for key, value in result.items():
        typer.echo(f"{key:<22} {value}")


async def _network_rtt(bootstrap: list[str]) -> dict[str, Any]:
    from core.node.bench import network_rtt_ms
    from core.roles.peer import joined_client
    from net import Identity

    async with joined_client(Identity.generate(), bootstrap) as peer:
        return await network_rtt_ms(peer)
