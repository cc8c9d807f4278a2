"""Signed address records: each peer publishes where it can be dialled under
``/moehome/peer/<its id>`` in the DHT (only it may write there), and a peer that must dial
someone whose addresses it does not know, or whose known addresses all failed, looks the
record up.

Addresses otherwise travel unsigned, in the metadata of DHT messages: anyone can claim
any addresses for any peer there (a dial to a wrong one fails Noise, so it costs only
time). The record is the peer's own word, relayed addresses included
(net/reach/relay_client.py), and it follows every change: a new relay, a new public
address after the router renumbered.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable
from typing import Final

import trio

from net._libp2p import PeerID
from net.dht import DhtError, DhtNode
from net.dht.records import RecordRejected, decode_peer_addrs, encode_peer_addrs, peer_record_key

log = logging.getLogger(__name__)

#: Lifetime of a published record; it is republished at half of it, and at once when
#: the addresses change (checked every CHECK_S).
RECORD_TTL_S: Final = 1200.0
CHECK_S: Final = 5.0
#: A peer's record is looked up at most this often (a dead peer's callers must not
#: turn every failed call into a DHT lookup).
RESOLVE_AGAIN_S: Final = 30.0
_REMEMBERED: Final = 1024

# Set while a lookup runs: its own DHT queries never start another one.
_resolving: contextvars.ContextVar[bool] = contextvars.ContextVar("resolving", default=False)


class AddressBook:
    """Publishes our record (when ``publish``) and resolves others'."""

    def __init__(
        self,
        dht: DhtNode,
        addrs: Callable[[], list[str]],
        *,
        publish: bool,
        ttl_s: float = RECORD_TTL_S,
        check_s: float = CHECK_S,
    ) -> None:
        self._dht = dht
        self._addrs = addrs
        self._publish = publish
        self._ttl_s = ttl_s
        self._check_s = check_s
        self._looked_up: dict[PeerID, float] = {}
        self.published: list[str] = []
        self.publications = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self._publish:
            return
        published_at = -math.inf
        while True:
            addrs = self._addrs()
            stale = trio.current_time() - published_at > self._ttl_s / 2
            if addrs and (addrs != self.published or stale):
                try:
                    await self._dht.put(
                        peer_record_key(self._dht.host.peer_id),
                        encode_peer_addrs(addrs),
                        self._ttl_s,
                    )
                except DhtError as exc:
                    log.debug("address record not published yet: %s", exc)
                else:
                    self.published = addrs
                    self.publications += 1
                    published_at = trio.current_time()
                    log.debug("published %d addresses", len(addrs))
            await trio.sleep(self._check_s)

    async def resolve(self, peer: PeerID) -> list[str]:
        """The addresses ``peer`` last published; [] when there is no record, when it
        was looked up less than RESOLVE_AGAIN_S ago, or from within a lookup."""
        if _resolving.get():
            return []
        now = trio.current_time()
        if now - self._looked_up.get(peer, -math.inf) < RESOLVE_AGAIN_S:
            return []
        if len(self._looked_up) >= _REMEMBERED:
            self._looked_up = {
                p: t for p, t in self._looked_up.items() if now - t < RESOLVE_AGAIN_S
            }
            if len(self._looked_up) >= _REMEMBERED:
                return []  # a flood of unknown peers: no lookups until it has passed
        self._looked_up[peer] = now
        token = _resolving.set(True)
        try:
            records = await self._dht.get(peer_record_key(peer))
        except DhtError as exc:
            log.debug("no address record for %s: %s", peer, exc)
            return []
        finally:
            _resolving.reset(token)
        for record in records:  # newest first; the namespace lets only the peer write
            if record.author_peer_id == peer:
                try:
                    return decode_peer_addrs(record.value)
                except RecordRejected:  # validated on the way in; never trust twice
                    return []
        return []
