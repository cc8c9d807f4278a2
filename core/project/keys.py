"""The project owner's Ed25519 key: created by ``moehome owner init``, optionally
protected by a passphrase, rotated with a record signed by the old key."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core.errors import UserFacingError
from net.codec import pack, unpack_bounded
from net.identity import verify_signature, write_private_file

_ROTATION_DOMAIN = "moehome-owner-rotation/1"
_MAX_KEY_FILE = 16 * 1024


class OwnerKeyError(UserFacingError):
    """The owner key cannot be used; the message says why and what to do."""


def fingerprint(public_key: bytes) -> str:
    """A short, readable name of a public key: 4 groups of 4 hex digits of its SHA-256."""
    digest = hashlib.sha256(public_key).hexdigest()[:16]
    return "-".join(digest[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class OwnerKey:
    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> OwnerKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def save(self, path: Path, passphrase: str | None = None) -> None:
        """Write atomically, readable by the user only; encrypted when a passphrase is given."""
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(passphrase.encode())
            if passphrase
            else serialization.NoEncryption()
        )
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
        write_private_file(path, pem)

    @classmethod
    def load(cls, path: Path, passphrase: str | None = None) -> OwnerKey:
        try:
            if path.stat().st_size > _MAX_KEY_FILE:
                raise OwnerKeyError(f"{path} is not an owner key file (too large)")
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise OwnerKeyError(f"no owner key at {path}: run `moehome owner init` first") from exc
        except OSError as exc:
            raise OwnerKeyError(f"cannot read {path}: {exc.strerror}") from exc
        encrypted = b"ENCRYPTED" in data
        if encrypted and not passphrase:
            raise OwnerKeyError(
                f"{path} is protected by a passphrase: give it "
                "(--passphrase-file or MOEHOME_OWNER_PASSPHRASE)"
            )
        try:
            key = serialization.load_pem_private_key(
                data, password=passphrase.encode() if encrypted and passphrase else None
            )
        except ValueError as exc:
            hint = "wrong passphrase, or " if encrypted else ""
            raise OwnerKeyError(
                f"cannot read the owner key {path}: {hint}not a PEM private key"
            ) from exc
        except TypeError as exc:
            raise OwnerKeyError(f"cannot read the owner key {path}: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise OwnerKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)


@dataclass(frozen=True)
class KeyRotation:
    """``old`` hands ownership to ``new``; signed by ``old``."""

    old: bytes
    new: bytes
    timestamp: int
    signature: bytes

    @staticmethod
    def payload(old: bytes, new: bytes, timestamp: int) -> bytes:
        return pack([_ROTATION_DOMAIN, old, new, timestamp])

    @classmethod
    def create(cls, old_key: OwnerKey, new_public: bytes) -> KeyRotation:
        ts = int(time.time())
        return cls(
            old_key.public_key,
            new_public,
            ts,
            old_key.sign(cls.payload(old_key.public_key, new_public, ts)),
        )

    def verify(self) -> bool:
        return verify_signature(
            self.old, self.payload(self.old, self.new, self.timestamp), self.signature
        )

    def to_obj(self) -> list[Any]:
        return [self.old, self.new, self.timestamp, self.signature]

    @classmethod
    def from_obj(cls, obj: Any) -> KeyRotation:
        if not (
            isinstance(obj, list)
            and len(obj) == 4
            and isinstance(obj[0], bytes)
            and isinstance(obj[1], bytes)
            and isinstance(obj[2], int)
            and isinstance(obj[3], bytes)
        ):
            raise ValueError("a key rotation is [old, new, timestamp, signature]")
        return cls(obj[0], obj[1], obj[2], obj[3])

    def encode(self) -> bytes:
        return pack(self.to_obj())

    @classmethod
    def decode(cls, data: bytes) -> KeyRotation:
        return cls.from_obj(unpack_bounded(data, 1024))
