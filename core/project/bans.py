"""A project's bans as one peer sees them: those it makes (a trainer or aggregator of the
manifest that caught a cheater) and those the manifest's other trainers and aggregators
published (core/protocol/bans.py). Every reader honours only accusers the manifest
lists, skips bans that ended and peers the owner pardoned (``[training.audit]
pardoned``, a manifest the owner signs and publishes again)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from core.project.signed import SignedManifest
from core.protocol.bans import MAX_BANS, Ban, ban_key, decode_bans, encode_bans
from core.protocol.fields import MessageError
from net import DhtError, Peer
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)

#: how long a ban lasts unless the manifest says otherwise
BAN_SECONDS = 24 * 3600.0


class BanBoard:
    def __init__(
        self,
        peer: Peer,
        signed: SignedManifest,
        *,
        interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.peer = peer
        self.project = signed.project_id
        m = signed.manifest
        keys = [a.key for a in m.aggregators] + [t.key for t in m.trainers]
        #: who may accuse: the manifest's aggregators and trainers (peer ids)
        self.accusers = {str(peer_id_from_public_key(bytes.fromhex(k))) for k in keys}
        self.pardoned = frozenset(m.training.audit.pardoned)
        self.ban_seconds = m.training.audit.ban_hours * 3600.0
        self.interval = interval
        self.clock = clock
        self._mine: list[Ban] = []
        self._known: dict[str, Ban] = {}  # banned peer -> the ban that ends last
        self._publish = trio.Event()
        #: told of every peer newly banned (by anyone)
        self.listeners: list[Callable[[Ban], None]] = []

    def accuse(self, peer: str, reason: str, statement: bytes, excess: float) -> Ban:
        """Ban ``peer`` from now on; published by ``run`` (at once if it runs)."""
        ban = Ban(peer, reason[:200], self.clock() + self.ban_seconds, statement, excess)
        others = [b for b in self._mine if b.peer != peer]
        self._mine = [*others[-(MAX_BANS - 1) :], ban]
        self._learn(ban)
        self._publish.set()
        return ban

    def banned(self) -> dict[str, Ban]:
        """Peers banned now, with their ban."""
        now = self.clock()
        return {p: b for p, b in self._known.items() if b.until > now}

    def ban_of(self, peer: str) -> Ban | None:
        return self.banned().get(peer)

    def _learn(self, ban: Ban) -> None:
        if ban.peer in self.pardoned or ban.until <= self.clock():
            return
        known = self._known.get(ban.peer)
        if known is None or known.until <= self.clock():
            log.warning("%s is banned from project %s: %s", ban.peer, self.project, ban.reason)
            self._known[ban.peer] = ban
            for listener in self.listeners:
                listener(ban)
        elif ban.until > known.until:
            self._known[ban.peer] = ban

    async def run(
        self, *, task_status: trio.TaskStatus[BanBoard] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read the accusers' records every ``interval`` (and publish ours, at once when
        we accuse someone, and again each time: records expire)."""
        task_status.started(self)
        while True:
            await self.refresh()
            with trio.move_on_after(self.interval):
                await self._publish.wait()
            self._publish = trio.Event()

    async def refresh(self) -> None:
        now = self.clock()
        self._mine = [b for b in self._mine if b.until > now]
        if self._mine:
            ttl = max(1.0, min(24 * 3600.0, max(b.until for b in self._mine) - now))
            try:
                await self.peer.dht.put(
                    ban_key(self.project), encode_bans(self.project, self._mine), ttl
                )
            except DhtError as exc:
                log.info("could not publish our bans: %s", exc)
        try:
            records = await self.peer.dht.announcers(ban_key(self.project))
        except DhtError as exc:
            log.info("could not read the project's bans: %s", exc)
            return
        for author, record in records.items():
            if str(author) not in self.accusers:
                continue  # only the manifest's trainers and aggregators may ban
            try:
                project, bans = decode_bans(record.value)
            except MessageError:
                continue  # checked on the way in; a newer schema is skipped
            if project == self.project:
                for ban in bans:
                    self._learn(ban)
