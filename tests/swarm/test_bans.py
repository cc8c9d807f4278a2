"""Project bans on real peers: a trainer of the manifest publishes a ban that every
reader honours; a ban by a peer the manifest does not list is ignored; the owner's
pardon (a manifest published again) and the ban's end lift it."""

from __future__ import annotations

import math

import trio

from core.namespaces import moehome_validator
from core.project.bans import BanBoard
from core.project.keys import OwnerKey
from core.project.publish import prepare
from core.protocol.bans import Ban
from net.testing import open_swarm
from tests.swarm.test_project import small_manifest

OWNER = OwnerKey.generate()


def manifest_with_trainer(tmp_path, trainer_key: bytes, pardoned=(), folder="owner"):
    """The project "p" of OWNER (one project id however often it is published)."""
    pardon = "pardoned = [" + ", ".join(f'"{p}"' for p in pardoned) + "]"
    (tmp_path / folder).mkdir()
    path = small_manifest(tmp_path / folder, "p", **{"pardoned = []": pardon})
    path.write_text(path.read_text() + f'\n[[trainers]]\nkey = "{trainer_key.hex()}"\n')
    return prepare(path, OWNER, (), tmp_path / folder / "out").signed


async def test_bans_by_the_projects_trainers_are_honoured_and_others_ignored(tmp_path):
    async with open_swarm(4, validator=moehome_validator()) as swarm:
        trainer, stranger, reader, cheater = (swarm.node(i) for i in range(4))
        signed = manifest_with_trainer(tmp_path, trainer.identity.public_key)
        boards = [BanBoard(p, signed, interval=0.2) for p in (trainer, stranger, reader)]
        seen: list[Ban] = []
        boards[2].listeners.append(seen.append)
        boards[0].accuse(str(cheater.peer_id), "wrong answers", b"", math.inf)
        boards[1].accuse(str(trainer.peer_id), "a stranger's word", b"", 2.0)
        for board in boards[:2]:
            await board.refresh()  # published
        await boards[2].refresh()
        assert set(boards[2].banned()) == {str(cheater.peer_id)}
        assert [b.peer for b in seen] == [str(cheater.peer_id)]  # told once
        await boards[2].refresh()
        assert len(seen) == 1
        ban = boards[2].ban_of(str(cheater.peer_id))
        assert ban is not None
        assert ban.reason == "wrong answers"
        assert math.isinf(ban.excess)

        # the ban ends after the manifest's ban_hours (24)
        later = BanBoard(reader, signed, clock=lambda: ban.until + 1)
        await later.refresh()
        assert later.banned() == {}

        # the owner pardons the cheater: a manifest listing it lifts the ban
        pardoning = manifest_with_trainer(
            tmp_path, trainer.identity.public_key, [str(cheater.peer_id)], folder="again"
        )
        assert pardoning.project_id == signed.project_id
        pardoned = BanBoard(reader, pardoning)
        await pardoned.refresh()
        assert pardoned.banned() == {}


async def test_a_board_publishes_at_once_when_it_accuses(tmp_path):
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, reader = swarm.node(0), swarm.node(1)
        signed = manifest_with_trainer(tmp_path, trainer.identity.public_key)
        board = await nursery.start(BanBoard(trainer, signed, interval=3600).run)
        board.accuse("12D3KooWcheater", "wrong answers", b"", 3.0)
        reading = BanBoard(reader, signed)
        with trio.fail_after(10):  # not an hour: accusing wakes the publisher
            while not reading.banned():
                await reading.refresh()
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
