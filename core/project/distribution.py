"""Serving and fetching weights: chunks over the framed RPC, checked against the hashes
of the owner-signed index; resumable (chunks already on disk are not fetched again)."""

from __future__ import annotations

import logging
import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import trio

from core.errors import UserFacingError
from core.project.chunks import ChunkStore, WeightsIndex, is_hash, sha256_hex
from core.project.manifest import Manifest
from core.project.pins import PinStore
from core.project.records import (
    DIRECTORY_KEY,
    ProviderAnnouncement,
    directory_ids,
    project_key,
    providers_key,
)
from core.project.signed import ManifestRejected, SignedManifest
from net import BadRequest, CallContext, DhtError, Peer, PeerID, Reply, RpcError, Tensor
from net.codec import pack
from net.dht import RecordRejected
from net.identity import peer_id_from_public_key

log = logging.getLogger(__name__)

GET_CHUNK = "weights.chunk"


class FetchError(UserFacingError):
    pass


class ProjectNotFound(UserFacingError, LookupError):
    pass


class WeightsService:
    """Answers chunk requests from the local store, and announces what it provides.
    One per peer: use ``WeightsService.of(peer, store)``."""

    _by_peer: ClassVar[weakref.WeakKeyDictionary[Peer, WeightsService]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def of(cls, peer: Peer, store: ChunkStore) -> WeightsService:
        service = cls._by_peer.get(peer)
        if service is None:
            service = cls._by_peer[peer] = cls(peer, store)
        elif service.store.root != store.root:
            raise ValueError("this peer already serves chunks from another folder")
        return service

    def __init__(self, peer: Peer, store: ChunkStore) -> None:
        self.peer = peer
        self.store = store
        self.served = 0
        peer.rpc.register(GET_CHUNK, self._get_chunk)

    async def _get_chunk(self, ctx: CallContext) -> Reply:
        digest = ctx.request.meta.get("hash")
        if not is_hash(digest):
            raise BadRequest("hash must be a SHA-256 hex digest")
        assert isinstance(digest, str)
        if ctx.request.meta.get("probe") is True:  # does it answer, and hold the chunk?
            held = await trio.to_thread.run_sync(self.store.__contains__, digest)
            return Reply({"held": held})
        data = await trio.to_thread.run_sync(self.store.get, digest)
        if data is None:
            raise BadRequest(f"chunk {digest[:12]} is not held here")
        self.served += 1
        return Reply({}, (Tensor("uint8", (len(data),), data),))

    async def announce(
        self, project_id: str, index: str, uids: Sequence[str] = (), ttl: float = 600
    ) -> None:
        await self.peer.dht.put(
            providers_key(project_id), ProviderAnnouncement(index, tuple(uids)).encode(), ttl
        )


@dataclass
class FetchStatistics:
    fetched: int = 0
    reused: int = 0
    refused: int = 0  # chunks whose bytes did not match their hash
    failed: int = 0
    bad_providers: set[str] = field(default_factory=set)


async def find_manifest(peer: Peer, project_id: str, pins: PinStore) -> SignedManifest:
    """The newest manifest of the project that verifies and passes the pinned key."""
    records = await peer.dht.get(project_key(project_id))
    best: SignedManifest | None = None
    problems: list[str] = []
    for record in records:
        try:
            signed = SignedManifest.decode(record.value)
            if signed.project_id != project_id:
                raise ManifestRejected("wrong_project", signed.project_id)
            pins.accept(signed)
        except ManifestRejected as exc:
            problems.append(str(exc))
            continue
        if best is None or signed.serial > best.serial:
            best = signed
    if best is None:
        detail = "; ".join(problems[:3]) if problems else "no record in the DHT"
        raise ProjectNotFound(f"no valid manifest for project {project_id}: {detail}")
    return best


def aggregator_peers(peer: Peer, manifest: Manifest) -> list[PeerID]:
    """The manifest's aggregators as peer ids, in its order; the addresses it lists for
    them go into the peerstore, so that they can be dialled without a lookup."""
    out = []
    for entry in manifest.aggregators:
        agg = peer_id_from_public_key(bytes.fromhex(entry.key))
        if entry.addrs:
            peer.host.remember(agg, [a.split("/p2p/")[0] for a in entry.addrs])
        out.append(agg)
    return out


#: Providers asked at once whether they answer (and hold the index), how long their
#: answers are awaited once one said yes, and at most in all.
PROBE_WIDTH = 32
PROBE_GRACE_S = 0.25
PROBE_S = 5.0
#: A chunk asked of one provider that has not come within this long is asked of the
#: next one too; past RACE_WIDTH asked at once, the one asked longest ago is given up.
#: The first whole, matching answer wins.
HEDGE_S = 2.0
RACE_WIDTH = 3


class WeightsFetcher:
    """Fetches weight files chunk by chunk from the peers that announce them.

    Anyone may announce itself a provider (a record costs a key), so the order is
    earned: the manifest's aggregators first, then the providers that answered a probe
    (a chunk request that asks only whether it is held), fastest first; providers that
    said nothing go last. A chunk not come from one provider within HEDGE_S is asked of
    the next as well, and a provider that was slow is remembered and asked last after
    that. (8 silent providers stretched a join from 1.8 s to 65-365 s: each was asked in
    turn, for 30 s.)"""

    def __init__(self, peer: Peer, store: ChunkStore, *, call_timeout: float = 30.0) -> None:
        self.peer = peer
        self.store = store
        self.call_timeout = call_timeout
        self.stats = FetchStatistics()
        #: providers that were too slow or silent, asked after the others from then on
        self._slow: set[str] = set()

    async def providers(
        self, project_id: str, index: str, preferred: Sequence[PeerID] = ()
    ) -> list[PeerID]:
        """Who announces ``index``: the ``preferred`` ones (the manifest's aggregators,
        listed by the owner) first, then the others shuffled."""
        out = []
        for author, record in (await self.peer.dht.announcers(providers_key(project_id))).items():
            try:
                if (
                    ProviderAnnouncement.decode(record.value).index == index
                    and author != self.peer.peer_id
                ):
                    out.append(author)
            except Exception as exc:  # noqa: BLE001 - validated on the way in; skip odd ones
                log.debug("skipping a provider record: %s", exc)
                continue
        random.shuffle(out)  # spread the load
        first = [p for p in preferred if p in out]
        return first + [p for p in out if p not in first]

    async def rank(
        self, providers: Sequence[PeerID], digest: str, preferred: Sequence[PeerID] = ()
    ) -> list[PeerID]:
        """``providers`` in the order to ask them: the ``preferred`` first, then those that
        answered a probe for ``digest`` holding it (fastest first), then the rest (the
        silent ones remembered as slow). Returns once one answered yes and a short grace
        passed, or after PROBE_S."""
        answered: list[PeerID] = []
        lacking: set[PeerID] = set()
        yes = trio.Event()

        async def probe(provider: PeerID) -> None:
            try:
                reply = await self.peer.rpc.call(
                    provider, GET_CHUNK, {"hash": digest, "probe": True}, timeout=PROBE_S
                )
            except RpcError:
                return
            held = reply.meta.get("held")
            if held is False:
                lacking.add(provider)
                return
            answered.append(provider)  # older peers send the chunk itself: an answer too
            yes.set()

        candidates = [p for p in providers if str(p) not in self.stats.bad_providers]
        with trio.move_on_after(PROBE_S):
            async with trio.open_nursery() as nursery:
                for provider in candidates[:PROBE_WIDTH]:
                    nursery.start_soon(probe, provider)
                await yes.wait()
                await trio.sleep(PROBE_GRACE_S)
                nursery.cancel_scope.cancel()
        for provider in candidates[:PROBE_WIDTH]:
            if provider not in answered and provider not in lacking:
                self._slow.add(str(provider))
        first = [p for p in preferred if p in candidates]
        rest = [p for p in candidates if p not in first and p not in answered]
        return first + [p for p in answered if p not in first] + rest

    async def fetch_chunk(self, digest: str, providers: Sequence[PeerID]) -> bytes:
        cached = await trio.to_thread.run_sync(self.store.get, digest)
        if cached is not None:
            self.stats.reused += 1
            return cached
        order = [p for p in providers if str(p) not in self.stats.bad_providers]
        order.sort(key=lambda p: str(p) in self._slow)  # stable: the slow ones last
        found: list[bytes] = []

        async def ask(provider: PeerID, scope: trio.CancelScope, done: trio.Event) -> None:
            try:
                with scope:
                    reply = await self.peer.rpc.call(
                        provider, GET_CHUNK, {"hash": digest}, timeout=self.call_timeout
                    )
                if scope.cancelled_caught:  # given up for later ones
                    return
            except RpcError as exc:
                log.info("chunk %s from %s failed: %s", digest[:12], provider, exc)
                self._slow.add(str(provider))
                return
            finally:
                done.set()
            data = bytes(reply.tensors[0].data) if len(reply.tensors) == 1 else b""
            if sha256_hex(data) != digest:
                self.stats.refused += 1
                self.stats.bad_providers.add(str(provider))
                log.warning(
                    "%s sent a chunk that does not match its hash; asking another peer", provider
                )
                return
            found.append(data)
            race.cancel_scope.cancel()

        async with trio.open_nursery() as race:
            asking: list[tuple[trio.CancelScope, trio.Event]] = []
            for provider in order:
                asking = [(scope, done) for scope, done in asking if not done.is_set()]
                while len(asking) >= RACE_WIDTH:  # the longest asked gives way
                    asking.pop(0)[0].cancel()
                scope, done = trio.CancelScope(), trio.Event()
                asking.append((scope, done))
                race.start_soon(ask, provider, scope, done)
                with trio.move_on_after(HEDGE_S) as hedge:
                    await done.wait()
                if hedge.cancelled_caught:  # too slow for this chunk: asked last next time
                    self._slow.add(str(provider))
        if found:
            await trio.to_thread.run_sync(self.store.put, found[0], digest)
            self.stats.fetched += 1
            return found[0]
        self.stats.failed += 1
        raise FetchError(f"no provider could send chunk {digest[:12]}")

    async def index(self, signed: SignedManifest) -> WeightsIndex:
        """The project's weights index (which files it has), verified against the hash
        the owner signed."""
        index, _ = await self._index(signed, None)
        return index

    async def _index(
        self, signed: SignedManifest, providers: Sequence[PeerID] | None
    ) -> tuple[WeightsIndex, Sequence[PeerID]]:
        pid = signed.project_id
        if providers is None:
            owners = [
                peer_id_from_public_key(bytes.fromhex(a.key)) for a in signed.manifest.aggregators
            ]
            providers = await self.providers(pid, signed.weights_index, owners)
            if signed.weights_index not in self.store:
                providers = await self.rank(providers, signed.weights_index, owners)
        index_bytes = await self.fetch_chunk(signed.weights_index, providers)
        try:
            return WeightsIndex.decode(index_bytes), providers
        except ValueError as exc:
            raise FetchError(f"weights index of {pid} is malformed: {exc}") from exc

    async def fetch(
        self,
        signed: SignedManifest,
        uids: Sequence[str],
        progress: Callable[[int, int], None] | None = None,
        *,
        providers: Sequence[PeerID] | None = None,
    ) -> dict[str, bytes]:
        """The weight files of ``uids`` (safetensors bytes), verified against the index
        whose hash the owner signed. ``providers``: whom to ask, in order (default: the
        peers announcing this index in the DHT, shuffled)."""
        pid = signed.project_id
        index, providers = await self._index(signed, providers)
        missing = [u for u in uids if u not in index.files]
        if missing:
            raise FetchError(f"project {pid} has no weights for {missing[:3]}")
        total = sum(len(index.files[u].chunks) for u in uids)
        done = 0
        files: dict[str, bytes] = {}
        for uid in uids:
            entry = index.files[uid]
            parts = []
            for digest in entry.chunks:
                parts.append(await self.fetch_chunk(digest, providers))
                done += 1
                if progress is not None:
                    progress(done, total)
            blob = b"".join(parts)
            if len(blob) != entry.size or sha256_hex(blob) != entry.sha256:
                raise FetchError(f"weights of {uid} do not match the signed index")
            files[uid] = blob
        return files


async def announce_project(peer: Peer, signed: SignedManifest, ttl: float = 3600) -> int:
    """Put the signed manifest, and list the project in the swarm's directory."""
    stored = 0
    for key, value in (
        (project_key(signed.project_id), signed.encode()),
        (DIRECTORY_KEY, pack([signed.project_id])),
    ):
        try:
            stored = max(stored, await peer.dht.put(key, value, ttl))
        except DhtError as exc:  # kept locally all the same; the next refresh spreads it
            log.warning("could not announce project %s: %s", signed.project_id, exc)
    return stored


async def list_projects(peer: Peer, *, most: int = 50) -> list[SignedManifest]:
    """Projects listed in the directory whose manifests verify (one per project, by
    name). Nothing is pinned: that happens when the volunteer joins one."""
    ids: dict[str, None] = {}
    for record in await peer.dht.get(DIRECTORY_KEY):
        try:
            ids.update(dict.fromkeys(directory_ids(record.value)))
        except RecordRejected:
            continue
    found: list[SignedManifest] = []

    async def describe(pid: str) -> None:
        for record in await peer.dht.get(project_key(pid)):
            try:
                signed = SignedManifest.decode(record.value)
                signed.verify()
            except ManifestRejected:
                continue
            if signed.project_id == pid:
                found.append(signed)
                return

    async with trio.open_nursery() as nursery:
        for pid in list(ids)[:most]:
            nursery.start_soon(describe, pid)
    return sorted(found, key=lambda s: s.manifest.project.name)
