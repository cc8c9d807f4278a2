"""moehome's DHT: a Kademlia record store on libp2p streams, with signed records.

Why not py-libp2p's KadDHT: see docs/decisions/001-dht.md (measured: ~10x slower gets,
silent puts before a routing-table refresh, duplicate providers, no isolation of our DHT
from IPFS's by protocol id).

The API hides Kademlia::

    await dht.put(key, value, ttl)      # signed with our key; returns replicas stored
    await dht.get(key)                  # verified records of every author, newest first
    await dht.announcers(key)           # {author PeerID: record}: "who serves ffn.3.17"

A prefix lookup (``ffn.3.*``) is a key of its own: each server also announces under the
prefix key, and ``get`` of that key returns every announcer.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from net._libp2p import PeerID
from net.codec import pack, unpack_bounded
from net.dht.records import (
    NamespacedValidator,
    RecordRejected,
    SignedRecord,
    namespace_of,
    sign_record,
)
from net.dht.routing import Contact, RoutingTable, key_id_of, node_id_of
from net.dht.store import RecordStore, StoreLimits
from net.identity import Identity
from net.ratelimit import Admission, PeerRateLimiter, RateLimits
from net.rpc import (
    BadRequest,
    CallContext,
    PeerUnreachable,
    RateLimited,
    Reply,
    RpcError,
    RpcService,
)
from net.rpc.frames import Tensor
from net.transport.dialing import address_source, circuit_relay, proven_addrs
from net.transport.host import DialError, SwarmHost

log = logging.getLogger(__name__)

FIND: Final = "dht.find"
GET: Final = "dht.get"
STORE: Final = "dht.store"
_MAX_ADDRS: Final = 8
_MAX_ADDR_CHARS: Final = 200
_MAX_PEER_ID_BYTES: Final = 64
#: Contacts not in our routing table that one lookup adopts from replies at one address
#: (IPv4, IPv6 /64): more would let a reply aim our dials at a third party's ports.
MAX_VOUCHED_PER_SOURCE: Final = 2
#: Wide lookups one ``get`` makes at most while it finds nothing and its last lookup
#: left contacts unmet (over MAX_VOUCHED_PER_SOURCE): peers that share an address (a
#: NAT, one computer) are met a few per lookup.
MAX_WIDE_LOOKUPS: Final = 6
#: How long a put stores a key again on the peers its last lookup found for it, without
#: a new lookup: an expert's declaration is put again every announce interval (30 s by
#: default) and after each new version, and those lookups were most of a volunteer's DHT
#: requests (finds 2.9 of 5.0 a second at 32 emulated volunteers). Four intervals: at
#: 30 s, just under the interval, most declarations still looked up (finds 3.16 -> 2.46
#: a second). Kept only when the lookup found every replica and each stored; a store
#: that fails looks up again. A peer that joins closer to the key meanwhile gets it at
#: the next lookup, or from a get that misses it there (gets look wider when they do).
STORE_TARGETS_S: Final = 120.0
#: Keys whose store targets are kept at most (the expired ones go first).
MAX_STORE_TARGETS: Final = 4096


class DhtError(Exception):
    """A DHT operation could not be done (e.g. no peer reachable)."""


@dataclass(frozen=True)
class Lookup:
    """What one iterative lookup found: the closest peers that answered, nearest first,
    and how many contacts it was told of and left unmet (over MAX_VOUCHED_PER_SOURCE)."""

    closest: list[Contact[PeerID]]
    unmet: int


@dataclass(frozen=True)
class DhtConfig:
    k: int = 20  # bucket size, and how many contacts a find returns
    replicas: int = 5  # peers that store each record
    alpha: int = 5  # queries in flight per lookup
    query_timeout: float = 2.0
    lookup_timeout: float = 8.0
    refresh_interval: float = 60.0
    sweep_interval: float = 30.0
    max_record_bytes: int = 32 * 1024
    max_records_per_message: int = 1024
    store_limits: StoreLimits = field(default_factory=StoreLimits)
    #: Records one source address may make us verify (a signature each), per second
    #: and in a burst; beyond, its stores are refused before any signature is checked.
    records_per_second_per_source: float = 2000.0
    record_burst_per_source: float = 8192.0
    #: Batches larger than this are verified in a worker thread, off the event loop.
    verify_in_thread_above: int = 32
    #: False for peers that cannot be reached from outside: they query but never serve.
    server_mode: bool = True


@dataclass
class DhtStatistics:
    lookups: int = 0
    queries_sent: int = 0
    queries_failed: int = 0
    records_refused: dict[str, int] = field(default_factory=dict)
    #: requests sent and answered, by method (dht.find, dht.get, dht.store): what a
    #: node's DHT costs it, both ways
    sent_by_method: Counter[str] = field(default_factory=Counter)
    served_by_method: Counter[str] = field(default_factory=Counter)
    #: this node's own gets and puts, by the key's namespace (version, expert, peer...):
    #: who the DHT's work is for
    gets_by_namespace: Counter[str] = field(default_factory=Counter)
    puts_by_namespace: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "queries_sent": self.queries_sent,
            "queries_failed": self.queries_failed,
            "records_refused": dict(self.records_refused),
            "sent_by_method": dict(self.sent_by_method),
            "served_by_method": dict(self.served_by_method),
            "gets_by_namespace": dict(self.gets_by_namespace),
            "puts_by_namespace": dict(self.puts_by_namespace),
        }


def _namespace(key: str) -> str:
    """A key's namespace for the statistics (``?`` for a key no rule would take)."""
    try:
        return namespace_of(key)
    except RecordRejected:
        return "?"


