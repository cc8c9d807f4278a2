"""A process hosting some of the emulated swarm's volunteers (core/demo/emulated.py).

Every volunteer runs its DHT work, its RPCs and its contributions in Python; in one
process they share one event loop, which at 16 volunteers lagged 0.3-0.7 s and made the
CPU, not the scheduling, decide the measured throughput. Spread over a few processes
they use every core. Started as ``python -m core.demo.emulated_host SPEC`` (SPEC: a
:class:`HostSpec` in JSON); it prints ``ready`` once every volunteer serves, then runs
until it is killed, or until the process that started it is gone.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from core.demo.rig import node_hooks
from core.experts.batching import Pace
from core.experts.server import ServerConfig
from core.files import replace_file
from core.namespaces import moehome_validator
from core.orphans import until_orphaned
from core.project.distribution import ProjectNotFound
from core.roles.expert_server import serve_project_experts
from net import Identity, Peer, network_config
from net.testing.link import EmulatedLink

log = logging.getLogger(__name__)

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
READY = b"ready\n"
#: a spec longer than this is not one we wrote
_MAX_SPEC = 1 << 20
#: how long a volunteer looks for a manifest the swarm does not show it yet (a node's
#: first look, core/node/options.py first_look_s) before its host gives up, and every
#: how many seconds it looks meanwhile
FIRST_LOOK_S = 60.0
LOOK_AGAIN_S = 2.0
#: how often a host writes its volunteers' DHT statistics (``dht_statistics_path``)
DHT_STATISTICS_EVERY_S = 2.0


@dataclass(frozen=True)
class HostSpec:
    bootstrap: list[str]
    project: str
    #: the experts of each volunteer hosted here
    experts: list[list[str]]
    #: this host's number (names its volunteers' data directories)
    host: int
    workdir: str
    seconds_per_row: float
    #: the volunteers' link: seconds added to each answer, and upload bytes per second
    delay: float
    upload: float
    announce_seconds: float
    announce_ttl: float
    #: which of this host's volunteers (indices into ``experts``) cheat, and how (a
    #: gradient attack of core/demo/attacks.py or an answer cheat of
    #: core/demo/cheats.py)
    attacking: list[int] = field(default_factory=list)
    attack: str = ""
    #: which of this host's volunteers sit behind a link ``slow_delay`` seconds long
    slow: list[int] = field(default_factory=list)
    slow_delay: float = 0.0
    #: the pid of the run that started this host (start_host's), which it ends with
    #: (0: the process that started it, as seen once it runs)
    parent: int = 0

    def server_config(self) -> ServerConfig:
        return ServerConfig(
            project=self.project,
            pace=per_row(self.seconds_per_row),
            announce_interval=self.announce_seconds,
            announce_ttl=self.announce_ttl,
        )


def per_row(seconds: float) -> Pace | None:
    """The pace of a volunteer that spends ``seconds`` per forward row (None: 0)."""
    return partial(operator.mul, seconds) if seconds > 0 else None


async def start_peer(
    nursery: trio.Nursery, bootstrap: list[str], *, link: tuple[float, float] | None = None
) -> Peer:
    """A peer on loopback; ``link``: its emulated link (delay s, upload bytes/s)."""
    config = network_config([LOOPBACK], bootstrap)
    if link is not None:
        delay, upload = link
        config = replace(
            config,
            rpc=replace(config.rpc, link=EmulatedLink(delay, upload)),
        )
    peer: Peer = await nursery.start(
        Peer(Identity.generate(), config, validator=moehome_validator()).run
    )
    return peer


async def serve_volunteers(
    nursery: trio.Nursery, spec: HostSpec, started: list[Peer] | None = None
) -> list[str]:
    """Start the spec's volunteers in ``nursery``; returns their peer ids once each
    serves (their peers appended to ``started``, for their statistics)."""
    honest = spec.server_config()
    peers = []
    for i, mine in enumerate(spec.experts):
        delay = spec.slow_delay if i in spec.slow else spec.delay
        volunteer = await start_peer(nursery, spec.bootstrap, link=(delay, spec.upload))
        if started is not None:
            started.append(volunteer)
        data_dir = Path(spec.workdir) / f"host{spec.host}" / f"volunteer{i}"
        cheats = i in spec.attacking
        answer_hook, sums_hook = node_hooks(spec.attack if cheats else None)
        config = replace(honest, answer_hook=answer_hook)
        since = trio.current_time()
        while True:
            try:
                await serve_project_experts(
                    nursery, volunteer, spec.project, mine, data_dir, config, sums_hook=sums_hook
                )
                break
            except ProjectNotFound as exc:
                # a join that fails starts nothing: look again, as a node does for its
                # first minute (32 volunteers joining at once on a loaded computer once
                # missed the manifest, and the whole run died at its start)
                if trio.current_time() - since >= FIRST_LOOK_S:
                    raise
                log.info("volunteer %d: %s; looking again in %.0f s", i, exc, LOOK_AGAIN_S)
                await trio.sleep(LOOK_AGAIN_S)
        peers.append(str(volunteer.peer_id))
    return peers


async def start_host(nursery: trio.Nursery, spec: HostSpec) -> list[str]:
    """Start a host process for ``spec``'s volunteers; returns their peer ids once they
    all serve. The process is killed when ``nursery`` is cancelled."""
    spec = replace(spec, parent=os.getpid())
    command = [sys.executable, "-m", "core.demo.emulated_host", json.dumps(asdict(spec))]
    process: trio.Process = await nursery.start(
        partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
    )
    assert process.stdout is not None
    seen = b""
    while READY not in seen:
        chunk = await process.stdout.receive_some(4096)
        if not chunk:
            raise RuntimeError(f"volunteer host {spec.host} exited before serving")
        seen += chunk
    # the line before "ready": the volunteers' peer ids
    peers = json.loads(seen[: seen.index(READY)].strip().splitlines()[-1])
    return [str(p) for p in peers]


def dht_statistics_path(workdir: str | Path, host: int) -> Path:
    """Where host ``host`` writes its volunteers' DHT statistics, summed."""
    return Path(workdir) / f"host{host}" / "dht.json"


