"""Version records: an aggregator announces each expert's newest weights in the DHT under
/moehome/version/<project>/<uid> (value: msgpack {uid, version, sha256}); volunteers and
trainers pull the weights whose hash it names."""

from __future__ import annotations

from typing import Final

from net import NamespaceRule, SignedRecord
from net.codec import unpack_bounded
from net.dht import RecordRejected

VERSION_NAMESPACE: Final = "version"


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
    max_ttl_s=3600.0, max_value_bytes=8192, check=_check_version, store_share=1 / 4
)
