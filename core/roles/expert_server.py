"""``moehome experts serve``: a peer that serves experts (what a node does, without the
node's benchmark, throttle and project management; for owners' tests and local swarms)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import trio

from core.contributing.sender import SumsHook
from core.contributing.wiring import start_contributing
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.namespaces import moehome_validator
from core.project.joining import join_project
from core.roles.peer import print_addresses
from net import Identity, Peer, network_config, running_last
from net.transport import DEFAULT_LISTEN

log = logging.getLogger(__name__)


def make_backends(uids: Sequence[str], spec: ExpertSpec, seed: int) -> dict[str, ExpertBackend]:
    """Experts with deterministic initial weights: uid i of the list gets seed + i."""
    return {
        uid: ExpertBackend(ExpertUID.parse(uid), spec, build_expert(spec, seed=seed + i))
        for i, uid in enumerate(uids)
    }


async def serve_experts(
    identity: Identity,
    uids: Sequence[str],
    spec: ExpertSpec,
    *,
    seed: int,
    project: str,
    listen: Sequence[str] | None,
    bootstrap: Sequence[str],
    announce_interval: float,
    data_dir: Path,
) -> None:
    """Serve ``uids``. For project 'demo': seeded experts of ``spec``. For a real project
    id: its manifest is fetched and verified (owner key pinned), and the weights too."""
    config = network_config(listen or DEFAULT_LISTEN, bootstrap)
    server_config = ServerConfig(
        project=project, announce_interval=announce_interval, announce_ttl=3 * announce_interval
    )
    # the peer stops last, so that the servers withdraw their declarations over it
    async with (
        running_last(Peer(identity, config, validator=moehome_validator())) as peer,
        trio.open_nursery() as nursery,
    ):
        if project == "demo":
            backends = make_backends(uids, spec, seed)
            await nursery.start(ExpertServer(peer, backends, server_config).run)
        else:
            await serve_project_experts(nursery, peer, project, uids, data_dir, server_config)
        print_addresses(peer)
        log.info("serving %s", ", ".join(uids))
        await trio.sleep_forever()


async def serve_project_experts(
    nursery: trio.Nursery,
    peer: Peer,
    project: str,
    uids: Sequence[str],
    data_dir: Path,
    server_config: ServerConfig,
    *,
    sums_hook: SumsHook | None = None,
) -> ExpertServer:
    """Join the project, serve its experts with receipts required, send contributions to
    its aggregators and pull the new versions they publish. ``sums_hook``: alters the
    contributions (the rig only: core/demo/attacks.py)."""
    signed, backends = await join_project(peer, project, uids, data_dir=data_dir)
    log.info("joined %s (%s)", signed.manifest.project.name, project)
    trainers = frozenset(bytes.fromhex(t.key) for t in signed.manifest.trainers)
    server: ExpertServer = await nursery.start(
        ExpertServer(
            peer, backends, replace(server_config, require_receipts=True, trainers=trainers)
        ).run
    )
    await start_contributing(
        nursery, peer, project, signed.manifest, backends, server, data_dir, sums_hook=sums_hook
    )
    return server
