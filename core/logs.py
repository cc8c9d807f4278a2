"""Logging, set up once for the whole program (CLI, node, tools)."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

_OWN_LOGGERS = ("app", "core", "net", "benchmarks")


def setup_logging(verbosity: int = 0, *, stream: TextIO | None = None) -> None:
    """Configure the root logger.

    verbosity: -1 quiet (warnings only), 0 normal (our INFO), 1 our DEBUG and libp2p's
    warnings, 2 libp2p DEBUG too. libp2p turns off propagation of its logger at import;
    net/ turns it back on, so its records arrive here and follow the same format and
    level. At 0 and -1 libp2p says nothing: its ERROR lines are failures our code
    handles and reports in its own words (704 of them ran through a trainer's progress
    bar in 5 minutes of an owner's project).
    """
    from rich.logging import RichHandler  # rich is only needed once logging is set up

    own_level = (
        logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    )
    out = stream or sys.stderr
    handler: logging.Handler
    if out.isatty():
        handler = RichHandler(
            console=_console(out),
            show_path=verbosity > 0,
            rich_tracebacks=verbosity > 0,
            markup=False,
        )
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        # a file (the tray's node.log, a role's log): one plain line per record, not
        # a terminal's layout padded and wrapped at 80 columns
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    for name in _OWN_LOGGERS:
        logging.getLogger(name).setLevel(own_level)
    libp2p_level = (
        logging.DEBUG if verbosity >= 2 else logging.WARNING if verbosity == 1 else logging.CRITICAL
    )
    logging.getLogger("libp2p").setLevel(libp2p_level)
    # and on the handler: libp2p's import resets its loggers' levels (net/_libp2p.py)
    handler.addFilter(_QuietLibp2p(libp2p_level))
    logging.captureWarnings(True)


class _QuietLibp2p(logging.Filter):
    """Passes libp2p's records only from ``level`` up."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("libp2p") or record.levelno >= self.level


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    if stream is sys.stderr:
        # sys.stderr looked up at each write: a progress bar (rich's Live, the trainer's)
        # swaps it for a proxy that prints log lines above the bar, not through it
        return Console(stderr=True)
    return Console(file=stream)


#: A log file a supervisor appends to is cut at this size (the older half of its life
#: kept beside it as ``<name>.1``): a node whose aggregator was down wrote 3-4.7 MB a
#: minute into a log that was never rotated.
LOG_MAX_BYTES = 8 * 2**20


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES) -> bool:
    """When ``path`` is over ``max_bytes``, move its contents to ``<path>.1`` (replacing
    the one before) and empty it in place: a process that appends to it (O_APPEND, as a
    supervisor opens a child's log) goes on writing at its new start. True if it did."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
        old = path.with_name(path.name + ".1")
        shutil.copyfile(path, old)
        with path.open("r+b") as f:
            f.truncate(0)
    except OSError:  # gone, or not ours to cut: it is tried again at the next check
        return False
    return True
