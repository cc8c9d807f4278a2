"""Long-running and one-shot project commands (the CLI's trio entry points)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from core.control.invite import make_invite
from core.namespaces import moehome_validator
from core.project.keys import KeyRotation
from core.project.owner import announce_rotation, project_status
from core.project.publish import Prepared, serve_project
from core.roles.peer import joined_client, print_addresses
from net import Identity, Peer, network_config
from net.host import DEFAULT_LISTEN

log = logging.getLogger(__name__)


async def publish_and_serve(
    identity: Identity,
    prepared: Prepared,
    *,
    listen: Sequence[str] | None,
    bootstrap: Sequence[str],
) -> None:
    config = network_config(listen or DEFAULT_LISTEN, bootstrap)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(identity, config, validator=moehome_validator()).run)
        await nursery.start(serve_project, peer, prepared)
        print_addresses(peer)
        # what volunteers paste into the app (or `moehome join`): this peer, which
        # serves the weights, and the peers it started from
        invite = make_invite(prepared.signed.project_id, [*peer.addrs(), *bootstrap])
        sys.stdout.write(f"invite: {invite.link()}\n")
        sys.stdout.flush()
        log.info("serving project %s; Ctrl-C to stop", prepared.signed.project_id)
        await trio.sleep_forever()


async def status_once(
    identity: Identity, project_id: str, bootstrap: Sequence[str], data_dir: Path
) -> dict[str, Any]:
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:
        return await project_status(peer, project_id, data_dir)


async def announce_rotation_once(
    identity: Identity, rotation: KeyRotation, bootstrap: Sequence[str]
) -> int:
    async with joined_client(identity, bootstrap, validator=moehome_validator()) as peer:
        return await announce_rotation(peer, rotation)
