"""The ``moehome`` command.

Heavy imports (trio, libp2p, torch) happen inside the commands, so ``moehome --help``
answers at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from core.logs import setup_logging

if TYPE_CHECKING:
    from net.identity import Identity

app = typer.Typer(
    name="moehome",
    help=(
        "moehome: donate GPU time to train large models, as a decentralized mixture of "
        "experts over a libp2p swarm."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dht_app = typer.Typer(
    help="Read and write signed records in the swarm's DHT.", no_args_is_help=True
)
app.add_typer(dht_app, name="dht")
experts_app = typer.Typer(help="Serve experts (for tests and local swarms).", no_args_is_help=True)
app.add_typer(experts_app, name="experts")
owner_app = typer.Typer(
    help="For project owners: keys, manifests, publishing, status.", no_args_is_help=True
)
app.add_typer(owner_app, name="owner")
aggregator_app = typer.Typer(help="Run an aggregator of a project.", no_args_is_help=True)
app.add_typer(aggregator_app, name="aggregator")

PassphraseFileOpt = Annotated[
    Path | None,
    typer.Option(
        help=(
            "File holding the owner key's passphrase "
            "(else MOEHOME_OWNER_PASSPHRASE, else a prompt)."
        )
    ),
]


def _passphrase(file: Path | None, *, needed: bool = True, confirm: bool = False) -> str | None:
    import os

    if file is not None:
        return file.read_text().strip("\n")
    env = os.environ.get("MOEHOME_OWNER_PASSPHRASE")
    if env is not None:
        return env
    if needed and sys.stdin.isatty():
        return str(
            typer.prompt("owner key passphrase", hide_input=True, confirmation_prompt=confirm)
        )
    return None


def _owner_key(passphrase_file: Path | None) -> Any:
    from core.project.keys import OwnerKey, OwnerKeyError
    from core.project.owner import OwnerFiles

    files = OwnerFiles.default()
    try:
        data = files.key.read_bytes() if files.key.exists() else b""
        encrypted = b"ENCRYPTED" in data
        return OwnerKey.load(files.key, _passphrase(passphrase_file, needed=encrypted)), files
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@owner_app.command("init")
def owner_init(
    protect: Annotated[
        bool,
        typer.Option("--passphrase/--no-passphrase", help="Encrypt the key with a passphrase."),
    ] = False,
    passphrase_file: PassphraseFileOpt = None,
    force: Annotated[bool, typer.Option(help="Replace an existing owner key.")] = False,
) -> None:
    """Create the owner's Ed25519 key and print its fingerprint."""
    from core.project.keys import OwnerKeyError
    from core.project.owner import OwnerFiles, init_owner

    files = OwnerFiles.default()
    secret = _passphrase(passphrase_file, needed=protect, confirm=True) if protect else None
    if protect and not secret:
        typer.echo(
            "error: --passphrase needs a passphrase (a file, the environment, or a terminal)",
            err=True,
        )
        raise typer.Exit(2)
    try:
        key = init_owner(files, secret, force=force)
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"owner key:   {files.key}{' (passphrase-protected)' if secret else ''}")
    typer.echo(f"fingerprint: {key.fingerprint}")
    typer.echo(f"public key:  {key.public_key.hex()}")


@owner_app.command("new")
def owner_new(
    path: Annotated[Path, typer.Argument(help="Where to write the manifest.")] = Path(
        "project.toml"
    ),
    name: Annotated[
        str, typer.Option(help="Project name (lowercase, digits, '-').")
    ] = "my-project",
) -> None:
    """Write a commented project manifest to edit before publishing."""
    from core.project.manifest import write_template

    try:
        write_template(path, name)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"wrote {path}; edit it, then: moehome owner publish {path}")


