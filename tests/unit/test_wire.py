"""The frame codec, fed with valid, garbage, truncated and oversized input."""

from __future__ import annotations

import struct

import msgpack
import pytest

from net.rpc.frames import (
    KIND_REQUEST,
    KIND_RESPONSE,
    ErrorInfo,
    FrameError,
    FrameReader,
    FrameTooLarge,
    Limits,
    Request,
    Response,
    StreamClosedEarly,
    Tensor,
    build_request,
    build_response,
    encode_request,
    encode_response,
)


class MemoryStream:
    """Bytes in, bytes out, in chunks of a chosen size (like a libp2p stream)."""

    def __init__(self, data: bytes = b"", chunk: int = 7) -> None:
        self.data = bytearray(data)
        self.chunk = chunk
        self.written = bytearray()

    async def read(self, n: int | None = None) -> bytes:
        if not self.data:
            raise EOFError
        take = min(self.chunk, n or self.chunk, len(self.data))
        out = bytes(self.data[:take])
        del self.data[:take]
        return out

    async def write(self, data) -> None:
        self.written += bytes(data)


def frame_bytes(pieces) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def raw_frame(
    header: object, kind: int = KIND_REQUEST, payload: bytes = b"", magic=b"MH", version=1
) -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">2sBBI", magic, version, kind, len(h)) + h + payload


async def read_one(data: bytes, limits: Limits | None = None, chunk: int = 7):
    return await FrameReader(MemoryStream(data, chunk), limits or Limits()).read_frame()


async def test_request_round_trip_with_tensors():
    t1 = Tensor("float32", (2, 3), bytes(range(24)))
    t2 = Tensor("int64", (0,), b"")
    req = Request("expert.forward", 42, {"uid": "ffn.3.17", "n": [1, 2]}, (t1, t2), timeout=1.5)
    header, tensors = await read_one(frame_bytes(encode_request(req)))
    got = build_request(header, tensors)
    assert got.method == "expert.forward"
    assert got.request_id == 42
    assert got.meta == {"uid": "ffn.3.17", "n": [1, 2]}
    assert got.timeout == 1.5
    assert [(t.dtype, t.shape, bytes(t.data)) for t in got.tensors] == [
        ("float32", (2, 3), bytes(range(24))),
        ("int64", (0,), b""),
    ]


async def test_response_round_trip_with_error():
    resp = Response(7, {"a": 1}, (), ErrorInfo("bad_request", "shape mismatch"))
    header, tensors = await read_one(frame_bytes(encode_response(resp)), chunk=1)
    got = build_response(header, tensors)
    assert got == Response(7, {"a": 1}, (), ErrorInfo("bad_request", "shape mismatch"))


async def test_two_frames_back_to_back_in_one_chunk():
    data = frame_bytes(encode_request(Request("a", 1))) + frame_bytes(
        encode_request(Request("b", 2))
    )
    reader = FrameReader(MemoryStream(data, chunk=10_000), Limits())
    first = await reader.read_frame()
    second = await reader.read_frame()
    assert first is not None
    assert second is not None
    assert (first[0].fields["m"], second[0].fields["m"]) == ("a", "b")
    assert await reader.read_frame() is None


async def test_clean_end_of_stream_is_none():
    assert await read_one(b"") is None


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (b"XX\x01\x01\x00\x00\x00\x01\x80", FrameError, "magic"),
        (raw_frame({"id": 1, "m": "x"}, version=9), FrameError, "version"),
        (raw_frame({"id": 1, "m": "x"}, kind=9), FrameError, "kind"),
        (struct.pack(">2sBBI", b"MH", 1, 1, 10**9), FrameTooLarge, "header"),
        (struct.pack(">2sBBI", b"MH", 1, 1, 3) + b"\xc1\xc1\xc1", FrameError, "msgpack"),
        (raw_frame([1, 2, 3]), FrameError, "not a map"),
        (raw_frame({"m": "x"}), FrameError, "request id"),
        (raw_frame({"id": -1, "m": "x"}), FrameError, "request id"),
        (raw_frame({"id": 1}), FrameError, "method"),
        (raw_frame({"id": 1, "m": "x" * 65}), FrameError, "method"),
        (raw_frame({"id": 1, "m": "x", "to": -1}), FrameError, "timeout"),
        (raw_frame({"id": 1, "m": "x", "meta": [1]}), FrameError, "meta"),
        (raw_frame({"id": 1, "m": "x", "t": [["object", [1]]]}), FrameError, "dtype"),
        (raw_frame({"id": 1, "m": "x", "t": [["float32", [-1]]]}), FrameError, "non-negative"),
        (raw_frame({"id": 1, "m": "x", "t": [["float32", [1] * 9]]}), FrameError, "at most"),
        (raw_frame({"id": 1, "m": "x", "t": [["float32", [2**40]]]}), FrameTooLarge, "dimension"),
        (raw_frame({"id": 1, "m": "x", "t": [["uint8", [2**27]]] * 3}), FrameTooLarge, "exceed"),
        (raw_frame({"id": 1, "m": "x", "t": [["uint8", [1]]] * 65}), FrameTooLarge, "tensors"),
        (raw_frame({"id": 1, "err": ["x"]}, kind=KIND_RESPONSE), FrameError, "error"),
    ],
)
async def test_malformed_frames_are_refused_before_allocation(data, error, words):
    with pytest.raises(error, match=words):
        await read_one(data)


async def test_extension_types_are_refused():
    header = msgpack.packb({"id": 1, "m": "x", "meta": {"e": msgpack.ExtType(5, b"boom")}})
    data = struct.pack(">2sBBI", b"MH", 1, 1, len(header)) + header
    with pytest.raises(FrameError, match="extension"):
        await read_one(data)


async def test_oversized_payload_reports_declared_size_and_request_id():
    data = raw_frame({"id": 9, "m": "x", "t": [["float32", [1024, 1024, 80]]]})
    with pytest.raises(FrameTooLarge) as info:
        await read_one(data)
    assert info.value.request_id == 9
    assert info.value.declared_bytes == 4 * 1024 * 1024 * 80


@pytest.mark.parametrize("cut", [3, 8, 12, -5])
async def test_truncated_frames(cut):
    full = frame_bytes(encode_request(Request("m", 1, {}, (Tensor("uint8", (10,), bytes(10)),))))
    with pytest.raises(StreamClosedEarly):
        await read_one(full[:cut])


def test_tensor_size_must_match_shape():
    with pytest.raises(ValueError, match="needs 24 bytes"):
        Tensor("float32", (2, 3), b"\0" * 23)
    with pytest.raises(ValueError, match="cannot be sent"):
        Tensor("complex64", (1,), b"\0" * 8)


def test_small_messages_go_out_in_one_write_and_large_ones_in_chunks():
    assert len(encode_request(Request("m", 1, {}, (Tensor("uint8", (100,), bytes(100)),)))) == 1
    big = encode_request(Request("m", 1, {}, (Tensor("uint8", (3 * 2**20,), bytes(3 * 2**20)),)))
    assert len(big) == 4  # header + three 1 MiB pieces
    assert all(len(p) <= 2**20 for p in big[1:])
