"""Credit statements: an aggregator's signed word of what a contributor earned, per UTC
day, on the rounds it ran (core/aggregator/credit.py says how credit is granted and
taken back). A volunteer collects one from each of the project's aggregators and can
show them to anyone: each is checked against the manifest's aggregator keys alone.

agg.credit  meta {contributor: its 32-byte public key} -> meta {statement: bytes}

Canonical msgpack, bounded decoding, a signature over exact bytes, as receipts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from core.protocol.fields import MessageError, nonnegative_float, unpack_message
from core.protocol.fields import bounded_int as _int
from core.protocol.fields import exact_bytes as _bytes
from core.protocol.fields import short_str as _str
from net.codec import pack, unpack_bounded
from net.identity import Identity, verify_signature

CREDIT: Final = "agg.credit"
_DOMAIN: Final = "moehome-credit/1"
#: days one statement lists (an aggregator's ledger keeps fewer: credit.MAX_DAYS, plus
#: the day that sums the older ones)
MAX_STATEMENT_DAYS: Final = 1024
MAX_STATEMENT_BYTES: Final = 64 * 1024
#: the day under which a ledger sums the days it no longer lists one by one
EARLIER_DAY: Final = -1
DAY_SECONDS: Final = 86_400.0


def day_of(wall_seconds: float) -> int:
    """The UTC day (days since 1970-01-01) of a time in seconds since the epoch."""
    return int(wall_seconds // DAY_SECONDS)


@dataclass(frozen=True)
class CreditStatement:
    project: str
    #: the contributor's Ed25519 public key (its node's identity)
    contributor: bytes
    #: (UTC day, credit) in increasing days; day -1 sums the days before those listed
    days: tuple[tuple[int, float], ...]
    #: credit taken back by bans
    revoked: float
    #: when the aggregator stated it (unix seconds)
    issued: float
    aggregator: bytes
    signature: bytes = b""

    @property
    def total(self) -> float:
        return sum(c for _, c in self.days)

    def payload(self) -> bytes:
        """What the aggregator signs: every field but the signature, under a domain."""
        return pack([_DOMAIN, *self.to_obj()[:-1]])

    @classmethod
    def sign(
        cls,
        aggregator: Identity,
        project: str,
        contributor: bytes,
        days: dict[int, float],
        revoked: float,
        issued: float,
    ) -> CreditStatement:
        unsigned = cls(
            project,
            contributor,
            tuple(sorted((int(d), float(c)) for d, c in days.items())),
            float(revoked),
            float(issued),
            aggregator.public_key,
        )
        return replace(unsigned, signature=aggregator.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.aggregator, self.payload(), self.signature)

    def to_obj(self) -> list[Any]:
        return [
            self.project,
            self.contributor,
            [[d, c] for d, c in self.days],
            self.revoked,
            self.issued,
            self.aggregator,
            self.signature,
        ]

    @classmethod
    def from_obj(cls, obj: Any) -> CreditStatement:
        if not isinstance(obj, list) or len(obj) != 7:
            raise MessageError("a credit statement is a list of 7 fields")
        raw_days = obj[2]
        if not isinstance(raw_days, list) or len(raw_days) > MAX_STATEMENT_DAYS:
            raise MessageError(f"days must be a list of at most {MAX_STATEMENT_DAYS}")
        days: list[tuple[int, float]] = []
        for entry in raw_days:
            if not isinstance(entry, list) or len(entry) != 2:
                raise MessageError("a day is [day, credit]")
            day = -1 if entry[0] == EARLIER_DAY else _int(entry[0], "day", 2**31)
            if days and day <= days[-1][0]:
                raise MessageError("days must increase")
            days.append((day, nonnegative_float(entry[1], "credit")))
        issued = nonnegative_float(obj[4], "issued")
        return cls(
            _str(obj[0], "project"),
            _bytes(obj[1], 32, "contributor"),
            tuple(days),
            nonnegative_float(obj[3], "revoked"),
            issued,
            _bytes(obj[5], 32, "aggregator"),
            _bytes(obj[6], 64, "signature"),
        )

    def encode(self) -> bytes:
        return pack(self.to_obj())

    @classmethod
    def decode(cls, data: bytes) -> CreditStatement:
        if len(data) > MAX_STATEMENT_BYTES:
            raise MessageError(f"a credit statement is at most {MAX_STATEMENT_BYTES} bytes")
        try:
            return cls.from_obj(unpack_bounded(data, MAX_STATEMENT_BYTES))
        except MessageError:
            raise
        except Exception as exc:  # msgpack's errors on garbage
            raise MessageError(f"not a credit statement: {exc}") from exc


_LINK_DOMAIN: Final = "moehome-account-link/1"


@dataclass(frozen=True)
class AccountLink:
    """A node's signed word: "my credit counts for this account". A volunteer's several
    computers each sign one to the same account key, so their proofs add up under it
    (core/project/credit_proof.py). Only the node signs: a link can give credit away,
    never take any (the account key proves nothing by itself)."""

    account: bytes  # the account's Ed25519 public key
    node: bytes  # the node's, whose credit it claims
    created: float  # unix seconds
    signature: bytes = b""

    def payload(self) -> bytes:
        return pack([_LINK_DOMAIN, self.account, self.node, self.created])

    @classmethod
    def sign(cls, node: Identity, account: bytes, created: float) -> AccountLink:
        unsigned = cls(account, node.public_key, float(created))
        return replace(unsigned, signature=node.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.node, self.payload(), self.signature)

    def encode(self) -> bytes:
        return pack([self.account, self.node, self.created, self.signature])

    @classmethod
    def decode(cls, data: bytes) -> AccountLink:
        if len(data) > 1024:
            raise MessageError("an account link is at most 1024 bytes")
        obj = unpack_message(data, 1024, "an account link")
        if not isinstance(obj, list) or len(obj) != 4:
            raise MessageError("an account link is a list of 4 fields")
        return cls(
            _bytes(obj[0], 32, "account"),
            _bytes(obj[1], 32, "node"),
            nonnegative_float(obj[2], "created"),
            _bytes(obj[3], 64, "signature"),
        )
