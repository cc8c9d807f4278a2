"""Property tests: whatever bytes arrive, decoders either succeed or raise their own
error type, never anything else, and never allocate past the limits."""

from __future__ import annotations

import contextlib
import struct

import msgpack
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from net.dht.records import RecordRejected, SignedRecord
from net.wire import FrameError, FrameReader, Limits

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
    h = msgpack.packb({"id": 1, "m": "x", "t": [[d, s] for d, s in specs]})
    decode_all(struct.pack(">2sBBI", b"MH", 1, 1, len(h)) + h, [1000])


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200)
    | st.builds(lambda v: msgpack.packb(v, use_bin_type=True), header_values)
)
def test_random_records(data):
    with contextlib.suppress(RecordRejected):
        SignedRecord.decode(data, 4096)
