"""The peer's long-lived Ed25519 identity: created on first start, kept on disk.

The key file is PKCS#8 PEM, readable by the user only. A file that exists but cannot be
read as an Ed25519 key is an error: silently creating a new key would give the volunteer a
new PeerID and lose whatever the swarm knows about the old one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from net._libp2p import KeyPair, LibP2PPublicKey, PeerID, key_pair_from_seed

log = logging.getLogger(__name__)

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_MAX_KEY_FILE_BYTES = 16 * 1024


class IdentityError(Exception):
    """The identity key file cannot be used; the message says what to do."""


@dataclass(frozen=True)
class Identity:
    """An Ed25519 private key and what derives from it."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte seed (tests, benchmarks)."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte public key."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def seed(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def peer_id(self) -> PeerID:
        return peer_id_from_public_key(self.public_key)

    def key_pair(self) -> KeyPair:
        """The same key in libp2p's types, for the host's Noise handshake."""
        return key_pair_from_seed(self.seed)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message``."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


class VerifiedSignatures:
    """:func:`verify_signature` that remembers what it found valid, for messages seen
    again and again: a DHT record comes back from each of the peers that store it, on
    every lookup (a trainer's expert lookups at 32 volunteers: ~12% of its process in
    signature checks). Only valid signatures are remembered, each under a digest of
    key, signature and message together: a signature is never taken for another
    message. Two generations of ``capacity`` digests each bound the memory; the older is
    dropped when the newer fills. Safe from threads (the DHT checks large batches in a
    worker): at worst a signature is checked twice."""

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity = capacity
        self._new: set[bytes] = set()
        self._old: set[bytes] = set()
        self.checked = 0  # signatures actually verified
        self.remembered = 0  # answered from memory

    def verify(self, public_key: bytes, message: bytes, signature: bytes) -> bool:
        if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
            return False  # fixed lengths: the three parts cannot be cut elsewhere
        digest = hashlib.sha256(public_key + signature + message).digest()
        if digest in self._new or digest in self._old:
            self.remembered += 1
            return True
        self.checked += 1
        if not verify_signature(public_key, message, signature):
            return False
        if len(self._new) >= self.capacity:
            self._old, self._new = self._new, set()
        self._new.add(digest)
        return True


def peer_id_from_public_key(public_key: bytes) -> PeerID:
    """The libp2p PeerID of a raw Ed25519 public key."""
    return PeerID.from_pubkey(LibP2PPublicKey.from_bytes(public_key))


def public_key_of(peer_id: PeerID) -> bytes | None:
    """The raw Ed25519 public key an Ed25519 PeerID inlines (None for other ids)."""
    try:
        key = peer_id.extract_public_key()
    except Exception:  # noqa: BLE001 - a malformed id from a record: no key
        return None
    if key is None:
        return None
    raw = key.to_bytes()
    return raw if len(raw) == PUBLIC_KEY_BYTES else None


def load_or_create(path: Path) -> Identity:
    """The identity kept at ``path``; created there (mode 0600) if the file is absent."""
    if path.exists():
        return load(path)
    identity = Identity.generate()
    save(identity, path)
    log.info("created a new peer identity %s at %s", identity.peer_id, path)
    return identity


def load(path: Path) -> Identity:
    try:
        size = path.stat().st_size
        if size > _MAX_KEY_FILE_BYTES:
            raise IdentityError(f"{path} is {size} bytes: not an identity key file")
        data = path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"cannot read the identity key {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(
            f"the identity key file {path} is corrupt or not a PEM private key ({exc}). "
            "Restore it from a backup, or move it away to create a new identity "
            "(this gives this computer a new peer id)."
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    _warn_if_readable_by_others(path)
    return Identity(key)


def save(identity: Identity, path: Path) -> None:
    """Write the key atomically, readable and writable by the user only."""
    pem = identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private_file(path, pem)


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` atomically (temp file, fsync, rename) readable by the user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _warn_if_readable_by_others(path: Path) -> None:
    if sys.platform == "win32":
        return  # POSIX modes do not describe Windows ACLs; the user profile protects it
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users; fixing its mode to 0600", path)
        path.chmod(0o600)
