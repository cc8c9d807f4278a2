"""Ban records: a project's trainers and aggregators say in the DHT whom they caught
cheating, under /moehome/ban/<project>; each accuser's record (signed by its peer key, as
every record) lists its bans, each with the cheater's own signed statement of the answer
it failed (core/protocol/answers.py) and when the ban ends. Which accusers count is the
manifest's business (its trainers and aggregators): readers filter by author."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from core.protocol.answers import AnswerStatement
from core.protocol.fields import MessageError, unpack_message
from net import NamespaceRule, SignedRecord
from net.codec import pack
from net.dht import RecordRejected

BAN_NAMESPACE: Final = "ban"
#: bans one accuser's record holds (the newest; older ones drop out)
MAX_BANS: Final = 32
MAX_REASON_CHARS: Final = 200
_MAX_VALUE_BYTES: Final = 16 * 1024


def ban_key(project: str) -> str:
    return f"/moehome/{BAN_NAMESPACE}/{project}"


@dataclass(frozen=True)
class Ban:
    peer: str  # the banned peer's id (base58)
    reason: str
    until: float  # unix seconds
    #: the cheater's signed statement of the answer that failed its audit (bytes), or
    #: b"" when it sent none
    statement: bytes
    excess: float  # how far past an honest answer's bound (inf: unsigned)

    def to_obj(self) -> list[Any]:
        excess = self.excess if math.isfinite(self.excess) else -1.0
        return [self.peer, self.reason, self.until, self.statement, excess]

    @classmethod
    def from_obj(cls, obj: Any) -> Ban:
        if not isinstance(obj, list) or len(obj) != 5:
            raise MessageError("a ban is a list of 5 fields")
        peer, reason, until, statement, excess = obj
        if not isinstance(peer, str) or not 0 < len(peer) <= 64:
            raise MessageError("peer must be a peer id")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise MessageError(f"reason must be a string of at most {MAX_REASON_CHARS}")
        if not isinstance(until, (int, float)) or isinstance(until, bool):
            raise MessageError("until must be a number")
        if not isinstance(excess, (int, float)) or isinstance(excess, bool):
            raise MessageError("excess must be a number")
        if not isinstance(statement, bytes):
            raise MessageError("statement must be bytes")
        if statement:
            AnswerStatement.decode(statement)
        return cls(peer, reason, float(until), statement, math.inf if excess < 0 else excess)


def encode_bans(project: str, bans: list[Ban]) -> bytes:
    return pack({"project": project, "bans": [b.to_obj() for b in bans[-MAX_BANS:]]})


def decode_bans(value: bytes) -> tuple[str, list[Ban]]:
    obj = unpack_message(value, _MAX_VALUE_BYTES, "a ban list")
    if not isinstance(obj, dict) or not isinstance(obj.get("project"), str):
        raise MessageError("a ban list names its project")
    bans = obj.get("bans")
    if not isinstance(bans, list) or len(bans) > MAX_BANS:
        raise MessageError(f"a ban list holds at most {MAX_BANS} bans")
    return obj["project"], [Ban.from_obj(b) for b in bans]


def _check(record: SignedRecord) -> None:
    try:
        project, _ = decode_bans(record.value)
    except MessageError as exc:
        raise RecordRejected("schema", str(exc)) from exc
    if record.key != ban_key(project):
        raise RecordRejected("schema", "a ban list is kept under its project's key")


BAN_RULE: Final = NamespaceRule(
    max_ttl_s=24 * 3600.0, max_value_bytes=_MAX_VALUE_BYTES, check=_check, store_share=1 / 16
)
