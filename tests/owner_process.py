"""A project owner in its own process, for tests that drive the tray and a node process:
publishes a small project and serves it; prints "<address> <project id>" on one line.

    python -m tests.owner_process <work dir>
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from core.namespaces import moehome_validator
from core.project.keys import OwnerKey
from core.project.publish import prepare, serve_project
from net import Identity, Peer
from tests.swarm.test_project import small_manifest


async def main(workdir: Path) -> None:
    prepared = prepare(small_manifest(workdir), OwnerKey.generate(), (), workdir / "owner")
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), validator=moehome_validator()).run
        )
        await nursery.start(serve_project, peer, prepared)
        sys.stdout.write(f"{peer.addrs()[0]} {prepared.signed.project_id}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    trio.run(main, workdir)