@owner_app.command("publish")
def owner_publish(
    manifest: Annotated[Path, typer.Argument(help="The project manifest (TOML).")],
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where weights and chunks go (default: beside the manifest)."),
    ] = None,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    passphrase_file: PassphraseFileOpt = None,
    serve: Annotated[
        bool, typer.Option("--serve/--no-serve", help="Stay up serving the weights.")
    ] = True,
) -> None:
    """Check and sign the manifest, make the weights, announce the project, serve it."""
    from rich.progress import Progress

    from core.project.manifest import ManifestError
    from core.project.publish import prepare

    key, files = _owner_key(passphrase_file)
    workdir = workdir or manifest.parent / f"{manifest.stem}.moehome"
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task("making weights", total=None)
            prepared = prepare(
                manifest,
                key,
                files.load_rotations(),
                workdir,
                lambda done, total: progress.update(task, completed=done, total=total),
            )
    except ManifestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    signed = prepared.signed
    typer.echo(f"project id:  {signed.project_id}")
    typer.echo(f"owner:       {key.fingerprint}")
    typer.echo(
        f"experts:     {len(prepared.index.files)} "
        f"({len(list(prepared.store.root.glob('??/*')))} chunks)"
    )
    if not serve:
        return
    from core.roles.owner import publish_and_serve

    _run(
        partial(
            publish_and_serve, _identity(False), prepared, listen=listen, bootstrap=bootstrap or []
        )
    )


@owner_app.command("status")
def owner_status(
    project_id: Annotated[str, typer.Argument(help="The project id printed by publish.")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What the swarm looks like for a project."""
    from core.roles.owner import status_once

    status = _run(partial(status_once, _identity(True), project_id, bootstrap or [], _data_dir()))
    if as_json:
        from core.project.owner import to_json

        typer.echo(to_json(status))
        return
    typer.echo(f"{status['name']} ({status['project_id']}), owner {status['owner']}")
    typer.echo(
        f"experts covered: {status['experts_covered']}/{status['experts_total']}, "
        f"volunteers: {len(status['volunteers'])}"
    )
    for uid, servers in status["experts"].items():
        typer.echo(f"  {uid:<16} {len(servers)} server(s)")
    typer.echo(
        f"weight providers: {len(status['weight_providers'])}, "
        f"aggregators: {len(status['aggregators'])}"
    )
    for agg in status["aggregators"]:
        if "unreachable" in agg:
            typer.echo(f"  aggregator {agg['peer'][-12:]}: unreachable ({agg['unreachable']})")
            continue
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(agg["rejected"].items())) or "none"
        typer.echo(
            f"  aggregator {agg['peer'][-12:]}: {agg['accepted']} accepted, rejected: {rejected}; "
            f"versions {agg['versions']}"
        )


@owner_app.command("rotate-key")
def owner_rotate_key(
    bootstrap: BootstrapOpt = None,
    passphrase_file: PassphraseFileOpt = None,
    new_passphrase_file: Annotated[
        Path | None, typer.Option(help="Passphrase for the new key.")
    ] = None,
) -> None:
    """Replace the owner key; the old key signs the hand-over (announced if -b is given).
    Publish again afterwards: volunteers follow the rotation."""
    from core.project.keys import OwnerKeyError
    from core.project.owner import OwnerFiles, rotate_owner

    files = OwnerFiles.default()
    try:
        data = files.key.read_bytes() if files.key.exists() else b""
        old_secret = _passphrase(passphrase_file, needed=b"ENCRYPTED" in data)
        new_secret = (
            new_passphrase_file.read_text().strip("\n") if new_passphrase_file else old_secret
        )
        rotation = rotate_owner(files, old_secret, new_secret)
    except OwnerKeyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    from core.project.keys import fingerprint

    typer.echo(f"owner key rotated: {fingerprint(rotation.old)} -> {fingerprint(rotation.new)}")
    if bootstrap:
        from core.roles.owner import announce_rotation_once

        replicas = _run(partial(announce_rotation_once, _identity(True), rotation, bootstrap))
        typer.echo(f"rotation announced on {replicas} peers")


@aggregator_app.command("key")
def aggregator_key() -> None:
    """Print this computer's public key, for a manifest's [[aggregators]] or [[trainers]]."""
    identity = _identity(ephemeral=False)
    typer.echo(identity.public_key.hex())


@aggregator_app.command("run")
def aggregator_run(
    project_id: Annotated[str, typer.Option("--project", help="The project id.")],
    workdir: Annotated[
        Path | None, typer.Option(help="State folder (default: <data dir>/aggregator/<project>).")
    ] = None,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Verify and robustly aggregate contributions for this computer's share of the
    project's experts; publish new versions. State survives kill -9 (restart resumes)."""
    from core.roles.aggregator import run_aggregator

    data = _data_dir()
    _run(
        partial(
            run_aggregator,
            _identity(False),
            project_id,
            workdir=workdir or data / "aggregator" / project_id,
            data_dir=data,
            listen=listen,
            bootstrap=bootstrap or [],
        )
    )


@owner_app.command("train")
def owner_train(
    project_id: Annotated[str, typer.Option("--project", help="The project id.")],
    data: Annotated[
        str,
        typer.Option(
            help="Training text: 'stdlib' (Python's own sources) or a folder of text files."
        ),
    ] = "stdlib",
    steps: Annotated[int, typer.Option(min=1, help="Train until this step.")] = 1000,
    batch_size: Annotated[int, typer.Option(min=1, max=4096, help="Sequences per step.")] = 16,
    learning_rate: Annotated[
        float, typer.Option("--lr", min=0, help="Adam's rate for the trainer-side layers.")
    ] = 3e-3,
    eval_every: Annotated[int, typer.Option(min=1, help="Validation every N steps.")] = 100,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] = 50,
    log_every: Annotated[int, typer.Option(min=1, help="Progress every N steps.")] = 10,
    max_data_mb: Annotated[float, typer.Option(min=0.01, help="Read at most this much text.")] = 32,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Checkpoints (default: <data dir>/trainer/<project>); reused to resume."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    device: Annotated[
        str, typer.Option(help="Trainer-side layers on: auto (a GPU if any), cpu, cuda[:N].")
    ] = "auto",
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Train the project's model through the swarm: the trainer-side layers here, the
    experts on volunteers' machines. This computer's key (`moehome aggregator key`) must be
    in the manifest's [[trainers]]. Resumes from its checkpoint after a restart."""
    from core.trainer.progress import TrainingProgress, json_line
    from core.trainer.train import TrainerOptions, run_trainer

    data_dir = _data_dir()
    options = TrainerOptions(
        project=project_id,
        workdir=workdir or data_dir / "trainer" / project_id,
        data=data,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        log_every=log_every,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        max_data_bytes=int(max_data_mb * 1024 * 1024),
        device=device,
    )
    run = partial(
        run_trainer,
        _identity(False),
        options,
        data_dir=data_dir,
        listen=listen,
        bootstrap=bootstrap or [],
    )
    if as_json:
        _run(partial(run, report=json_line))
        return
    with TrainingProgress() as progress:
        _run(partial(run, report=progress))


def _data_dir() -> Path:
    from core.paths import data_dir

    return _state["data_dir"] or data_dir()


_state: dict[str, Any] = {"verbosity": 0, "data_dir": None}


def _version() -> str:
    try:
        return version("moehome")
    except PackageNotFoundError:
        return "0+unknown"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"moehome {_version()}")
        raise typer.Exit


