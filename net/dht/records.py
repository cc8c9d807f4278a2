"""Signed, expiring DHT records and the validators that guard them. Pure: no I/O.

A record says "``author`` states ``value`` for ``key`` until ``expires``". It is signed
with the author's Ed25519 key over canonical msgpack bytes. Many authors may hold a record
under one key (that is how "who serves expert ffn.3.17" is answered); per author the
newest record wins.

Keys look like ``/moehome/<namespace>/<rest>``. A namespace must be registered with a
:class:`NamespaceRule`; records of unknown namespaces are refused, locally and when a
remote peer asks us to store them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from net._libp2p import PeerID
from net.codec import pack, unpack_bounded
from net.identity import (
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    Identity,
    VerifiedSignatures,
    peer_id_from_public_key,
)

KEY_PREFIX: Final = "/moehome/"
MAX_KEY_BYTES: Final = 256
#: How far in the future a record's timestamp may be (clocks of volunteers disagree).
CLOCK_SKEW_MS: Final = 60_000
_SIGNING_DOMAIN: Final = "moehome-record/1"
_KEY_RE: Final = re.compile(r"^/moehome/([a-z0-9][a-z0-9-]{0,31})/([\x21-\x7e]{1,200})$")


class RecordRejected(ValueError):
    """A record failed validation; ``reason`` is a short machine-readable word."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def namespace_of(key: str) -> str:
    match = _KEY_RE.match(key)
    if match is None:
        raise RecordRejected(
            "bad_key", f"{key[:80]!r} is not /moehome/<namespace>/<printable name>"
        )
    return match.group(1)


