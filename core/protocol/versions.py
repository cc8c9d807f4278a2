"""Version records: an aggregator announces each expert's newest weights in the DHT under
/moehome/version/<project>/<uid> (value: msgpack {uid, version, sha256}); volunteers and
trainers pull the weights whose hash it names.

The same records are also asked of the aggregator directly (``CURRENT_VERSIONS``): one
request names many experts, where the DHT takes a lookup of about five requests per
expert, and volunteers look twice a round (a volunteer serving 16 experts looked up
about one version a second; a third of an emulated host's CPU went to the DHT)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from core.protocol.fields import MessageError
from net import NamespaceRule, SignedRecord
from net.codec import NotMsgpack, pack, unpack_bounded
from net.dht import RecordRejected

VERSION_NAMESPACE: Final = "version"
#: the largest version record (its DHT namespace's limit)
MAX_VERSION_BYTES: Final = 8192
#: ask an aggregator for the records of the experts it holds
CURRENT_VERSIONS: Final = "versions.current"
#: experts one request may name, and the longest name (the request fits a frame header)
MAX_UIDS_PER_ASK: Final = 256
MAX_UID_CHARS: Final = 128


def version_key(project: str, uid: str) -> str:
    return f"/moehome/{VERSION_NAMESPACE}/{project}/{uid}"


def _check_version(record: SignedRecord) -> None:
    try:
        obj = unpack_bounded(record.value, 8192)
    except Exception as exc:  # garbage from a peer
        raise RecordRejected("schema", f"version record is not msgpack ({exc})") from exc
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("uid"), str)
        and isinstance(obj.get("version"), int)
        and isinstance(obj.get("sha256"), str)
        and len(obj["sha256"]) == 64
        and record.key.endswith("/" + obj["uid"])
    ):
        raise RecordRejected("schema", "version record needs uid, version and sha256")


VERSION_RULE: Final = NamespaceRule(
    max_ttl_s=3600.0, max_value_bytes=MAX_VERSION_BYTES, check=_check_version, store_share=1 / 4
)


def versions_ask(project: str, uids: Sequence[str]) -> dict[str, Any]:
    """The meta of a ``CURRENT_VERSIONS`` request."""
    if len(uids) > MAX_UIDS_PER_ASK:
        raise ValueError(f"at most {MAX_UIDS_PER_ASK} experts per request, not {len(uids)}")
    return {"project": project, "uids": list(uids)}


def parse_versions_ask(meta: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(project, uids) of a ``CURRENT_VERSIONS`` request; MessageError when malformed."""
    project, uids = meta.get("project"), meta.get("uids")
    if not isinstance(project, str) or not isinstance(uids, list):
        raise MessageError("a versions request names a project and a list of experts")
    if len(uids) > MAX_UIDS_PER_ASK:
        raise MessageError(f"at most {MAX_UIDS_PER_ASK} experts per request")
    if not all(isinstance(u, str) and 0 < len(u) <= MAX_UID_CHARS for u in uids):
        raise MessageError(f"experts are named by strings of 1-{MAX_UID_CHARS} characters")
    return project, uids


def versions_answer(records: Mapping[str, bytes]) -> bytes:
    """The payload of a ``CURRENT_VERSIONS`` reply: uid -> the record as announced."""
    return pack(dict(records))


def parse_versions_answer(blob: bytes, asked: Collection[str]) -> dict[str, bytes]:
    """uid -> record of a ``CURRENT_VERSIONS`` reply, of the experts ``asked`` only;
    bounded before it is decoded; MessageError when malformed."""
    limit = len(asked) * (MAX_VERSION_BYTES + MAX_UID_CHARS + 16) + 16
    if len(blob) > limit:
        raise MessageError(f"a versions answer of {len(blob)} bytes (at most {limit})")
    try:
        obj = unpack_bounded(blob, limit)
    except NotMsgpack as exc:
        raise MessageError(f"a versions answer is not msgpack ({exc})") from exc
    if not isinstance(obj, dict) or not all(
        isinstance(v, bytes) and len(v) <= MAX_VERSION_BYTES for v in obj.values()
    ):
        raise MessageError("a versions answer maps experts to records")
    return {uid: value for uid, value in obj.items() if uid in asked}
