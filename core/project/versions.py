"""The versions of experts a project's aggregators announce: their signed records in the
DHT (which version is current, and the hashes of its weights file's chunks), and the
file itself, fetched from the aggregator and checked against the record. Volunteers pull
them to serve (core/contributing/puller.py); trainers fetch them to audit answers
(core/moe/audit.py)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from core.project.chunks import sha256_hex
from core.project.distribution import FetchError, WeightsFetcher
from core.protocol.versions import version_key
from net import Peer, PeerID
from net.codec import unpack_bounded


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
