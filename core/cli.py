"""The ``moehome`` command.

Heavy imports (trio, libp2p, torch) happen inside the commands, so ``moehome --help``
answers at once.
"""

from __future__ import annotations

import json
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
    from core.swarm_peer import run_peer

    _run(run_peer, _identity(ephemeral), listen or None, bootstrap or [])


@dht_app.command("get")
def dht_get(
    key: Annotated[str, typer.Argument(help="A key such as /moehome/demo/hello.")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print every verified record under KEY."""
    from core.swarm_peer import dht_get as do_get

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
    from core.swarm_peer import dht_put as do_put

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
    project: Annotated[str, typer.Option(help="Project id the experts belong to.")] = "demo",
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
    from core.experts.serve import serve_experts
    from core.experts.uid import ExpertUID, UIDError

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
        )
    )


@app.command()
def demo(
    peers: Annotated[
        int, typer.Option(min=1, max=64, help="Peers to start, each its own process.")
    ] = 8,
    gets: Annotated[int, typer.Option(min=1, help="DHT lookups to time.")] = 100,
) -> None:
    """Start a local swarm on 127.0.0.1 and show it working (DHT and RPC).

    Every peer is a separate process; Ctrl-C stops them all.
    """
    from core.demo import run_demo

    _run(run_demo, peers, gets)


def _run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``fn(*args)`` under trio; Ctrl-C exits with 130, known failures with a one-line
    error and 1 (also when trio wrapped them in exception groups)."""
    import trio

    from net import DhtError, RpcError
    from net.host import AddressError, DialError

    known = (DhtError, RpcError, DialError, AddressError, ValueError)
    try:
        return trio.run(fn, *args)
    except BaseException as exc:
        leaves = _leaf_exceptions(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            if _state["verbosity"] >= 0:
                typer.echo("stopped", err=True)
            raise typer.Exit(130) from None
        if leaves and all(isinstance(e, known) for e in leaves):
            for e in leaves:
                typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        raise


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaf_exceptions(sub)]
    return [exc]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
