"""What every command group of the ``moehome`` command shares: the global settings, the
options used by several groups, the identity and data folder, and running under trio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from core.errors import UserFacingError, leaf_exceptions

if TYPE_CHECKING:
    from net.identity import Identity


@dataclass
class Settings:
    """The global options (``moehome -v --data-dir ...``), set before any command runs."""

    verbosity: int = 0
    data_dir: Path | None = None


settings = Settings()

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
PublicListenOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--listen",
        "-l",
        help="Multiaddress to listen on (repeatable); other computers must reach it.",
        show_default="/ip4/0.0.0.0/tcp/0 (every interface)",
    ),
]
EphemeralOpt = Annotated[
    bool, typer.Option(help="Use a throwaway identity instead of this computer's key.")
]


def data_folder() -> Path:
    from core.paths import data_dir

    return settings.data_dir or data_dir()


def load_identity(ephemeral: bool, role: str = "node") -> Identity:
    """This computer's key for ``role`` (created on first use; see core.paths.ROLES),
    or a throwaway one."""
    from core.paths import identity_path
    from net.identity import Identity, IdentityError, load_or_create

    if ephemeral:
        return Identity.generate()
    try:
        return load_or_create(identity_path(settings.data_dir, role))
    except IdentityError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@contextmanager
def one_line_errors(*known: type[BaseException]) -> Iterator[None]:
    """Ctrl-C exits with 130; ``known`` failures and UserFacingError with a one-line
    error and 1 (also when trio wrapped them in exception groups); others go on."""
    try:
        yield
    except BaseException as exc:
        leaves = leaf_exceptions(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            if settings.verbosity >= 0:
                typer.echo("stopped", err=True)
            raise typer.Exit(130) from None
        if leaves and all(isinstance(e, (*known, UserFacingError)) for e in leaves):
            for e in leaves:
                typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        raise


def run_async(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``fn(*args)`` under trio, its known failures said in one line."""
    import trio

    from net import DhtError, RpcError
    from net.transport import AddressError, DialError

    with one_line_errors(DhtError, RpcError, DialError, AddressError, ValueError):
        return trio.run(fn, *args)
