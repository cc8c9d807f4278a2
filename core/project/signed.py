"""The signed manifest: what volunteers receive, verify and pin.

The owner signs the manifest's exact msgpack bytes together with the key chain and the
hash of the weights index. The project id is derived from the *first* owner key and the
name, so it survives key rotations, and nobody without that key can publish under it.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Final

from core.project.keys import KeyRotation, OwnerKey, fingerprint
from core.project.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, parse_manifest
from net.codec import pack, unpack_bounded
from net.identity import verify_signature

_DOMAIN: Final = "moehome-manifest/1"
MAX_SIGNED_BYTES: Final = MAX_MANIFEST_BYTES + 8 * 1024
MAX_ROTATIONS: Final = 32


class ManifestRejected(ValueError):
    """A signed manifest failed verification; ``reason`` is a short word."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def project_id(origin_key: bytes, name: str) -> str:
    return hashlib.sha256(b"moehome-project/1" + origin_key + name.encode()).hexdigest()[:32]


def canonical(obj: Any) -> Any:
    """Dicts with sorted keys, all the way down: equal data gives equal bytes."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


@dataclass(frozen=True)
class SignedManifest:
    manifest_bytes: bytes  # canonical msgpack of the manifest
    origin_key: bytes
    owner_key: bytes
    rotations: tuple[KeyRotation, ...]
    weights_index: str  # SHA-256 (hex) of the weights index blob
    serial: int  # higher serial wins among valid manifests of a project
    signature: bytes

    @property
    def manifest(self) -> Manifest:
        return _parse(self.manifest_bytes)

    @property
    def project_id(self) -> str:
        return project_id(self.origin_key, self.manifest.project.name)

    def payload(self) -> bytes:
        return pack(
            [
                _DOMAIN,
                self.manifest_bytes,
                self.origin_key,
                self.owner_key,
                [r.to_obj() for r in self.rotations],
                self.weights_index,
                self.serial,
            ]
        )

    @classmethod
    def create(
        cls,
        manifest: Manifest,
        owner: OwnerKey,
        rotations: tuple[KeyRotation, ...],
        weights_index: str,
        serial: int | None = None,
    ) -> SignedManifest:
        origin = rotations[0].old if rotations else owner.public_key
        unsigned = cls(
            pack(canonical(manifest.to_obj())),
            origin,
            owner.public_key,
            rotations,
            weights_index,
            serial if serial is not None else time.time_ns() // 1000,
            b"",
        )
        signed = cls(**{**unsigned.__dict__, "signature": owner.sign(unsigned.payload())})
        signed.verify()  # a bug of ours must not be published
        return signed

    def verify(self) -> None:
        """Signature, key chain from the origin key, manifest schema. Raises ManifestRejected."""
        if len(self.rotations) > MAX_ROTATIONS:
            raise ManifestRejected("malformed", "too many key rotations")
        key = self.origin_key
        for rotation in self.rotations:
            if rotation.old != key or not rotation.verify():
                raise ManifestRejected(
                    "bad_rotation",
                    f"rotation from {fingerprint(rotation.old)} is not signed "
                    "by the key it replaces",
                )
            key = rotation.new
        if key != self.owner_key:
            raise ManifestRejected("bad_rotation", "the key chain does not end at the signing key")
        if not verify_signature(self.owner_key, self.payload(), self.signature):
            raise ManifestRejected(
                "bad_signature", f"not signed by owner key {fingerprint(self.owner_key)}"
            )
        try:
            self.manifest  # noqa: B018 - schema check
        except ManifestError as exc:
            raise ManifestRejected("schema", "; ".join(exc.problems[:3])) from exc

    def encode(self) -> bytes:
        return pack(
            [
                self.manifest_bytes,
                self.origin_key,
                self.owner_key,
                [r.to_obj() for r in self.rotations],
                self.weights_index,
                self.serial,
                self.signature,
            ]
        )

    @classmethod
    def decode(cls, data: bytes) -> SignedManifest:
        if len(data) > MAX_SIGNED_BYTES:
            raise ManifestRejected("too_large", f"{len(data)} bytes")
        try:
            obj = unpack_bounded(data, MAX_SIGNED_BYTES)
            (manifest_bytes, origin, owner, rotations, index, serial, signature) = obj
            if not (
                isinstance(manifest_bytes, bytes)
                and isinstance(origin, bytes)
                and isinstance(owner, bytes)
                and isinstance(rotations, list)
                and isinstance(index, str)
                and len(index) == 64
                and isinstance(serial, int)
                and isinstance(signature, bytes)
            ):
                raise TypeError("field types")
            return cls(
                manifest_bytes,
                origin,
                owner,
                tuple(KeyRotation.from_obj(r) for r in rotations),
                index,
                serial,
                signature,
            )
        except (TypeError, ValueError) as exc:
            raise ManifestRejected("malformed", f"not a signed manifest ({exc})") from exc
        except Exception as exc:  # msgpack's own errors on garbage
            raise ManifestRejected("malformed", f"not msgpack ({exc})") from exc


def _parse(manifest_bytes: bytes) -> Manifest:
    try:
        data = unpack_bounded(manifest_bytes, MAX_MANIFEST_BYTES)
    except Exception as exc:  # garbage inside a signed envelope
        raise ManifestError([f"manifest: not msgpack ({exc})"]) from exc
    if not isinstance(data, dict):
        raise ManifestError(["manifest: not a table"])
    return parse_manifest(data)
