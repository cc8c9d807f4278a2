"""Property tests: whatever bytes arrive, decoders either succeed or raise their own
error type, never anything else, and never allocate past the limits."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc

import msgpack
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from net.dht.records import RecordRejected, SignedRecord
from net.rpc.frames import FrameError, FrameReader, Limits

LIMITS = Limits(max_header_bytes=4096, max_payload_bytes=1 << 20)


class Chunks:
    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.sizes = sizes or [7]
        self.i = 0
        self.largest_request = 0

    async def read(self, n: int | None = None) -> bytes:
        if not self.data:
            raise EOFError
        size = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        out, self.data = self.data[:size], self.data[size:]
        return out

    async def write(self, data) -> None:  # pragma: no cover - readers never write
        raise AssertionError


def decode_all(data: bytes, sizes: list[int]) -> None:
    async def main() -> None:
        reader = FrameReader(Chunks(data, sizes), LIMITS)
        for _ in range(4):
            try:
                if await reader.read_frame() is None:
                    return
            except FrameError:
                return

    trio.run(main)


header_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.lists(st.integers(1, 64), max_size=5))
def test_random_bytes(data, sizes):
    decode_all(data, sizes)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["id", "m", "meta", "t", "to", "err", "x"]), header_values),
    st.binary(max_size=64),
)
def test_well_framed_random_headers(header, payload):
    h = msgpack.packb(header, use_bin_type=True)
    decode_all(struct.pack(">2sBBI", b"MH", 1, 1, len(h)) + h + payload, [1000])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["float32", "uint8", "bfloat16", "x"]),
            st.lists(st.integers(-5, 1 << 22), max_size=9),
        ),
        max_size=70,
    )
)
def test_random_tensor_specs_never_allocate_past_the_limit(specs):
    """Headers declaring tensors of any size, and no payload: what the reader allocates
    is measured, and stays far below the limit (memory comes only as bytes arrive; it
    used to be allocated, and zero-filled, as declared)."""
    h = msgpack.packb({"id": 1, "m": "x", "t": [[d, s] for d, s in specs]})
    tracemalloc.start()
    try:
        decode_all(struct.pack(">2sBBI", b"MH", 1, 1, len(h)) + h, [1000])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < LIMITS.max_payload_bytes // 8


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200)
    | st.builds(lambda v: msgpack.packb(v, use_bin_type=True), header_values)
)
def test_random_records(data):
    with contextlib.suppress(RecordRejected):
        SignedRecord.decode(data, 4096)


# ---------------------------------------------------------------- wrong types everywhere
#
# Issue 14: the 37-byte frame that stopped a node had a list where a string belonged.
# Values of any type, in every position, for every decoder and every namespace's check:
# each either succeeds or raises its own error type.

import time  # noqa: E402
from functools import partial  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from core.experts.records import ExpertAnnouncement, PrefixAnnouncement  # noqa: E402
from core.experts.registry import ExpertSpec, SpecError  # noqa: E402
from core.namespaces import moehome_validator  # noqa: E402
from core.project.chunks import WeightsIndex  # noqa: E402
from core.project.keys import KeyRotation  # noqa: E402
from core.project.records import ProviderAnnouncement, directory_ids  # noqa: E402
from core.project.signed import ManifestRejected, SignedManifest  # noqa: E402
from core.protocol.contributions import Contribution, MessageError, Receipt  # noqa: E402
from net._libp2p import PeerID  # noqa: E402
from net.dht.node import DhtNode  # noqa: E402
from net.dht.records import sign_record  # noqa: E402
from net.dht.routing import RoutingTable  # noqa: E402
from net.identity import Identity  # noqa: E402

any_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=24,
)


def packed(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def lists_of(n: int):
    """A message of the right shape (a list of n fields) with fields of any type."""
    return st.lists(any_value, min_size=n, max_size=n)


def garbage(shape_fields: int | None = None):
    strategies = [st.binary(max_size=200), any_value]
    if shape_fields is not None:
        strategies.append(lists_of(shape_fields))
    return st.one_of(*strategies).map(lambda v: v if isinstance(v, bytes) else packed(v))


DECODERS = [
    ("record", lambda b: SignedRecord.decode(b, 4096), RecordRejected, 6),
    ("receipt", Receipt.decode, MessageError, 9),
    ("contribution", Contribution.decode, MessageError, 12),
    ("expert announcement", ExpertAnnouncement.decode, RecordRejected, None),
    ("prefix announcement", PrefixAnnouncement.decode, RecordRejected, None),
    ("provider announcement", ProviderAnnouncement.decode, RecordRejected, None),
    ("directory", directory_ids, RecordRejected, None),
    ("signed manifest", SignedManifest.decode, ManifestRejected, 7),
    ("weights index", WeightsIndex.decode, ValueError, None),
    ("key rotation", KeyRotation.decode, ValueError, 4),
]


@pytest.mark.parametrize(
    ("name", "decode", "error", "fields"), DECODERS, ids=[d[0] for d in DECODERS]
)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_decoder_raises_only_its_own_error(name, decode, error, fields, data):
    blob = data.draw(garbage(fields))
    with contextlib.suppress(error):
        decode(blob)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(ExpertSpec.__dataclass_fields__)), any_value))
def test_an_expert_spec_of_any_types_is_a_spec_error(fields):
    with contextlib.suppress(SpecError):
        ExpertSpec.from_dict(fields)


SIGNER = Identity.from_seed(b"s" * 32)
KEYS = [
    "/moehome/expert/demo/ffn.0.1",
    "/moehome/expert/demo/ffn.0.",
    "/moehome/version/demo/ffn.0.1",
    f"/moehome/project/{'a' * 32}",
    f"/moehome/rotation/{SIGNER.public_key.hex()}",
    f"/moehome/weights/{'b' * 32}",
    "/moehome/directory/projects",
    f"/moehome/peer/{SIGNER.peer_id.to_base58()}",
    "/moehome/demo/anything",
]


@pytest.mark.parametrize("key", KEYS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_namespace_check_refuses_any_value_with_a_record_rejected(key, data):
    """A record whose signature is good reaches its namespace's schema check: whatever
    its value holds, the check says no with RecordRejected (never another error)."""
    value = data.draw(garbage())
    now = int(time.time() * 1000)
    record = sign_record(SIGNER, key, value, 60, now)
    with contextlib.suppress(RecordRejected):
        moehome_validator().validate(record, now)


@settings(max_examples=200, deadline=None)
@given(any_value)
def test_contacts_in_a_dht_reply_of_any_shape_are_skipped_not_raised(raw):
    routing: RoutingTable[PeerID] = RoutingTable(0)
    relay = Identity.generate().peer_id  # circuits through a relay we know are kept
    routing.add(relay, 1, ["/ip4/198.18.0.1/tcp/4001"], 0.0)
    fake = SimpleNamespace(config=SimpleNamespace(k=20), routing=routing)
    fake._known_circuits = partial(DhtNode._known_circuits, fake)  # type: ignore[arg-type]
    list(DhtNode._parse_contacts(fake, raw))  # type: ignore[arg-type]
