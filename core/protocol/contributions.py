"""Receipts and contributions: the signed messages behind every gradient an aggregator
accepts. Canonical msgpack, bounded decoding, signatures over exact bytes."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import torch

from core.protocol.fields import MessageError as MessageError
from core.protocol.fields import bounded_int as _int
from core.protocol.fields import exact_bytes as _bytes
from core.protocol.fields import short_str as _str
from core.protocol.fields import unpack_message
from net.codec import pack, unpack_bounded
from net.identity import Identity, verify_signature

_RECEIPT_DOMAIN: Final = "moehome-receipt/1"
_CONTRIBUTION_DOMAIN: Final = "moehome-contribution/1"
MAX_RECEIPTS: Final = 4096
MAX_PARAMS: Final = 256
MAX_HEADER_BYTES: Final = 4 * 1024 * 1024
#: The uid under which trainers contribute changes of the trainer-side layers (no
#: expert's uid can be it: those are a grid's prefix and coordinates, "ffn0.1.2")
TRUNK_UID: Final = "trunk"
#: A volunteer carries no error-feedback residual from a contribution signed longer ago
#: than this: its aggregator forgets nonces an hour after (core/aggregator/replay.py),
#: and could then not audit the residual.
CARRY_HORIZON_S: Final = 600.0


def tensor_digest(tensors: Iterable[torch.Tensor]) -> bytes:
    """SHA-256 over the raw bytes of tensors, in order (what receipts and contributions
    commit to)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
    return h.digest()


@dataclass(frozen=True)
class Receipt:
    """A trainer's signed statement: "I sent this backward request to this expert"."""

    project: str
    uid: str
    version: int
    batch_id: bytes  # 16 random bytes, unique per request
    samples: int
    inputs_sha256: bytes
    grads_sha256: bytes
    trainer: bytes  # the trainer's Ed25519 public key
    signature: bytes = b""

    def payload(self) -> bytes:
        return pack(
            [
                _RECEIPT_DOMAIN,
                self.project,
                self.uid,
                self.version,
                self.batch_id,
                self.samples,
                self.inputs_sha256,
                self.grads_sha256,
                self.trainer,
            ]
        )

    @classmethod
    def sign(
        cls,
        trainer: Identity,
        project: str,
        uid: str,
        version: int,
        inputs: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        samples: int,
    ) -> Receipt:
        unsigned = cls(
            project,
            uid,
            version,
            os.urandom(16),
            samples,
            tensor_digest(inputs),
            tensor_digest(grads),
            trainer.public_key,
        )
        return replace(unsigned, signature=trainer.sign(unsigned.payload()))

    def verify(self) -> bool:
        return verify_signature(self.trainer, self.payload(), self.signature)

    def to_obj(self) -> list[Any]:
        return [
            self.project,
            self.uid,
            self.version,
            self.batch_id,
            self.samples,
            self.inputs_sha256,
            self.grads_sha256,
            self.trainer,
            self.signature,
        ]

    @classmethod
    def from_obj(cls, obj: Any) -> Receipt:
        if not isinstance(obj, list) or len(obj) != 9:
            raise MessageError("a receipt is a list of 9 fields")
        return cls(
            _str(obj[0], "project"),
            _str(obj[1], "uid"),
            _int(obj[2], "version"),
            _bytes(obj[3], 16, "batch_id"),
            _int(obj[4], "samples", 2**31),
            _bytes(obj[5], 32, "inputs_sha256"),
            _bytes(obj[6], 32, "grads_sha256"),
            _bytes(obj[7], 32, "trainer"),
            _bytes(obj[8], 64, "signature"),
        )

    def encode(self) -> bytes:
        return pack(self.to_obj())

    @classmethod
    def decode(cls, data: bytes) -> Receipt:
        try:
            return cls.from_obj(unpack_bounded(data, 1024))
        except MessageError:
            raise
        except Exception as exc:  # msgpack's errors on garbage
            raise MessageError(f"not a receipt: {exc}") from exc


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int


