"""Signed answers: a volunteer's statement, with every expert answer, of what it
computed: "version V of expert U, on inputs (and output gradients) with these hashes,
gives the answer whose parts have this hash". A trainer whose audit finds the answer is
not what those weights compute holds the volunteer's own signature over its claim:
evidence anyone with the published weights can check (decision 010)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from core.protocol.fields import MessageError, unpack_message
from core.protocol.fields import bounded_int as _int
from core.protocol.fields import exact_bytes as _bytes
from core.protocol.fields import short_str as _str
from net.codec import pack
from net.identity import Identity, verify_signature
from net.rpc import Tensor

_ANSWER_DOMAIN: Final = "moehome-answer/1"
KINDS: Final = ("forward", "backward")
#: no digest: a forward answer has no output gradients
NONE: Final = bytes(32)


def parts_digest(parts: Iterable[Tensor]) -> bytes:
    """SHA-256 over an answer's wire parts as they travel (dtype, shape, bytes)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(f"{p.dtype}|{tuple(p.shape)}|".encode())
        h.update(memoryview(p.data).cast("B"))
    return h.digest()


@dataclass(frozen=True)
class AnswerStatement:
    project: str
    uid: str
    version: int
    kind: Literal["forward", "backward"]
    codec: str
    inputs_sha256: bytes  # tensor_digest of the inputs as the server decoded them
    grads_sha256: bytes  # ... of the output gradients (backward), else NONE
    answer_sha256: bytes  # parts_digest of the answer's parts
    volunteer: bytes  # the volunteer's Ed25519 public key
    signature: bytes = b""

    def payload(self) -> bytes:
        return pack([_ANSWER_DOMAIN, *self.to_obj()[:-1]])

    @classmethod
    def sign(cls, volunteer: Identity, **fields: Any) -> AnswerStatement:
        unsigned = cls(**fields, volunteer=volunteer.public_key)
        return replace(unsigned, signature=volunteer.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.volunteer, self.payload(), self.signature)

    def to_obj(self) -> list[Any]:
        return [
            self.project,
            self.uid,
            self.version,
            self.kind,
            self.codec,
            self.inputs_sha256,
            self.grads_sha256,
            self.answer_sha256,
            self.volunteer,
            self.signature,
        ]

    def encode(self) -> bytes:
        return pack(self.to_obj())

    @classmethod
    def decode(cls, data: object) -> AnswerStatement:
        if not isinstance(data, bytes) or len(data) > 1024:
            raise MessageError("an answer statement is at most 1 KiB of bytes")
        obj = unpack_message(data, 1024, "an answer statement")
        if not isinstance(obj, list) or len(obj) != 10:
            raise MessageError("an answer statement is a list of 10 fields")
        kind = obj[3]
        if kind not in KINDS:
            raise MessageError("kind must be forward or backward")
        return cls(
            _str(obj[0], "project"),
            _str(obj[1], "uid"),
            _int(obj[2], "version"),
            kind,
            _str(obj[4], "codec", 8),
            _bytes(obj[5], 32, "inputs_sha256"),
            _bytes(obj[6], 32, "grads_sha256"),
            _bytes(obj[7], 32, "answer_sha256"),
            _bytes(obj[8], 32, "volunteer"),
            _bytes(obj[9], 64, "signature"),
        )
