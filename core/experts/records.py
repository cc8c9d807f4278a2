"""What expert servers say in the DHT, and the checks every peer applies to it.

Keys (namespace ``expert``)::

    /moehome/expert/<project>/ffn.3.17   one record per server: where, which weights, load
    /moehome/expert/<project>/ffn.3.     per server: the coordinates it serves under ffn.3.
    /moehome/expert/<project>/ffn.       per server: the coordinates it serves under ffn.

The prefix records let a trainer's beam search ask "which ffn.3.* are alive" with one
lookup (hivemind's scheme, but here every record is signed by the server that serves).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from net import NamespaceRule, SignedRecord
from net.codec import pack, unpack_bounded
from net.dht import RecordRejected

NAMESPACE: Final = "expert"
_PROJECT_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SERVING: Final = "serving"
WITHDRAWN: Final = "withdrawn"
_MAX_VALUE: Final = 4096


def check_project(project: str) -> str:
    if not _PROJECT_RE.match(project):
        raise ValueError(f"project id {project!r} must be 1-64 of a-z, 0-9 and '-'")
    return project


def expert_key(project: str, uid_or_prefix: str) -> str:
    return f"/moehome/{NAMESPACE}/{project}/{uid_or_prefix}"


@dataclass(frozen=True)
class ExpertAnnouncement:
    uid: str
    state: str  # SERVING or WITHDRAWN
    version: int
    sha256: str
    load: float  # queued samples / max batch size: 0 idle, 1 a full batch waiting
    max_batch: int

    def encode(self) -> bytes:
        return pack(
            {
                "uid": self.uid,
                "state": self.state,
                "version": self.version,
                "sha256": self.sha256,
                "load": float(self.load),
                "max_batch": self.max_batch,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ExpertAnnouncement:
        obj = _map(data)
        try:
            ann = cls(
                uid=_str(obj, "uid", 64),
                state=_str(obj, "state", 16),
                version=_int(obj, "version"),
                sha256=_str(obj, "sha256", 64),
                load=_float(obj, "load"),
                max_batch=_int(obj, "max_batch"),
            )
        except (KeyError, TypeError) as exc:
            raise RecordRejected("schema", f"expert record: {exc}") from exc
        if ann.state not in (SERVING, WITHDRAWN):
            raise RecordRejected("schema", f"expert record: unknown state {ann.state!r}")
        return ann


@dataclass(frozen=True)
class PrefixAnnouncement:
    next_coords: tuple[int, ...]  # coordinates served right after the prefix

    def encode(self) -> bytes:
        return pack({"next": sorted(set(self.next_coords))})

    @classmethod
    def decode(cls, data: bytes) -> PrefixAnnouncement:
        obj = _map(data)
        coords = obj.get("next")
        if not isinstance(coords, list) or len(coords) > 1024:
            raise RecordRejected("schema", "prefix record: 'next' must be a list of at most 1024")
        if not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 100_000 for c in coords
        ):
            raise RecordRejected("schema", "prefix record: coordinates must be integers 0..99999")
        return cls(tuple(coords))


def _check(record: SignedRecord) -> None:
    rest = record.key[len(f"/moehome/{NAMESPACE}/") :]
    project, _, name = rest.partition("/")
    if not _PROJECT_RE.match(project) or not name:
        raise RecordRejected("schema", f"expert key {record.key[:80]!r}")
    if name.endswith("."):
        PrefixAnnouncement.decode(record.value)
    else:
        ann = ExpertAnnouncement.decode(record.value)
        if ann.uid != name:
            raise RecordRejected("schema", f"record for {ann.uid!r} stored under {name!r}")


RULE: Final = NamespaceRule(max_ttl_s=600.0, max_value_bytes=_MAX_VALUE, check=_check)


def _map(data: bytes) -> dict[str, Any]:
    try:
        obj = unpack_bounded(data, _MAX_VALUE)
    except Exception as exc:  # garbage from a peer
        raise RecordRejected("schema", f"not msgpack: {exc}") from exc
    if not isinstance(obj, dict):
        raise RecordRejected("schema", "record value is not a map")
    return obj


def _str(obj: dict[str, Any], key: str, limit: int) -> str:
    v = obj[key]
    if not isinstance(v, str) or len(v) > limit:
        raise TypeError(f"{key} must be a string of at most {limit} characters")
    return v


def _int(obj: dict[str, Any], key: str) -> int:
    v = obj[key]
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**53:
        raise TypeError(f"{key} must be a non-negative integer")
    return v


def _float(obj: dict[str, Any], key: str) -> float:
    v = obj[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e9:
        raise TypeError(f"{key} must be a non-negative number")
    return float(v)


def prefix_children(uids: Sequence[str]) -> dict[str, set[int]]:
    """{prefix: coordinates right after it} for every prefix of the given uids."""
    from core.experts.uid import ExpertUID

    out: dict[str, set[int]] = {}
    for text in uids:
        uid = ExpertUID.parse(text)
        for depth, prefix in enumerate(uid.prefixes()):
            out.setdefault(prefix, set()).add(uid.coords[depth])
    return out