@app.callback()
def _main(
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More log output (-vv: libp2p too).")
    ] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the identity key and data (default: the user's data folder).",
            envvar="MOEHOME_DATA_DIR",
        ),
    ] = None,
    _version_flag: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    _state["verbosity"] = -1 if quiet else verbose
    _state["data_dir"] = data_dir
    setup_logging(_state["verbosity"])


def _identity(ephemeral: bool) -> Identity:
    from core.paths import identity_path
    from net.identity import Identity, IdentityError, load_or_create

    if ephemeral:
        return Identity.generate()
    try:
        return load_or_create(identity_path(_state["data_dir"]))
    except IdentityError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("id")
def show_identity() -> None:
    """Show this computer's peer id (the key is created on first use)."""
    from core.paths import identity_path

    identity = _identity(ephemeral=False)
    typer.echo(f"peer id:  {identity.peer_id}")
    typer.echo(f"key file: {identity_path(_state['data_dir'])}")


ListenOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--listen",
        "-l",
        help="Multiaddress to listen on (repeatable).",
        show_default="/ip4/127.0.0.1/tcp/0",
    ),
]
BootstrapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--bootstrap",
        "-b",
        help="Full address of a peer to join through, ending in /p2p/<id> (repeatable).",
    ),
]
EphemeralOpt = Annotated[
    bool, typer.Option(help="Use a throwaway identity instead of this computer's key.")
]


