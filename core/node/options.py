"""How a node is started (``moehome node`` options; tests set the rest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from net.transport import DEFAULT_LISTEN

if TYPE_CHECKING:  # the options stay light to import (no torch)
    from core.contributing.sender import SumsHook
    from core.experts.answers import AnswerHook
    from net.rpc import ReplyLink


@dataclass(frozen=True)
class NodeOptions:
    data_dir: Path
    config_dir: Path
    #: Project to serve; None: the one joined last time (through the control API), if any.
    project: str | None = None
    bootstrap: Sequence[str] = ()
    #: Where the swarm host listens; empty: every interface, or loopback only when the
    #: volunteer's preference listen_on_network is off.
    listen: Sequence[str] = DEFAULT_LISTEN
    #: Most experts to serve; None: as many as fit in the memory the volunteer allows.
    experts: int | None = None
    control_port: int = 0
    #: Seconds between looks at the swarm's coverage (with +-20% jitter).
    rebalance_every: float = 300.0
    #: Measure the device at start (cached); off in tests that do not need it.
    benchmark: bool = True
    #: Also when asked to measure again (tests; the full run takes ~10 s on a CPU).
    quick_benchmark: bool = False
    #: Seconds between retries after a failed join (doubles up to 10 minutes).
    join_retry: float = 15.0
    #: Seconds between two looks at this node's credit (core/node/credit.py; the first
    #: comes this long after serving starts).
    credit_every_s: float = 600.0
    #: After a start or a join, how long a manifest not found yet is no error (the DHT
    #: is still being reached; the node says "starting" meanwhile).
    first_look_s: float = 60.0
    #: The rig only (core/demo: attacks and cheats): alter the answers this node signs,
    #: and the gradient sums it sends. None, both, in real use.
    answer_hook: AnswerHook | None = None
    sums_hook: SumsHook | None = None
    #: The rig only (net/testing/link.py): hold every answer as a slow link would.
    link: ReplyLink | None = None
