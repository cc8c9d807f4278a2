"""``moehome id``, ``peer``, ``dht ...`` and ``experts serve``: the swarm's parts on their
own (bootstrap peers, records, expert servers for tests and local swarms)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Annotated

import typer

from core.cli.common import (
    BootstrapOpt,
    EphemeralOpt,
    ListenOpt,
    PublicListenOpt,
    data_folder,
    load_identity,
    run_async,
    settings,
)

swarm_app = typer.Typer()
dht_app = typer.Typer(
    help="Read and write signed records in the swarm's DHT.", no_args_is_help=True
)
experts_app = typer.Typer(help="Serve experts (for tests and local swarms).", no_args_is_help=True)


@swarm_app.command("id")
def show_identity(
    role: Annotated[
        str,
        typer.Option(
            help="Whose identity: node (the volunteer's), peer, owner, aggregator or trainer."
        ),
    ] = "node",
) -> None:
    """Show this computer's peer id for a role (each role has its own key, created on
    first use)."""
    from core.paths import ROLES, identity_path

    if role not in ROLES:
        typer.echo(f"error: --role is one of {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    identity = load_identity(ephemeral=False, role=role)
    typer.echo(f"peer id:    {identity.peer_id}")
    typer.echo(f"public key: {identity.public_key.hex()}")
    typer.echo(f"key file:   {identity_path(settings.data_dir, role)}")


@swarm_app.command()
def peer(
    listen: PublicListenOpt = None,
    bootstrap: BootstrapOpt = None,
    ephemeral: EphemeralOpt = False,
    recheck_s: Annotated[
        float | None,
        typer.Option(
            "--recheck-s",
            min=0.1,
            help="Seconds between reachability checks while the answer is unknown.",
            hidden=True,
        ),
    ] = None,
    observe_s: Annotated[
        float | None,
        typer.Option(
            "--observe-s",
            min=0.1,
            help="Seconds between asking a peer which address it sees us at.",
            hidden=True,
        ),
    ] = None,
    dead_after_s: Annotated[
        int | None,
        typer.Option(
            "--dead-after-s",
            min=6,
            help="Seconds before a connection that died silently is dropped (default 30).",
            hidden=True,
        ),
    ] = None,
    relay_circuit_mib: Annotated[
        float | None,
        typer.Option(
            "--relay-circuit-mib",
            min=0.01,
            help="Bytes one relayed connection may carry one way (MiB; default 64).",
            hidden=True,
        ),
    ] = None,
    map_port: Annotated[
        bool,
        typer.Option(
            "--map-port",
            help="Ask the home router (UPnP) to forward the listening port while running.",
        ),
    ] = False,
) -> None:
    """Run a swarm peer (DHT and RPC, no experts): a bootstrap node for others.

    Prints its full addresses on standard output, one per line, then a JSON line each
    time it learns whether others can dial it; runs until Ctrl-C.
    """
    from core.roles.peer import run_peer
    from net.reach import ReachabilityConfig, RelayLimits
    from net.transport import Keepalive

    reach = ReachabilityConfig()
    if recheck_s is not None:
        reach = replace(reach, unknown_recheck_s=recheck_s)
    if observe_s is not None:
        reach = replace(reach, observe_s=observe_s)
    run_async(
        partial(
            run_peer,
            map_port=map_port,
            keepalive=Keepalive.within(dead_after_s) if dead_after_s else None,
            relay_limits=RelayLimits(circuit_bytes=int(relay_circuit_mib * 2**20))
            if relay_circuit_mib
            else RelayLimits(),
        ),
        load_identity(ephemeral, role="peer"),
        listen or None,
        bootstrap or [],
        reach,
    )


@dht_app.command("get")
def dht_get(
    key: Annotated[str, typer.Argument(help="A key such as /moehome/demo/hello.")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print every verified record under KEY."""
    from core.roles.peer import dht_get as do_get

    records = run_async(do_get, load_identity(ephemeral=True), bootstrap or [], key)
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

    replicas = run_async(
        do_put, load_identity(ephemeral), bootstrap or [], key, value.encode(), ttl
    )
    typer.echo(f"stored on {replicas} peers")


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
    from core.demo.network import run_demo

    run_async(run_demo, peers, gets)


@experts_app.command("serve")
def experts_serve(
    uid: Annotated[
        list[str],
        typer.Option("--uid", "-u", help="Expert uid to serve, e.g. ffn.0.3 (repeatable)."),
    ],
    kind: Annotated[str, typer.Option(help="Expert type: ffn or swiglu.")] = "ffn",
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    inner: Annotated[int, typer.Option(help="Feed-forward width (0: 4 x hidden).")] = 0,
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
        # each kind's default activation, as a manifest's: silu makes swiglu SwiGLU
        activation = "silu" if kind == "swiglu" else "gelu"
        spec = ExpertSpec(kind, hidden, inner, activation=activation)
        for u in uid:
            ExpertUID.parse(u)
    except (SpecError, UIDError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    run_async(
        partial(
            serve_experts,
            load_identity(ephemeral),
            uid,
            spec,
            seed=seed,
            project=project,
            listen=listen,
            bootstrap=bootstrap or [],
            announce_interval=announce_interval,
            data_dir=data_folder(),
        )
    )