def add_dht_statistics(total: dict[str, Any], figures: Mapping[str, Any]) -> None:
    """Add ``figures`` (``DhtStatistics.as_dict``: counts, and counts by name) to ``total``."""
    for name, value in figures.items():
        if isinstance(value, dict):
            total[name] = dict(Counter(total.get(name, {})) + Counter(value))
        else:
            total[name] = total.get(name, 0) + value


def summed_dht_statistics(peers: Sequence[Peer]) -> dict[str, Any]:
    """The DHT statistics (net/dht/node.py ``DhtStatistics``) of ``peers``, summed."""
    total: dict[str, Any] = {}
    for peer in peers:
        add_dht_statistics(total, peer.dht.statistics().as_dict())
    return total


async def write_dht_statistics(
    peers: Sequence[Peer], path: Path, since: float, every: float = DHT_STATISTICS_EVERY_S
) -> None:
    """Every ``every`` seconds, ``peers``' DHT statistics, summed, with how many peers
    and the seconds since ``since`` (trio time): what the host's volunteers' DHT cost
    (the host is killed at the run's end; its last file is at most ``every`` old)."""
    while True:
        await trio.sleep(every)
        figures = {
            "peers": len(peers),
            "seconds": trio.current_time() - since,
            **summed_dht_statistics(peers),
        }
        replace_file(path, json.dumps(figures))


async def _end_with_the_run(run: int, scope: trio.CancelScope) -> None:
    """A host serves the run that started it (pid ``run``; 0: this process's parent)
    and nobody else: when that run is gone (killed, so it could not stop its hosts), the
    host stops too."""
    await until_orphaned(run or None)
    log.warning("the run that started this host is gone: stopping")
    scope.cancel()


async def _host(spec: HostSpec) -> None:
    since = trio.current_time()
    volunteers: list[Peer] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_end_with_the_run, spec.parent, nursery.cancel_scope)
        peers = await serve_volunteers(nursery, spec, volunteers)
        nursery.start_soon(
            write_dht_statistics, volunteers, dht_statistics_path(spec.workdir, spec.host), since
        )
        sys.stdout.buffer.write(json.dumps(peers).encode() + b"\n" + READY)
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or len(args[0]) > _MAX_SPEC:
        raise SystemExit("usage: python -m core.demo.emulated_host SPEC_JSON")
    spec = HostSpec(**json.loads(args[0]))
    logging.basicConfig(level=logging.WARNING, format=f"host{spec.host} %(name)s: %(message)s")
    trio.run(_host, spec)


if __name__ == "__main__":
    main()
