"""The versions of experts a project's aggregators announce: their signed records in the
DHT (which version is current, and the hashes of its weights file's chunks), and the
file itself, fetched from the aggregator and checked against the record. Volunteers pull
them to serve (core/contributing/puller.py); trainers fetch them to audit answers
(core/moe/audit.py)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from core.project.assignment import expert_assignment
from core.project.chunks import sha256_hex
from core.project.distribution import FetchError, WeightsFetcher, aggregator_peers
from core.project.signed import SignedManifest
from core.protocol.aggregator_methods import responsible_aggregator
from core.protocol.fields import MessageError
from core.protocol.versions import (
    CURRENT_VERSIONS,
    MAX_UIDS_PER_ASK,
    parse_versions_answer,
    version_key,
    versions_ask,
)
from net import Peer, PeerID, RpcError
from net.codec import unpack_bounded

log = logging.getLogger(__name__)

#: how long an aggregator's answer is awaited, and how long one that gave none (down,
#: unreachable, or too old to know the request) is not asked again: the DHT is asked
#: for its experts meanwhile
ASK_TIMEOUT_S = 5.0
SILENT_S = 30.0


@dataclass(frozen=True)
class VersionRecord:
    uid: str
    version: int
    sha256: str  # weights_hash of the module
    file_sha256: str
    size: int
    chunks: tuple[str, ...]
    author: PeerID


def parse_version(value: bytes, author: PeerID) -> VersionRecord | None:
    try:
        obj: Any = unpack_bounded(value, 8192)
        sha, size, chunks = obj["file"]
        return VersionRecord(
            obj["uid"], int(obj["version"]), obj["sha256"], sha, int(size), tuple(chunks), author
        )
    except Exception:  # noqa: BLE001 - schema-checked on the way in; versions without files are skipped
        return None


async def newest_version(
    peer: Peer, project: str, uid: str, allowed: Collection[str]
) -> VersionRecord | None:
    """The newest version of ``uid`` that one of the project's aggregators (``allowed``:
    their peer ids) declares in the DHT; None when there is none yet."""
    best = None
    for author, record in (await peer.dht.announcers(version_key(project, uid))).items():
        if str(author) not in allowed:
            continue  # only the project's aggregators say what is current
        parsed = parse_version(record.value, author)
        if (
            parsed is not None
            and parsed.uid == uid
            and (best is None or parsed.version > best.version)
        ):
            best = parsed
    return best


@dataclass
class FinderStatistics:
    asked: int = 0  # requests to aggregators
    answered: int = 0
    from_aggregators: int = 0  # experts whose record an aggregator gave
    dht_lookups: int = 0  # experts looked up in the DHT instead


class VersionFinder:
    """The newest versions of experts, asked of the aggregators that hold them (the
    manifest's ``assignment``, as contributions are sent): one request per aggregator
    for all the experts asked together, where ``newest_version`` takes a DHT lookup
    (about five requests) per expert. The DHT is still asked for the experts whose
    aggregator gave no answer (down, unreachable, an older moehome) or no record of
    them. The answer comes over a connection that proves the aggregator's key, as the
    signature of its DHT record does."""

    def __init__(
        self,
        peer: Peer,
        project: str,
        aggregators: Sequence[PeerID],
        assignment: Mapping[str, int] | None = None,
        *,
        ask_timeout: float = ASK_TIMEOUT_S,
    ) -> None:
        self.peer = peer
        self.project = project
        self.aggregators = list(aggregators)
        self.assignment = dict(assignment or {})
        self.allowed = {str(a) for a in aggregators}
        self.ask_timeout = ask_timeout
        self.stats = FinderStatistics()
        #: aggregators that gave no answer, and until when they are not asked
        self._silent: dict[PeerID, float] = {}

    @classmethod
    def for_manifest(cls, peer: Peer, signed: SignedManifest) -> VersionFinder:
        """Asking the manifest's aggregators (the addresses it lists remembered), each
        for the experts its assignment gives it."""
        manifest = signed.manifest
        return cls(
            peer, signed.project_id, aggregator_peers(peer, manifest), expert_assignment(manifest)
        )

    def aggregator_of(self, uid: str) -> PeerID:
        """The aggregator that holds ``uid`` (and takes its contributions)."""
        return responsible_aggregator(uid, self.aggregators, self.assignment)

    async def newest(self, uids: Iterable[str]) -> dict[str, VersionRecord | None]:
        """uid -> its newest announced version (None: none announced yet)."""
        wanted = list(dict.fromkeys(uids))
        groups: dict[PeerID, list[str]] = {}
        now = trio.current_time()
        for uid in wanted if self.aggregators else ():
            agg = self.aggregator_of(uid)
            if self._silent.get(agg, 0.0) <= now:
                groups.setdefault(agg, []).append(uid)
        found: dict[str, VersionRecord | None] = {}
        async with trio.open_nursery() as nursery:
            for agg, group in groups.items():
                for start in range(0, len(group), MAX_UIDS_PER_ASK):
                    batch = group[start : start + MAX_UIDS_PER_ASK]
                    nursery.start_soon(self._ask, agg, batch, found)
        for uid in wanted:
            if uid not in found:
                self.stats.dht_lookups += 1
                found[uid] = await newest_version(self.peer, self.project, uid, self.allowed)
        return {uid: found[uid] for uid in wanted}

    async def _ask(
        self, aggregator: PeerID, uids: list[str], found: dict[str, VersionRecord | None]
    ) -> None:
        self.stats.asked += 1
        try:
            reply = await self.peer.rpc.call(
                aggregator,
                CURRENT_VERSIONS,
                versions_ask(self.project, uids),
                timeout=self.ask_timeout,
            )
            if len(reply.tensors) != 1 or reply.tensors[0].dtype != "uint8":
                raise MessageError("a versions answer is one byte payload")
            records = parse_versions_answer(bytes(reply.tensors[0].data), uids)
        except (RpcError, MessageError) as exc:
            log.info("aggregator %s gave no versions (%s): asking the DHT", aggregator, exc)
            self._silent[aggregator] = trio.current_time() + SILENT_S
            return
        self.stats.answered += 1
        for uid, value in records.items():
            parsed = parse_version(value, aggregator)
            # a record without its file is as good as none (newest_version skips it)
            found[uid] = parsed if parsed is not None and parsed.uid == uid else None
            self.stats.from_aggregators += 1


async def fetch_version(fetcher: WeightsFetcher, record: VersionRecord) -> bytes:
    """The weights file of ``record``, from its aggregator, checked against the record."""
    parts = [await fetcher.fetch_chunk(c, [record.author]) for c in record.chunks]
    blob = b"".join(parts)
    if len(blob) != record.size or sha256_hex(blob) != record.file_sha256:
        raise FetchError(f"version {record.version} of {record.uid} does not match its record")
    return blob


def pull_interval(round_seconds: float) -> float:
    """How often a volunteer (or an auditing trainer) looks for new versions: twice a
    round, so that it serves and contributes on weights at most about half a round old,
    and never more often than every second (a DHT lookup per expert) nor less often
    than every 10 s."""
    return min(10.0, max(1.0, round_seconds / 2))
