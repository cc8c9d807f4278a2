from __future__ import annotations

import stat
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from net.identity import (
    Identity,
    IdentityError,
    VerifiedSignatures,
    load,
    load_or_create,
    peer_id_from_public_key,
    verify_signature,
)


def test_created_on_first_start_and_kept(tmp_path):
    path = tmp_path / "sub" / "identity.key"
    first = load_or_create(path)
    assert path.exists()
    if sys.platform != "win32":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create(path)
    assert again.peer_id == first.peer_id
    assert str(first.peer_id).startswith("12D3KooW")  # Ed25519 PeerIDs are identity multihashes


def test_peer_id_derives_from_the_public_key():
    identity = Identity.from_seed(bytes(range(32)))
    assert peer_id_from_public_key(identity.public_key) == identity.peer_id
    assert identity.key_pair().public_key.to_bytes() == identity.public_key


def test_signatures():
    identity = Identity.generate()
    sig = identity.sign(b"hello")
    assert verify_signature(identity.public_key, b"hello", sig)
    assert not verify_signature(identity.public_key, b"hellO", sig)
    assert not verify_signature(Identity.generate().public_key, b"hello", sig)
    assert not verify_signature(identity.public_key[:31], b"hello", sig)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a key at all",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        b"\x00" * 100,
    ],
)
def test_a_corrupt_key_file_is_a_clear_error_not_a_new_identity(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_bytes(content)
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create(path)
    assert path.read_bytes() == content  # never overwritten


def test_a_key_of_another_type_is_refused(tmp_path):
    path = tmp_path / "identity.key"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        load(path)


def test_a_huge_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "identity.key"
    path.write_bytes(b"x" * 100_000)
    with pytest.raises(IdentityError, match="not an identity key file"):
        load(path)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_key_readable_by_others_is_tightened(tmp_path):
    path = tmp_path / "identity.key"
    load_or_create(path)
    path.chmod(0o644)
    load(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_verified_signatures_remember_only_valid_ones_and_stay_bounded():
    identity = Identity.generate()
    memo = VerifiedSignatures(capacity=4)
    sig = identity.sign(b"hello")
    assert memo.verify(identity.public_key, b"hello", sig)
    assert memo.verify(identity.public_key, b"hello", sig)
    assert (memo.checked, memo.remembered) == (1, 1)
    assert not memo.verify(identity.public_key, b"hellO", sig)  # the same signature
    assert not memo.verify(Identity.generate().public_key, b"hello", sig)
    # one bit of S flipped: always another signature (its last byte was set to 0 before,
    # which left a sixteenth of signatures unchanged: S is below the group order, about
    # 2**252, so that byte is 0 to 16; measured: 265 of 4,000)
    forged = sig[:63] + bytes([sig[63] ^ 1])
    assert not memo.verify(identity.public_key, b"hello", forged)
    assert not memo.verify(identity.public_key, b"hello", forged)  # not remembered
    # the same bytes cut elsewhere: never the remembered signature
    assert not memo.verify(identity.public_key[:31], b"hello", identity.public_key[31:] + sig)
    assert not memo.verify(identity.public_key + sig[:1], sig[1:] + b"hello"[:1], b"ello")
    assert memo.checked == 5
    messages = [f"m{i}".encode() for i in range(20)]
    for m in messages:
        assert memo.verify(identity.public_key, m, identity.sign(m))
    assert len(memo._new) + len(memo._old) <= 2 * 4
    checked = memo.checked
    assert memo.verify(identity.public_key, messages[-1], identity.sign(messages[-1]))
    assert memo.checked == checked  # the newest are still remembered
    assert memo.verify(identity.public_key, messages[0], identity.sign(messages[0]))
    assert memo.checked == checked + 1  # the oldest were forgotten, and checked again