@dataclass(frozen=True)
class Contribution:
    """A volunteer's parameter gradient for one expert, with the receipts behind it."""

    project: str
    uid: str
    base_version: int
    samples: int
    codec: str
    params: tuple[ParamSpec, ...]
    receipts: tuple[Receipt, ...]
    nonce: bytes  # 16 random bytes; the same on every retry of this contribution
    timestamp: int  # unix seconds
    contributor: bytes  # the volunteer's peer key
    payload_sha256: bytes  # tensor_digest of the encoded parts, in order
    signature: bytes = b""
    #: the nonce of this contributor's previous contribution to this expert, whose
    #: compression residual (error feedback) this one carries; b"": none. An audit bounds
    #: the residual by that contribution's rounding (decision 010).
    carried: bytes = b""

    def signed_fields(self) -> list[Any]:
        return [
            _CONTRIBUTION_DOMAIN,
            self.project,
            self.uid,
            self.base_version,
            self.samples,
            self.codec,
            [[p.name, p.numel] for p in self.params],
            [r.to_obj() for r in self.receipts],
            self.nonce,
            self.timestamp,
            self.contributor,
            self.payload_sha256,
            # a 13th field only when set: contributions without it keep their bytes
            *([self.carried] if self.carried else []),
        ]

    @classmethod
    def create(
        cls,
        identity: Identity,
        *,
        project: str,
        uid: str,
        base_version: int,
        codec: str,
        params: Sequence[ParamSpec],
        receipts: Sequence[Receipt],
        parts: Sequence[torch.Tensor],
        nonce: bytes | None = None,
        timestamp: int | None = None,
        carried: bytes = b"",
    ) -> Contribution:
        unsigned = cls(
            project,
            uid,
            base_version,
            sum(r.samples for r in receipts),
            codec,
            tuple(params),
            tuple(receipts),
            nonce or os.urandom(16),
            timestamp or int(time.time()),
            identity.public_key,
            tensor_digest(parts),
            carried=carried,
        )
        return replace(unsigned, signature=identity.sign(pack(unsigned.signed_fields())))

    def verify_signature(self) -> bool:
        return verify_signature(self.contributor, pack(self.signed_fields()), self.signature)

    def encode(self) -> bytes:
        fields = self.signed_fields()[1:12]
        return pack([*fields, self.signature, *([self.carried] if self.carried else [])])

    @classmethod
    def decode(cls, data: bytes) -> Contribution:
        if len(data) > MAX_HEADER_BYTES:
            raise MessageError("contribution header too large")
        obj = unpack_message(data, MAX_HEADER_BYTES, "msgpack")
        if not isinstance(obj, list) or len(obj) not in (12, 13):
            raise MessageError("a contribution header is a list of 12 or 13 fields")
        carried = _bytes(obj[12], 16, "carried") if len(obj) == 13 else b""
        (
            project,
            uid,
            base_version,
            samples,
            codec,
            params,
            receipts,
            nonce,
            ts,
            contributor,
            digest,
            sig,
        ) = obj[:12]
        if not isinstance(params, list) or not 0 < len(params) <= MAX_PARAMS:
            raise MessageError(f"params must list 1..{MAX_PARAMS} tensors")
        if not isinstance(receipts, list) or len(receipts) > MAX_RECEIPTS:
            raise MessageError(f"at most {MAX_RECEIPTS} receipts")
        specs = []
        for p in params:
            if not (isinstance(p, list) and len(p) == 2):
                raise MessageError("a param spec is [name, numel]")
            specs.append(ParamSpec(_str(p[0], "param name", 128), _int(p[1], "numel", 2**31)))
        return cls(
            _str(project, "project"),
            _str(uid, "uid"),
            _int(base_version, "base_version"),
            _int(samples, "samples", 2**40),
            _str(codec, "codec", 16),
            tuple(specs),
            tuple(Receipt.from_obj(r) for r in receipts),
            _bytes(nonce, 16, "nonce"),
            _int(ts, "timestamp"),
            _bytes(contributor, 32, "contributor"),
            _bytes(digest, 32, "payload_sha256"),
            _bytes(sig, 64, "signature"),
            carried,
        )
