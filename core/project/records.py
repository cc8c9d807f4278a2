"""DHT namespaces of projects: the signed manifest, key rotations, weight providers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from core.project.chunks import is_hash
from core.project.keys import KeyRotation
from core.project.signed import ManifestRejected, SignedManifest
from net import NamespaceRule, SignedRecord
from net.codec import pack, unpack_bounded
from net.dht import RecordRejected

_ID_RE: Final = re.compile(r"^[0-9a-f]{32}$")
#: A signed manifest must fit one DHT record (net's DhtConfig.max_record_bytes is 32 KiB).
MAX_RECORD_BYTES: Final = 24 * 1024


def project_key(project_id: str) -> str:
    return f"/moehome/project/{project_id}"


def rotation_key(old_public: bytes) -> str:
    return f"/moehome/rotation/{old_public.hex()}"


def providers_key(project_id: str) -> str:
    return f"/moehome/weights/{project_id}"


#: Where owners list the projects they publish, so a new volunteer can pick one. Each
#: author's record is a list of project ids; readers fetch and verify each manifest.
DIRECTORY_KEY: Final = "/moehome/directory/projects"
MAX_DIRECTORY_IDS: Final = 16


def directory_ids(value: bytes) -> list[str]:
    try:
        obj: Any = unpack_bounded(value, 2048)
    except ValueError as exc:
        raise RecordRejected("schema", f"not a directory record ({exc})") from exc
    if (
        not isinstance(obj, list)
        or len(obj) > MAX_DIRECTORY_IDS
        or not all(isinstance(p, str) and _ID_RE.match(p) for p in obj)
    ):
        raise RecordRejected(
            "schema", f"a directory record is a list of <= {MAX_DIRECTORY_IDS} ids"
        )
    return list(obj)


def _check_directory(record: SignedRecord) -> None:
    if record.key != DIRECTORY_KEY:
        raise RecordRejected("schema", f"the directory has one key: {DIRECTORY_KEY}")
    try:
        directory_ids(record.value)
    except RecordRejected:
        raise
    except Exception as exc:
        raise RecordRejected("schema", f"not a directory record ({exc})") from exc


def _rest(record: SignedRecord, namespace: str) -> str:
    return record.key[len(f"/moehome/{namespace}/") :]


def _check_project(record: SignedRecord) -> None:
    pid = _rest(record, "project")
    try:
        signed = SignedManifest.decode(record.value)
        signed.verify()
    except ManifestRejected as exc:
        raise RecordRejected("bad_manifest", str(exc)) from exc
    if signed.project_id != pid:
        raise RecordRejected("bad_manifest", f"manifest of project {signed.project_id} under {pid}")


def _check_rotation(record: SignedRecord) -> None:
    try:
        rotation = KeyRotation.decode(record.value)
    except Exception as exc:  # garbage from a peer
        raise RecordRejected("schema", f"not a key rotation ({exc})") from exc
    if _rest(record, "rotation") != rotation.old.hex() or not rotation.verify():
        raise RecordRejected("bad_signature", "rotation not signed by the key it replaces")


@dataclass(frozen=True)
class ProviderAnnouncement:
    """A peer that serves chunks of a weights index (all of it, or the listed uids)."""

    index: str
    uids: tuple[str, ...]  # empty: every file of the index

    def encode(self) -> bytes:
        return pack({"index": self.index, "uids": list(self.uids)})

    @classmethod
    def decode(cls, data: bytes) -> ProviderAnnouncement:
        try:
            obj: Any = unpack_bounded(data, 16 * 1024)
        except ValueError as exc:
            raise RecordRejected("schema", f"not a provider record ({exc})") from exc
        if not isinstance(obj, dict) or not is_hash(obj.get("index")):
            raise RecordRejected("schema", "provider record needs an index hash")
        uids = obj.get("uids", [])
        if (
            not isinstance(uids, list)
            or len(uids) > 1024
            or not all(isinstance(u, str) and len(u) < 64 for u in uids)
        ):
            raise RecordRejected("schema", "provider uids must be a list of at most 1024 names")
        return cls(obj["index"], tuple(uids))


def _check_providers(record: SignedRecord) -> None:
    if not _ID_RE.match(_rest(record, "weights")):
        raise RecordRejected("schema", "weights key must end in a project id")
    try:
        ProviderAnnouncement.decode(record.value)
    except RecordRejected:
        raise
    except Exception as exc:
        raise RecordRejected("schema", f"not a provider record ({exc})") from exc


RULES: Final = {
    # store shares (net/dht/store.py): what each namespace may fill of a peer's store
    "project": NamespaceRule(
        max_ttl_s=24 * 3600.0,
        max_value_bytes=MAX_RECORD_BYTES,
        check=_check_project,
        store_share=1 / 4,
    ),
    "rotation": NamespaceRule(
        max_ttl_s=30 * 24 * 3600.0, max_value_bytes=1024, check=_check_rotation, store_share=1 / 32
    ),
    "weights": NamespaceRule(
        max_ttl_s=3600.0, max_value_bytes=16 * 1024, check=_check_providers, store_share=1 / 8
    ),
    "directory": NamespaceRule(
        max_ttl_s=24 * 3600.0, max_value_bytes=2048, check=_check_directory, store_share=1 / 32
    ),
}