@dataclass(frozen=True)
class SignedRecord:
    key: str
    value: bytes
    author: bytes  # raw Ed25519 public key
    timestamp_ms: int  # when the author made it: newest wins
    expires_ms: int
    signature: bytes

    def signing_payload(self) -> bytes:
        return signing_payload(
            self.key, self.value, self.author, self.timestamp_ms, self.expires_ms
        )

    def encode(self) -> bytes:
        return pack(
            [self.key, self.value, self.author, self.timestamp_ms, self.expires_ms, self.signature]
        )

    @classmethod
    def decode(cls, data: bytes, max_bytes: int) -> SignedRecord:
        if len(data) > max_bytes:
            raise RecordRejected("too_large", f"record of {len(data)} bytes > {max_bytes}")
        try:
            obj = unpack_bounded(data, max_bytes)
        except Exception as exc:  # msgpack raises many types for garbage
            raise RecordRejected("malformed", f"not msgpack ({exc})") from exc
        if not (isinstance(obj, list) and len(obj) == 6):
            raise RecordRejected("malformed", "a record is a list of 6 fields")
        key, value, author, timestamp, expires, signature = obj
        if not (
            isinstance(key, str)
            and isinstance(value, bytes)
            and isinstance(author, bytes)
            and isinstance(signature, bytes)
            and _is_int(timestamp)
            and _is_int(expires)
        ):
            raise RecordRejected("malformed", "a record field has the wrong type")
        return cls(key, value, author, timestamp, expires, signature)

    @property
    def author_peer_id(self) -> PeerID:
        return peer_id_from_public_key(self.author)

    def newer_than(self, other: SignedRecord) -> bool:
        """Order of records of one author under one key: timestamp, then expiry, then
        signature bytes so that every peer picks the same one."""
        return (self.timestamp_ms, self.expires_ms, self.signature) > (
            other.timestamp_ms,
            other.expires_ms,
            other.signature,
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63


def signing_payload(
    key: str, value: bytes, author: bytes, timestamp_ms: int, expires_ms: int
) -> bytes:
    return pack([_SIGNING_DOMAIN, key, value, author, timestamp_ms, expires_ms])


def sign_record(
    identity: Identity, key: str, value: bytes, ttl_s: float, now_ms: int
) -> SignedRecord:
    expires = now_ms + int(ttl_s * 1000)
    author = identity.public_key
    signature = identity.sign(signing_payload(key, value, author, now_ms, expires))
    return SignedRecord(key, value, author, now_ms, expires, signature)


@dataclass(frozen=True)
class NamespaceRule:
    """What a namespace accepts."""

    max_ttl_s: float = 3600.0
    max_value_bytes: int = 8 * 1024
    #: The key's first path part must be the author's PeerID: only that peer may write it.
    owner_in_key: bool = False
    #: Extra check of the value (schema); raise RecordRejected to refuse.
    check: Callable[[SignedRecord], None] | None = None
    #: Share of a peer's record store this namespace may fill: an open namespace's
    #: noise never pushes out the records that matter (net/dht/store.py).
    store_share: float = 0.5


#: A peer record names at most this many addresses, each at most this long.
MAX_PEER_ADDRS: Final = 16
MAX_PEER_ADDR_CHARS: Final = 256
_PEER_RECORD_BYTES: Final = 8 * 1024


def peer_record_key(peer_id: PeerID) -> str:
    """Where a peer announces its own addresses; only that peer may write there."""
    return f"{KEY_PREFIX}peer/{peer_id.to_base58()}"


def encode_peer_addrs(addrs: Sequence[str]) -> bytes:
    """The value of a peer record: the addresses to dial, best first (relayed last)."""
    kept = [a for a in addrs if len(a) <= MAX_PEER_ADDR_CHARS][:MAX_PEER_ADDRS]
    return pack({"addrs": kept})


def decode_peer_addrs(value: bytes) -> list[str]:
    """The addresses of a peer record; RecordRejected("schema") for anything else."""
    try:
        obj = unpack_bounded(value, _PEER_RECORD_BYTES)
    except ValueError as exc:
        raise RecordRejected("schema", f"peer record is not msgpack ({exc})") from exc
    addrs = obj.get("addrs") if isinstance(obj, dict) else None
    if not isinstance(addrs, list) or len(addrs) > MAX_PEER_ADDRS:
        raise RecordRejected("schema", f"a peer record holds a list of <= {MAX_PEER_ADDRS} addrs")
    for addr in addrs:
        if not (
            isinstance(addr, str) and addr.startswith("/") and len(addr) <= MAX_PEER_ADDR_CHARS
        ):
            raise RecordRejected("schema", f"{str(addr)[:60]!r} is not a multiaddress")
    return addrs


def _check_peer_record(record: SignedRecord) -> None:
    decode_peer_addrs(record.value)


#: Namespaces the network layer itself uses.
BUILTIN_NAMESPACES: Final[Mapping[str, NamespaceRule]] = {
    # /moehome/peer/<peer id>: a peer's own addresses, signed (net/reach/addressbook.py)
    "peer": NamespaceRule(
        max_ttl_s=3600.0,
        max_value_bytes=_PEER_RECORD_BYTES,
        owner_in_key=True,
        check=_check_peer_record,
        store_share=1 / 8,
    ),
    # /moehome/demo/<anything>: open namespace for demos, benchmarks and tests
    "demo": NamespaceRule(max_ttl_s=3600.0, store_share=1 / 16),
}


@dataclass(frozen=True)
class NamespacedValidator:
    """Checks records against their namespace's rule, signature and clock."""

    rules: Mapping[str, NamespaceRule] = field(default_factory=lambda: dict(BUILTIN_NAMESPACES))
    #: the signatures found valid (a record comes back from every peer that stores it)
    signatures: VerifiedSignatures = field(
        default_factory=VerifiedSignatures, compare=False, repr=False
    )

    def with_rules(self, rules: Mapping[str, NamespaceRule]) -> NamespacedValidator:
        """A validator that also accepts the given namespaces."""
        return NamespacedValidator({**self.rules, **rules})

    def validate(self, record: SignedRecord, now_ms: int) -> None:
        if len(record.key.encode()) > MAX_KEY_BYTES:
            raise RecordRejected("bad_key", f"key longer than {MAX_KEY_BYTES} bytes")
        namespace = namespace_of(record.key)
        rule = self.rules.get(namespace)
        if rule is None:
            raise RecordRejected("unknown_namespace", f"namespace {namespace!r} is not accepted")
        if len(record.value) > rule.max_value_bytes:
            raise RecordRejected(
                "too_large", f"value of {len(record.value)} bytes > {rule.max_value_bytes}"
            )
        if len(record.author) != PUBLIC_KEY_BYTES or len(record.signature) != SIGNATURE_BYTES:
            raise RecordRejected("bad_signature", "author key or signature has the wrong length")
        if record.expires_ms <= now_ms:
            raise RecordRejected(
                "expired", f"expired {(now_ms - record.expires_ms) / 1000:.1f} s ago"
            )
        if record.timestamp_ms > now_ms + CLOCK_SKEW_MS:
            raise RecordRejected("from_future", "timestamp is ahead of our clock")
        if record.expires_ms - record.timestamp_ms > rule.max_ttl_s * 1000:
            raise RecordRejected("ttl_too_long", f"lifetime exceeds {rule.max_ttl_s:g} s")
        if record.expires_ms < record.timestamp_ms:
            raise RecordRejected("malformed", "expires before it was made")
        if not self.signatures.verify(record.author, record.signing_payload(), record.signature):
            raise RecordRejected("bad_signature", "signature does not match author and content")
        if rule.owner_in_key:
            owner = record.key[len(KEY_PREFIX) + len(namespace) + 1 :].split("/", 1)[0]
            if owner != record.author_peer_id.to_base58():
                raise RecordRejected("wrong_author", f"only {owner} may write {record.key}")
        if rule.check is not None:
            try:
                rule.check(record)
            except RecordRejected:
                raise
            except Exception as exc:  # a check's own slip is still a refusal
                raise RecordRejected("schema", f"{type(exc).__name__}: {exc}"[:200]) from exc

    def store_share(self, namespace: str) -> float:
        rule = self.rules.get(namespace)
        return rule.store_share if rule is not None else 0.0
