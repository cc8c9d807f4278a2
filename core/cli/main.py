"""The ``moehome`` command: the global options, and the command groups of
core/cli/{volunteer,owner,swarm,demo}.py.

Heavy imports (trio, libp2p, torch) happen inside the commands, so ``moehome --help``
answers at once.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated

import typer

from core.cli.common import settings
from core.cli.credit import credit_app
from core.cli.demo import demo_app
from core.cli.models import register_model_commands
from core.cli.owner import aggregator_app, owner_app
from core.cli.swarm import dht_app, experts_app, swarm_app
from core.cli.volunteer import volunteer_app
from core.logs import setup_logging

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
app.add_typer(volunteer_app)
app.add_typer(demo_app)
app.add_typer(swarm_app)
register_model_commands(owner_app)
app.add_typer(owner_app, name="owner")
app.add_typer(credit_app, name="credit")
app.add_typer(aggregator_app, name="aggregator")
app.add_typer(dht_app, name="dht")
app.add_typer(experts_app, name="experts")


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
    settings.verbosity = -1 if quiet else verbose
    settings.data_dir = data_dir
    setup_logging(settings.verbosity)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
