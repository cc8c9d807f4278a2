"""Logging, set up once for the whole program (CLI, node, tools)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

_OWN_LOGGERS = ("app", "core", "net", "benchmarks")


def setup_logging(verbosity: int = 0, *, stream: TextIO | None = None) -> None:
    """Configure the root logger.

    verbosity: -1 quiet (warnings only), 0 normal (our INFO), 1 our DEBUG, 2 libp2p DEBUG too.
    libp2p turns off propagation of its logger at import; net/ turns it back on, so its
    records arrive here and follow the same format and level.
    """
    from rich.logging import RichHandler  # rich is only needed once logging is set up

    own_level = (
        logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    )
    handler = RichHandler(
        console=_console(stream or sys.stderr),
        show_path=verbosity > 0,
        rich_tracebacks=verbosity > 0,
        markup=False,
    )
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    for name in _OWN_LOGGERS:
        logging.getLogger(name).setLevel(own_level)
    logging.getLogger("libp2p").setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    logging.captureWarnings(True)


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    return Console(file=stream, stderr=stream is sys.stderr)