@app.command()
def peer(
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    ephemeral: EphemeralOpt = False,
) -> None:
    """Run a swarm peer (DHT and RPC, no experts): a bootstrap node for others.

    Prints its full addresses on standard output, one per line, then runs until Ctrl-C.
    """
    from core.roles.peer import run_peer

    _run(run_peer, _identity(ephemeral), listen or None, bootstrap or [])


@dht_app.command("get")
def dht_get(
    key: Annotated[str, typer.Argument(help="A key such as /moehome/demo/hello.")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print every verified record under KEY."""
    from core.roles.peer import dht_get as do_get

    records = _run(do_get, _identity(ephemeral=True), bootstrap or [], key)
    if as_json:
        typer.echo(json.dumps(records))
    elif not records:
        typer.echo("no records")
    for r in [] if as_json else records:
        typer.echo(f"{r['author']}  expires in {r['expires_in_s']:.0f} s  {r['value']!r}")


@dht_app.command("put")
def dht_put(
    key: Annotated[str, typer.Argument(help="A key such as /moehome/demo/hello.")],
    value: Annotated[str, typer.Argument(help="The value (UTF-8 text).")],
    bootstrap: BootstrapOpt = None,
    ttl: Annotated[float, typer.Option(help="Seconds the record lives.")] = 600.0,
    ephemeral: EphemeralOpt = False,
) -> None:
    """Sign VALUE with this computer's key and store it under KEY."""
    from core.roles.peer import dht_put as do_put

    replicas = _run(do_put, _identity(ephemeral), bootstrap or [], key, value.encode(), ttl)
    typer.echo(f"stored on {replicas} peers")


@experts_app.command("serve")
def experts_serve(
    uid: Annotated[
        list[str],
        typer.Option("--uid", "-u", help="Expert uid to serve, e.g. ffn.0.3 (repeatable)."),
    ],
    kind: Annotated[str, typer.Option(help="Expert type: ffn or transformer.")] = "ffn",
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    inner: Annotated[int, typer.Option(help="Feed-forward width (0: 4 x hidden).")] = 0,
    heads: Annotated[int, typer.Option(help="Attention heads (transformer).")] = 0,
    seed: Annotated[int, typer.Option(help="Initial weights: uid i gets seed + i.")] = 0,
    project: Annotated[
        str,
        typer.Option(
            help=(
                "Project id: its manifest and weights are fetched and verified; "
                "'demo' serves seeded local experts."
            )
        ),
    ] = "demo",
    announce_interval: Annotated[
        float, typer.Option(help="Seconds between DHT declarations.")
    ] = 30.0,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    ephemeral: EphemeralOpt = False,
) -> None:
    """Serve experts (forward, backward, info) and declare them in the DHT.

    Prints the peer's full addresses on standard output, then runs until Ctrl-C.
    """
    from core.experts.registry import ExpertSpec, SpecError
    from core.experts.uid import ExpertUID, UIDError
    from core.roles.expert_server import serve_experts

    try:
        spec = ExpertSpec(kind, hidden, inner, heads)
        for u in uid:
            ExpertUID.parse(u)
    except (SpecError, UIDError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    _run(
        partial(
            serve_experts,
            _identity(ephemeral),
            uid,
            spec,
            seed=seed,
            project=project,
            listen=listen,
            bootstrap=bootstrap or [],
            announce_interval=announce_interval,
            data_dir=_data_dir(),
        )
    )


@app.command()
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
        typer.Option(hidden=True, help="Demo/tests: poison contributions (sign-flip, alie)."),
    ] = None,
    reply_delay_ms: Annotated[
        float,
        typer.Option(hidden=True, min=0, help="Demo/tests: answer requests this late."),
    ] = 0.0,
) -> None:
    """Run the volunteer node (what the tray starts): serves experts when allowed."""
    from core.contrib.attacks import ATTACKS

    if attack is not None and attack not in ATTACKS:
        typer.echo(f"error: --attack must be one of {', '.join(ATTACKS)}", err=True)
        raise typer.Exit(2)
    if selftest:
        _node_selftest()
        return
    from core.node.node import Node, NodeOptions
    from core.node.probes import FileProbes, probe_for_this_os
    from core.paths import config_dir

    data = _data_dir()

    async def main() -> None:
        import trio

        options = NodeOptions(
            data_dir=data,
            config_dir=config_dir(),
            project=project,
            bootstrap=tuple(bootstrap or ()),
            listen=tuple(listen or ("/ip4/127.0.0.1/tcp/0",)),
            experts=experts,
            benchmark=benchmark,
            attack=attack,
            reply_delay=reply_delay_ms / 1000,
        )
        probes = FileProbes(fake_probes) if fake_probes else probe_for_this_os()
        async with trio.open_nursery() as nursery:

            async def run_node(*, task_status: trio.TaskStatus[Node]) -> None:
                await Node(_identity(False), options, probes=probes).run(task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped (control API): end the watcher too

            started = await nursery.start(run_node)
            for addr in started.peer.addrs():
                sys.stdout.write(addr + "\n")
            sys.stdout.flush()
            nursery.start_soon(_stop_on_sigterm, started.stop, nursery.cancel_scope)

    _run(main)


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


def _node_selftest() -> None:
    from core.node.selftest import run_selftest

    def report(name: str, ok: bool, detail: str) -> None:
        typer.echo(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    if not _run(run_selftest, report):
        raise typer.Exit(1)
    typer.echo("node selftest: ok")


def _client() -> Any:
    from core.control import NodeNotRunning, find_node

    try:
        return find_node(_data_dir())
    except NodeNotRunning as exc:
        typer.echo(f"error: {exc} (start it with `moehome node`)", err=True)
        raise typer.Exit(1) from exc


@app.command("status")
def node_status(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """What the running node is doing, and why."""
    from core.control import ControlError

    try:
        status = _client().status()
    except ControlError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    typer.echo(f"{status['state']}: {status['reason']}")
    for uid, expert_version in status.get("experts", {}).items():
        typer.echo(f"  serving {uid} (version {expert_version})")


@app.command("pause")
def node_pause() -> None:
    """Pause the running node (until `moehome resume`)."""
    typer.echo(_client().pause()["reason"])


@app.command("resume")
def node_resume() -> None:
    """Resume the running node (also ends a snooze)."""
    typer.echo(_client().resume()["reason"])


@app.command("snooze")
def node_snooze(
    duration: Annotated[str, typer.Argument(help="How long: 30m, 1h, 3h, 1d.")] = "1h",
) -> None:
    """Pause the running node for a while; it resumes by itself."""
    typer.echo(_client().snooze(_seconds(duration))["reason"])


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


@app.command("join")
def node_join(project: Annotated[str, typer.Argument(help="The project id to serve.")]) -> None:
    """Make the running node serve a project (it remembers it)."""
    from core.control import ControlError

    try:
        status = _client().join(project)
    except ControlError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"{status['state']}: {status['reason']}")


@app.command("leave")
def node_leave() -> None:
    """Make the running node leave its project."""
    status = _client().leave()
    typer.echo(f"{status['state']}: {status['reason']}")


@app.command("prefs")
def node_prefs(
    changes: Annotated[
        list[str] | None,
        typer.Argument(help='name=value pairs (values in JSON: 70, true, [0], "18:00").'),
    ] = None,
) -> None:
    """Show the running node's preferences, or change some (validated by the node)."""
    from core.control import ControlError

    client = _client()
    try:
        if not changes:
            prefs = client.preferences()
        else:
            prefs = client.set_preferences(dict(_assignment(c) for c in changes))
    except ControlError as exc:
        for problem in exc.problems or [str(exc)]:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1) from exc
    for name, value in prefs.items():
        typer.echo(f"{name:<20} {json.dumps(value)}")


def _assignment(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise typer.BadParameter(f"{text!r}: write name=value")
    try:
        return name.strip(), json.loads(raw)
    except ValueError:
        return name.strip(), raw  # a bare word: a string


@app.command()
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
            _data_dir() / "device-benchmark.json", force=again, quick=quick, progress=step
        )
    if bootstrap:
        result.update(_run(_network_rtt, bootstrap))
    for key, value in result.items():
        typer.echo(f"{key:<22} {value}")


async def _network_rtt(bootstrap: list[str]) -> dict[str, Any]:
    from core.node.bench import network_rtt_ms
    from core.roles.peer import joined_client
    from net import Identity

    async with joined_client(Identity.generate(), bootstrap) as peer:
        return await network_rtt_ms(peer)


@app.command()
def demo(
    volunteers: Annotated[
        int, typer.Option(min=1, max=32, help="Volunteer nodes, each its own process.")
    ] = 4,
    steps: Annotated[int, typer.Option(min=1, help="Training steps of the trainer.")] = 200,
    churn: Annotated[
        bool, typer.Option(help="Kill a third of the volunteers mid-run; as many new ones join.")
    ] = False,
    attackers: Annotated[
        int, typer.Option(min=0, max=32, help="Extra volunteers that poison their gradients.")
    ] = 0,
    attack: Annotated[str, typer.Option(help="What attackers send: sign-flip or alie.")] = (
        "sign-flip"
    ),
    slow: Annotated[
        int, typer.Option(min=0, max=32, help="Volunteers behind a slow link (of --volunteers).")
    ] = 0,
    slow_ms: Annotated[float, typer.Option(min=0, help="The slow link's delay per message.")] = 100,
    rule: Annotated[
        str, typer.Option(help="Aggregation rule: centered_clip, median, trimmed_mean, mean.")
    ] = "centered_clip",
    data: Annotated[
        str, typer.Option(help="Training text: 'stdlib' or a folder of text files.")
    ] = "stdlib",
    workdir: Annotated[
        Path | None, typer.Option(help="Keep every process's files here (default: a temp folder).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Train a small language model on a local swarm: a bootstrap peer, the owner
    publishing a project, an aggregator, volunteer nodes and a trainer, each its own
    process on 127.0.0.1. Live progress, then a summary. Ctrl-C stops everything."""
    from core.aggregator.robust import RULES
    from core.contrib.attacks import ATTACKS
    from core.demo import DemoOptions, print_summary, run_demo

    if attack not in ATTACKS:
        typer.echo(f"error: --attack must be one of {', '.join(ATTACKS)}", err=True)
        raise typer.Exit(2)
    if slow > volunteers:
        typer.echo("error: --slow cannot exceed --volunteers", err=True)
        raise typer.Exit(2)
    if rule not in RULES:
        typer.echo(f"error: --rule must be one of {', '.join(RULES)}", err=True)
        raise typer.Exit(2)
    options = DemoOptions(
        volunteers=volunteers,
        steps=steps,
        churn=churn,
        attackers=attackers,
        attack=attack,
        slow=slow,
        slow_ms=slow_ms,
        rule=rule,
        data=data,
        workdir=workdir,
    )
    summary = _run(partial(run_demo, options, quiet=as_json))
    if as_json:
        typer.echo(json.dumps(summary))
    elif summary is not None:
        print_summary(summary)


@dht_app.command("demo")
def network_demo(
    peers: Annotated[
        int, typer.Option(min=1, max=64, help="Peers to start, each its own process.")
    ] = 8,
    gets: Annotated[int, typer.Option(min=1, help="DHT lookups to time.")] = 100,
) -> None:
    """Start a local swarm on 127.0.0.1 and show it working (DHT and RPC).

    Every peer is a separate process; Ctrl-C stops them all.
    """
    from core.network_demo import run_demo

    _run(run_demo, peers, gets)


def _run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``fn(*args)`` under trio; Ctrl-C exits with 130, known failures with a one-line
    error and 1 (also when trio wrapped them in exception groups)."""
    import trio

    from core.errors import UserFacingError, leaf_exceptions
    from net import DhtError, RpcError
    from net.host import AddressError, DialError

    known = (DhtError, RpcError, DialError, AddressError, ValueError, UserFacingError)
    try:
        return trio.run(fn, *args)
    except BaseException as exc:
        leaves = leaf_exceptions(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            if _state["verbosity"] >= 0:
                typer.echo("stopped", err=True)
            raise typer.Exit(130) from None
        if leaves and all(isinstance(e, known) for e in leaves):
            for e in leaves:
                typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        raise


def main() -> None:
    app()


if __name__ == "__main__":
    main()