def _now_ms() -> int:
    return int(time.time() * 1000)


class DhtNode:
    def __init__(
        self,
        identity: Identity,
        host: SwarmHost,
        rpc: RpcService,
        validator: NamespacedValidator | None = None,
        config: DhtConfig | None = None,
        *,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.identity = identity
        self.host = host
        self.rpc = rpc
        self.validator = validator or NamespacedValidator()
        self.config = config or DhtConfig()
        self._clock_ms = clock_ms
        self.node_id = node_id_of(host.peer_id.to_bytes())
        self.routing: RoutingTable[PeerID] = RoutingTable(self.node_id, k=self.config.k)
        self.store = RecordStore(self.config.store_limits, self.validator.store_share)
        self._verify_limiter = trio.CapacityLimiter(1)
        self._record_rates: PeerRateLimiter[str] = PeerRateLimiter(
            RateLimits(
                requests_per_second=self.config.records_per_second_per_source,
                request_burst=self.config.record_burst_per_source,
            )
        )
        self.stats = DhtStatistics()
        self._bootstrap_addrs: list[str] = []
        self._bootstrapped = trio.Event()
        #: key -> (until when, the peers a put stored it on): ``put_record``
        self._store_targets: dict[str, tuple[float, list[Contact[PeerID]]]] = {}
        rpc.register(FIND, self._handle_find)
        rpc.register(GET, self._handle_get)
        rpc.register(STORE, self._handle_store)

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Maintenance: expire records, refresh the routing table, retry bootstrap."""
        task_status.started()
        next_refresh = trio.current_time() + self.config.refresh_interval
        while True:
            await trio.sleep(min(self.config.sweep_interval, self.config.refresh_interval))
            self.store.sweep(self._clock_ms())
            if trio.current_time() >= next_refresh:
                next_refresh = trio.current_time() + self.config.refresh_interval
                await self._refresh()

    async def _refresh(self) -> None:
        if not len(self.routing) and self._bootstrap_addrs:
            try:
                await self.bootstrap(self._bootstrap_addrs)
            except DhtError as exc:
                log.warning("DHT bootstrap failed again: %s", exc)
            return
        await self._lookup(self.node_id, width=self.config.k)
        # one random id per refresh keeps far buckets alive (Kademlia's bucket refresh)
        await self._lookup(random.getrandbits(256), width=self.config.k)

    async def bootstrap(self, addrs: Sequence[str], *, timeout: float = 15.0) -> int:
        """Join the DHT through the given peers. Returns how many peers we know after.

        Connects to every bootstrap address (in parallel, with retries), then looks up our
        own id, which fills the routing table and tells our neighbours about us. Raises
        DhtError if no bootstrap peer answered: a put before that would reach nobody.
        """
        # kept for a retry when the routing table empties: the first ones and those
        # added later (an invite's), newest first, a bounded list
        self._bootstrap_addrs = list(dict.fromkeys([*addrs, *self._bootstrap_addrs]))[:64]
        reached = 0

        async def join(addr: str) -> None:
            nonlocal reached
            try:
                peer = await self.host.connect_addr(addr, timeout=timeout)
                await self._query(peer, FIND, {"target": self.node_id.to_bytes(32, "big")})
                reached += 1
            except (DialError, RpcError, ValueError) as exc:
                log.warning("bootstrap peer %s unreachable: %s", addr, exc)

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for addr in addrs:
                    nursery.start_soon(join, addr)
        if not reached:
            raise DhtError(f"none of {len(addrs)} bootstrap peers answered")
        await self._lookup(self.node_id, width=self.config.k)
        self._bootstrapped.set()
        log.debug("joined the DHT: %d peers known", len(self.routing))
        return len(self.routing)

    async def wait_bootstrapped(self) -> None:
        await self._bootstrapped.wait()

    # ------------------------------------------------------------ public API

    async def put(self, key: str, value: bytes, ttl: float) -> int:
        """Sign and store a record on the peers closest to ``key``.

        Returns the number of remote replicas that accepted it; raises DhtError when no
        remote peer did (py-libp2p's KadDHT returns silently in that case).
        """
        record = sign_record(self.identity, key, value, ttl, self._clock_ms())
        return await self.put_record(record)

    async def put_record(self, record: SignedRecord) -> int:
        self.validator.validate(record, self._clock_ms())  # our own mistakes fail loudly here
        self.stats.puts_by_namespace[_namespace(record.key)] += 1
        self.store.put(record, self._clock_ms())
        known = self._store_targets.pop(record.key, None)
        holders: set[PeerID] = set()
        if known is not None and known[0] > trio.current_time():
            holders, _ = await self._store_on(known[1], [record])
            if len(holders) == len(known[1]):
                self._store_targets[record.key] = known  # until it expires: not renewed
                return len(holders)
        lookup = await self._lookup(key_id_of(record.key), width=self.config.replicas)
        targets = lookup.closest[: self.config.replicas]
        # those that stored it just now would refuse the same record as not newer
        more, errors = await self._store_on([c for c in targets if c.peer not in holders], [record])
        holders |= more
        stored = len(holders)
        if len(targets) == self.config.replicas and {c.peer for c in targets} <= holders:
            self._keep_store_targets(record.key, targets)
        if not stored:
            detail = "; ".join(errors[:3]) or (
                "no peer answered the lookup in time"
                if len(self.routing)
                else "no peers known (bootstrap first)"
            )
            raise DhtError(f"record {record.key} reached no peer: {detail}")
        return stored

    def _keep_store_targets(self, key: str, targets: list[Contact[PeerID]]) -> None:
        """Store ``key`` on ``targets`` again without a lookup for STORE_TARGETS_S (from
        when they were found, not renewed by use: the closest peers are looked up again
        that often)."""
        now = trio.current_time()
        self._store_targets[key] = (now + STORE_TARGETS_S, targets)
        if len(self._store_targets) > MAX_STORE_TARGETS:
            for old in [k for k, (at, _) in self._store_targets.items() if at <= now]:
                del self._store_targets[old]
            while len(self._store_targets) > MAX_STORE_TARGETS:
                del self._store_targets[next(iter(self._store_targets))]

    async def _store_on(
        self, targets: Sequence[Contact[PeerID]], records: list[SignedRecord]
    ) -> tuple[set[PeerID], list[str]]:
        """Ask each target to store the records: those that stored them all, and why the
        others did not."""
        stored: set[PeerID] = set()
        errors: list[str] = []

        async def store_on(contact: Contact[PeerID]) -> None:
            try:
                reply = await self._query(contact.peer, STORE, {}, records=records)
            except RpcError as exc:
                errors.append(f"{contact.peer}: {exc}")
                return
            accepted = reply.meta.get("stored")
            if isinstance(accepted, list) and accepted and all(a is True for a in accepted):
                stored.add(contact.peer)
            else:
                errors.append(f"{contact.peer}: refused ({reply.meta.get('errors')})")

        async with trio.open_nursery() as nursery:
            for contact in targets:
                nursery.start_soon(store_on, contact)
        return stored, errors

    async def get(self, key: str) -> list[SignedRecord]:
        """Every live, verified record under ``key`` (one per author), newest first."""
        self.stats.gets_by_namespace[_namespace(key)] += 1
        found: dict[bytes, SignedRecord] = {}
        await self._merge(self.store.get(key, self._clock_ms()), key, found)
        target = key_id_of(key)
        narrow = await self._lookup(target, width=self.config.replicas, key=key, found=found)
        missed = not found
        if missed and self.config.k > self.config.replicas:
            # peers that joined after the record was stored may now be the closest to its
            # key without holding it: look wider before saying there is none, again while
            # a lookup was told of peers it did not meet (many at one address)
            for _ in range(MAX_WIDE_LOOKUPS):
                wide = await self._lookup(target, width=self.config.k, key=key, found=found)
                if found or not wide.unmet:
                    break
        newest = sorted(found.values(), key=lambda r: r.timestamp_ms, reverse=True)
        if newest and missed:
            # the closest peers lacked it: store it on them (Kademlia's caching step,
            # hivemind's cache_nearest), so that the next get finds it at once
            await self._store_on(
                narrow.closest[: self.config.replicas],
                newest[: self.config.max_records_per_message],
            )
        return newest

    async def announcers(self, key: str) -> dict[PeerID, SignedRecord]:
        """Who announces ``key``: each author's newest record, deduplicated by author."""
        return {record.author_peer_id: record for record in await self.get(key)}

    def known_peers(self) -> list[PeerID]:
        return [c.peer for c in self.routing.contacts()]

    def statistics(self) -> DhtStatistics:
        return self.stats

    # ------------------------------------------------------------ lookups

    async def _lookup(
        self,
        target: int,
        *,
        width: int,
        key: str | None = None,
        found: dict[bytes, SignedRecord] | None = None,
    ) -> Lookup:
        """Iterative Kademlia lookup: the closest peers that answered, and how many
        contacts it left unmet.

        Ends when the ``width`` closest candidates have all been asked. With ``key``, asks
        for records as well and merges valid ones into ``found``.
        """
        self.stats.lookups += 1
        candidates: dict[PeerID, Contact[PeerID]] = {
            c.peer: c for c in self.routing.closest(target, self.config.k)
        }
        asked: set[PeerID] = set()
        answered: dict[PeerID, Contact[PeerID]] = {}
        # contacts a reply vouches for are its word: at most a few at one address, so a
        # reply naming many ports of a third party does not aim our dials at it
        vouched: Counter[str | None] = Counter()
        unmet: set[PeerID] = set()
        method = GET if key is not None else FIND
        meta: dict[str, Any] = (
            {"key": key} if key is not None else {"target": target.to_bytes(32, "big")}
        )

        async def ask(contact: Contact[PeerID]) -> None:
            try:
                reply = await self._query(contact.peer, method, meta)
            except RpcError:
                candidates.pop(contact.peer, None)
                return
            answered[contact.peer] = contact
            for peer, node_id, addrs in self._parse_contacts(reply.meta.get("peers")):
                if peer in candidates or peer in asked or node_id == self.node_id:
                    continue
                where = address_source(addrs[0])
                if vouched[where] >= MAX_VOUCHED_PER_SOURCE and peer not in self.routing:
                    unmet.add(peer)
                    continue
                vouched[where] += 1
                candidates[peer] = Contact(peer, node_id, addrs)
                self.host.remember(peer, addrs)
            if key is not None and found is not None:
                await self._merge(self._decode_records(reply.tensors), key, found)

        with trio.move_on_after(self.config.lookup_timeout):
            while True:
                closest = sorted(candidates.values(), key=lambda c: c.node_id ^ target)[:width]
                pending = [c for c in closest if c.peer not in asked][: self.config.alpha]
                if not pending:
                    break
                async with trio.open_nursery() as nursery:
                    for contact in pending:
                        asked.add(contact.peer)
                        nursery.start_soon(ask, contact)
        closest = sorted(answered.values(), key=lambda c: c.node_id ^ target)
        return Lookup(closest, len(unmet - candidates.keys() - asked))

    async def _merge(
        self, records: Sequence[SignedRecord], key: str, found: dict[bytes, SignedRecord]
    ) -> None:
        """Keep each author's newest valid record. Everything is re-verified, our own
        store included: what reaches a caller has always had its signature checked."""
        verdicts = await self._validate_all([r for r in records if r.key == key])
        for record, refusal in verdicts:
            if refusal is not None:
                self._count_refusal(refusal.reason)
                continue
            current = found.get(record.author)
            if current is None or record.newer_than(current):
                found[record.author] = record

    async def _validate_all(
        self, records: Sequence[SignedRecord]
    ) -> list[tuple[SignedRecord, RecordRejected | None]]:
        """Each record with its refusal (None: valid). A signature check costs ~50-100
        us; a large batch is checked in a worker thread so that the event loop (every
        other call) never waits behind it."""
        now = self._clock_ms()

        def check_all() -> list[tuple[SignedRecord, RecordRejected | None]]:
            out: list[tuple[SignedRecord, RecordRejected | None]] = []
            for record in records:
                try:
                    self.validator.validate(record, now)
                    out.append((record, None))
                except RecordRejected as exc:
                    out.append((record, exc))
            return out

        if len(records) <= self.config.verify_in_thread_above:
            return check_all()
        return await trio.to_thread.run_sync(check_all, limiter=self._verify_limiter)

    async def _query(
        self,
        peer: PeerID,
        method: str,
        meta: Mapping[str, Any],
        *,
        records: Sequence[SignedRecord] = (),
    ) -> Reply:
        """One DHT request; updates the routing table with the outcome."""
        self.stats.queries_sent += 1
        self.stats.sent_by_method[method] += 1
        full_meta = dict(meta)
        full_meta["addrs"] = self.host.announce_addrs() if self.config.server_mode else []
        tensors = (_records_tensor(records),) if records else ()
        try:
            reply = await self.rpc.call(
                peer, method, full_meta, tensors, timeout=self.config.query_timeout, dial_attempts=1
            )
        except PeerUnreachable:
            # gone (connection refused or broken): forget it now; it is added back as
            # soon as it contacts us or another peer vouches for it again
            self.stats.queries_failed += 1
            self.routing.remove(peer)
            raise
        except RpcError:
            self.stats.queries_failed += 1
            self.routing.mark_failed(peer)
            raise
        self.routing.add(
            peer, node_id_of(peer.to_bytes()), self.host.known_addrs(peer), trio.current_time()
        )
        return reply

    # ------------------------------------------------------------ serving

    def _note_sender(self, ctx: CallContext) -> None:
        claimed = _parse_addrs(ctx.request.meta.get("addrs"))
        # routed to, and handed on to others, only at the addresses its connection
        # proves (the rest are its word, which others would dial: net/transport/dialing.py), or, for
        # a peer behind NAT, at a circuit through a relay we know at that address
        addrs = proven_addrs(claimed, ctx.source) or self._known_circuits(claimed)[:1]
        if addrs:  # peers without such addresses are clients: never route to them
            self.host.remember(ctx.peer_id, addrs)
            self.routing.add(
                ctx.peer_id, node_id_of(ctx.peer_id.to_bytes()), addrs, trio.current_time()
            )

    def _known_circuits(self, addrs: Sequence[str]) -> list[str]:
        """The relay circuits among ``addrs`` whose relay is a peer in our routing table
        at the circuit's address: dialling one reaches a peer we know, never a third
        party a stranger named."""
        out = []
        for addr in addrs:
            relay = circuit_relay(addr)
            if relay is None:
                continue
            relay_source, relay_id = relay
            contact = next(
                (c for c in self.routing.contacts() if c.peer.to_base58() == relay_id), None
            )
            if contact is not None and any(
                address_source(a) == relay_source for a in contact.addrs
            ):
                out.append(addr)
        return out

    def _closest_contacts(self, target: int, requester: PeerID) -> list[list[Any]]:
        return [
            [c.peer.to_bytes(), list(c.addrs)]
            for c in self.routing.closest(target, self.config.k, exclude=[requester])
            if c.addrs
        ]

    async def _handle_find(self, ctx: CallContext) -> Reply:
        self._require_server()
        self.stats.served_by_method[FIND] += 1
        target = ctx.request.meta.get("target")
        if not isinstance(target, bytes) or len(target) != 32:
            raise BadRequest("target must be 32 bytes")
        self._note_sender(ctx)
        return Reply({"peers": self._closest_contacts(int.from_bytes(target, "big"), ctx.peer_id)})

    async def _handle_get(self, ctx: CallContext) -> Reply:
        self._require_server()
        self.stats.served_by_method[GET] += 1
        key = ctx.request.meta.get("key")
        if not isinstance(key, str) or len(key) > 256:
            raise BadRequest("key must be a string of at most 256 characters")
        self._note_sender(ctx)
        records = self.store.get(key, self._clock_ms(), limit=self.config.max_records_per_message)
        peers = self._closest_contacts(key_id_of(key), ctx.peer_id)
        return Reply({"peers": peers}, (_records_tensor(records),) if records else ())

    async def _handle_store(self, ctx: CallContext) -> Reply:
        self._require_server()
        self.stats.served_by_method[STORE] += 1
        self._note_sender(ctx)
        items = self._decode_record_list(ctx.request.tensors)
        # a signature check each: a source's rate is taken before any is checked
        admission = self._record_rates.admit(
            ctx.source, 0, trio.current_time(), requests=float(len(items))
        )
        if admission is not Admission.ADMIT:
            self._count_refusal("rate_limited")
            raise RateLimited(f"more than {self.config.records_per_second_per_source:g} records/s")
        decoded = [r for r in items if isinstance(r, SignedRecord)]
        verdicts = iter(await self._validate_all(decoded))
        stored: list[bool] = []
        errors: list[str | None] = []
        now = self._clock_ms()
        for item in items:
            refusal = item if isinstance(item, RecordRejected) else next(verdicts)[1]
            if refusal is not None:
                stored.append(False)
                errors.append(str(refusal))
                self._count_refusal(refusal.reason)
                continue
            assert isinstance(item, SignedRecord)
            stored.append(self.store.put(item, now, ctx.source))
            errors.append(None)
        return Reply({"stored": stored, "errors": errors})

    def _require_server(self) -> None:
        if not self.config.server_mode:
            raise BadRequest("this peer does not serve the DHT")

    def _count_refusal(self, reason: str) -> None:
        self.stats.records_refused[reason] = self.stats.records_refused.get(reason, 0) + 1

    # ------------------------------------------------------------ decoding

    def _decode_record_list(self, tensors: Sequence[Tensor]) -> list[SignedRecord | RecordRejected]:
        if len(tensors) != 1 or tensors[0].dtype != "uint8":
            raise BadRequest("records travel as one uint8 tensor")
        blob = bytes(tensors[0].data)
        try:
            items = unpack_bounded(blob, len(blob))
        except Exception as exc:  # garbage from a peer
            raise BadRequest(f"record list is not msgpack: {exc}") from exc
        if not isinstance(items, list) or len(items) > self.config.max_records_per_message:
            raise BadRequest("record list is not a list or is too long")
        out: list[SignedRecord | RecordRejected] = []
        for raw in items:
            if not isinstance(raw, bytes):
                out.append(RecordRejected("malformed", "record is not bytes"))
                continue
            try:
                out.append(SignedRecord.decode(raw, self.config.max_record_bytes))
            except RecordRejected as exc:
                out.append(exc)
        return out

    def _decode_records(self, tensors: Sequence[Tensor]) -> list[SignedRecord]:
        if not tensors:
            return []
        try:
            items = self._decode_record_list(tensors)
        except BadRequest:
            self._count_refusal("malformed")
            return []
        return [r for r in items if isinstance(r, SignedRecord)]

    def _parse_contacts(self, raw: Any) -> Iterable[tuple[PeerID, int, tuple[str, ...]]]:
        if not isinstance(raw, list):
            return
        for item in raw[: self.config.k * 2]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], bytes)):
                continue
            if len(item[0]) > _MAX_PEER_ID_BYTES:
                continue
            # one address a contact (the peer that vouches for it may be lying): a direct
            # one, or a circuit through a relay we know
            raw = _parse_addrs(item[1])
            direct = [a for a in raw if "/p2p-circuit" not in a]
            addrs = tuple(direct[:1] or self._known_circuits(raw)[:1])
            if not addrs:
                continue
            try:
                peer = PeerID(item[0])
            except Exception as exc:  # noqa: BLE001 - a malformed id from a peer is skipped
                log.debug("skipping a malformed peer id in a DHT reply: %s", exc)
                continue
            yield peer, node_id_of(item[0]), addrs


def _parse_addrs(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(
        a for a in raw[:_MAX_ADDRS] if isinstance(a, str) and 0 < len(a) <= _MAX_ADDR_CHARS
    )


def _records_tensor(records: Sequence[SignedRecord]) -> Tensor:
    blob = pack([r.encode() for r in records])
    return Tensor("uint8", (len(blob),), blob)
