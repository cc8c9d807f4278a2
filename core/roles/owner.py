"""Long-running and one-shot project commands (the CLI's trio entry points)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import trio

from core.control.invite import make_invite
from core.errors import UserFacingError
from core.namespaces import moehome_validator
from core.project.distribution import announce_project
from core.project.publish import Prepared, serve_project
from core.roles.peer import print_addresses
from net import Identity, Peer, network_config
from net.transport import EVERY_INTERFACE, is_loopback_addr

log = logging.getLogger(__name__)


async def publish_and_serve(
    identity: Identity,
    prepared: Prepared,
    *,
    listen: Sequence[str] | None,
    bootstrap: Sequence[str],
) -> None:
    config = network_config(listen or EVERY_INTERFACE, bootstrap)
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(identity, config, validator=moehome_validator()).run)
        if bootstrap:
            await _first_announcement(peer, prepared, bootstrap)
        await nursery.start(serve_project, peer, prepared)
        print_addresses(peer)
        # what volunteers paste into the app (or `moehome join`): this peer, which
        # serves the weights, and the peers it started from
        addrs = [*peer.addrs(), *bootstrap]
        invite = make_invite(prepared.signed.project_id, addrs)
        sys.stdout.write(f"invite: {invite.link()}\n")
        sys.stdout.flush()
        if all(is_loopback_addr(a) for a in addrs):
            log.warning(
                "the invite names only addresses of this computer (loopback): volunteers "
                "on other computers cannot use it; listen where they reach you "
                "(-l /ip4/0.0.0.0/tcp/4001) and start from peers they reach (-b)"
            )
        log.info("serving project %s; Ctrl-C to stop", prepared.signed.project_id)
        await trio.sleep_forever()


#: How long publishing tries to reach a peer of the swarm before it says it cannot.
ANNOUNCE_TRIES = 5
ANNOUNCE_PAUSE_S = 2.0


async def _first_announcement(peer: Peer, prepared: Prepared, bootstrap: Sequence[str]) -> None:
    """Announce until some peer of the swarm holds the manifest; fail loudly when none
    does (an invite to a project that nobody can find helps no volunteer)."""
    for attempt in range(ANNOUNCE_TRIES):
        if await announce_project(peer, prepared.signed) > 0:
            return
        if attempt + 1 < ANNOUNCE_TRIES:
            await trio.sleep(ANNOUNCE_PAUSE_S)
    connected = len(peer.host.connected_peers())
    raise UserFacingError(
        f"the project was announced to no peer (connected to {connected}): is the peer "
        f"at {', '.join(bootstrap)} running (`moehome peer` prints its address), and is it "
        "another identity than this one (a role's own key: `moehome id --role owner`)?"
    )
