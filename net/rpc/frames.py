"""Wire format of moehome's framed RPC: one frame per request or response.

A frame is a fixed 8-byte prefix, a msgpack header, then the raw bytes of zero or more
tensors, back to back::

    magic "MH" | version u8 | kind u8 | header length u32 (big-endian)
    header: msgpack map, at most Limits.max_header_bytes
    payload: tensor 0 bytes | tensor 1 bytes | ...

The header declares every tensor's dtype and shape, so the receiver knows the size of
everything that follows and checks it against its limits *before* it allocates a byte.
Nothing in a frame is executable: tensors are raw little-endian bytes, the header is plain
msgpack with extension types refused. This module has no I/O except the reader and writer
at the bottom, which work on any object with libp2p's stream interface (``read(n)``,
``write(data)``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio

from net.codec import NotMsgpack, pack, unpack_bounded

MiB: Final = 1024 * 1024
MAGIC: Final = b"MH"
WIRE_VERSION: Final = 1
KIND_REQUEST: Final = 1
KIND_RESPONSE: Final = 2
_PREFIX = struct.Struct(">2sBBI")
PREFIX_BYTES: Final = _PREFIX.size

#: Tensor dtypes that may cross the wire, with their item sizes. Names follow torch.
DTYPE_SIZES: Final[Mapping[str, int]] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

#: Writes larger than this are split, so one call never holds a huge buffer in Yamux.
WRITE_CHUNK_BYTES: Final = 1 * MiB
#: The smallest read asked of a stream (see FrameReader._read_into).
READ_AHEAD_BYTES: Final = 64 * 1024
#: Messages smaller than this go out as one write (fewer Yamux and Noise frames).
_COALESCE_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """What a peer accepts in one frame; checked before anything is allocated."""

    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_ndim: int = 8
    max_payload_bytes: int = 256 * MiB
    max_method_chars: int = 64


class FrameError(Exception):
    """A frame broke the protocol. ``request_id`` is set when the header was readable."""

    code = "bad_frame"

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class FrameTooLarge(FrameError):
    code = "too_large"

    def __init__(
        self, message: str, request_id: int | None = None, declared_bytes: int = 0
    ) -> None:
        super().__init__(message, request_id)
        #: Bytes the frame said would follow its header (0 when unknown).
        self.declared_bytes = declared_bytes


class StreamClosedEarly(FrameError):
    """The stream ended in the middle of a frame."""

    code = "truncated"


class StreamStalled(FrameError):
    """The sender stopped sending in the middle of a frame."""

    code = "stalled"


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor as it travels: dtype name, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray | memoryview

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"dtype {self.dtype!r} cannot be sent")
        expected = tensor_nbytes(self.dtype, self.shape)
        if len(memoryview(self.data).cast("B")) != expected:
            raise ValueError(
                f"tensor {self.dtype}{list(self.shape)} needs {expected} bytes, "
                f"got {len(memoryview(self.data).cast('B'))}"
            )

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def tensor_nbytes(dtype: str, shape: Sequence[int]) -> int:
    return DTYPE_SIZES[dtype] * math.prod(shape)


@dataclass(frozen=True)
class Request:
    method: str
    request_id: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)
    tensors: tuple[Tensor, ...] = ()
    #: Seconds the caller will wait; the server abandons the call after that.
    timeout: float | None = None


@dataclass(frozen=True)
class ErrorInfo:
    code: str
    message: str


@dataclass(frozen=True)
class Response:
    request_id: int
    meta: Mapping[str, Any] = field(default_factory=dict)
    tensors: tuple[Tensor, ...] = ()
    error: ErrorInfo | None = None


# ---------------------------------------------------------------- encoding


def encode_request(request: Request) -> list[bytes | memoryview]:
    header: dict[str, Any] = {
        "id": request.request_id,
        "m": request.method,
        "meta": dict(request.meta),
        "t": _tensor_specs(request.tensors),
    }
    if request.timeout is not None:
        header["to"] = float(request.timeout)
    return _frame(KIND_REQUEST, header, request.tensors)


def encode_response(response: Response) -> list[bytes | memoryview]:
    header: dict[str, Any] = {
        "id": response.request_id,
        "meta": dict(response.meta),
        "t": _tensor_specs(response.tensors),
    }
    if response.error is not None:
        header["err"] = [response.error.code, response.error.message]
    return _frame(KIND_RESPONSE, header, response.tensors)


def _tensor_specs(tensors: Sequence[Tensor]) -> list[list[Any]]:
    return [[t.dtype, list(t.shape)] for t in tensors]


def _frame(
    kind: int, header: dict[str, Any], tensors: Sequence[Tensor]
) -> list[bytes | memoryview]:
    header_bytes = pack(header)
    head = _PREFIX.pack(MAGIC, WIRE_VERSION, kind, len(header_bytes)) + header_bytes
    pieces: list[bytes | memoryview] = [head]
    for t in tensors:
        view = memoryview(t.data).cast("B")
        pieces.extend(
            view[i : i + WRITE_CHUNK_BYTES] for i in range(0, len(view), WRITE_CHUNK_BYTES)
        )
    if sum(len(p) for p in pieces) <= _COALESCE_BYTES:
        return [b"".join(pieces)]
    return pieces


# ---------------------------------------------------------------- decoding


@dataclass(frozen=True)
class FrameHeader:
    kind: int
    request_id: int
    fields: Mapping[str, Any]
    specs: tuple[tuple[str, tuple[int, ...], int], ...]

    @property
    def payload_bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self.specs)

    @property
    def method(self) -> str:
        return str(self.fields.get("m", ""))


def parse_prefix(prefix: bytes, limits: Limits) -> tuple[int, int]:
    """(kind, header length) of a frame's first 8 bytes."""
    magic, version, kind, header_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError("not a moehome frame (bad magic)")
    if version != WIRE_VERSION:
        raise FrameError(f"unsupported wire version {version}")
    if kind not in (KIND_REQUEST, KIND_RESPONSE):
        raise FrameError(f"unknown frame kind {kind}")
    if header_len > limits.max_header_bytes:
        raise FrameTooLarge(f"header of {header_len} bytes exceeds {limits.max_header_bytes}")
    return kind, header_len


def parse_header(kind: int, data: bytes, limits: Limits) -> FrameHeader:
    try:
        obj = unpack_bounded(data, limits.max_header_bytes)
    except NotMsgpack as exc:
        raise FrameError(f"header is not valid msgpack: {exc}") from exc
    if not isinstance(obj, dict):
        raise FrameError("header is not a map")
    request_id = obj.get("id")
    if (
        not isinstance(request_id, int)
        or isinstance(request_id, bool)
        or not 0 <= request_id < 2**64
    ):
        raise FrameError("header has no valid request id")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise FrameError("meta is not a map", request_id)
    specs = _parse_specs(obj.get("t", []), limits, request_id)
    if kind == KIND_REQUEST:
        method = obj.get("m")
        if not isinstance(method, str) or not 0 < len(method) <= limits.max_method_chars:
            raise FrameError("request has no valid method name", request_id)
        timeout = obj.get("to")
        if timeout is not None and (
            not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0
        ):
            raise FrameError("request timeout must be a positive number", request_id)
    else:
        err = obj.get("err")
        if err is not None and (
            not isinstance(err, list) or len(err) != 2 or not all(isinstance(x, str) for x in err)
        ):
            raise FrameError("malformed error in response", request_id)
    return FrameHeader(kind, request_id, obj, specs)


def _parse_specs(
    raw: Any, limits: Limits, request_id: int
) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    if not isinstance(raw, list):
        raise FrameError("tensor list is not a list", request_id)
    if len(raw) > limits.max_tensors:
        raise FrameTooLarge(
            f"{len(raw)} tensors exceed the limit of {limits.max_tensors}", request_id
        )
    specs = []
    total = 0
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise FrameError("tensor spec must be [dtype, shape]", request_id)
        dtype, shape = item
        # isinstance first: a list or map is unhashable, and `in` would raise TypeError
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise FrameError(f"dtype {str(dtype)[:40]!r} is not allowed", request_id)
        if not isinstance(shape, list) or len(shape) > limits.max_ndim:
            raise FrameError(f"shape must be a list of at most {limits.max_ndim} sizes", request_id)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise FrameError("shape sizes must be non-negative integers", request_id)
        # Bound each dimension before multiplying so the product cannot blow up.
        if any(d > limits.max_payload_bytes for d in shape):
            raise FrameTooLarge("a tensor dimension exceeds the payload limit", request_id)
        if total > limits.max_payload_bytes:  # stop multiplying once already over
            continue
        nbytes = tensor_nbytes(dtype, shape)
        total += nbytes
        specs.append((dtype, tuple(shape), nbytes))
    if total > limits.max_payload_bytes:
        raise FrameTooLarge(
            f"{total} bytes of tensors exceed the limit of {limits.max_payload_bytes}",
            request_id,
            declared_bytes=total,
        )
    return tuple(specs)


def build_request(header: FrameHeader, tensors: tuple[Tensor, ...]) -> Request:
    f = header.fields
    timeout = f.get("to")
    return Request(
        method=f["m"],
        request_id=header.request_id,
        meta=f.get("meta", {}),
        tensors=tensors,
        timeout=float(timeout) if timeout is not None else None,
    )


def build_response(header: FrameHeader, tensors: tuple[Tensor, ...]) -> Response:
    f = header.fields
    err = f.get("err")
    return Response(
        request_id=header.request_id,
        meta=f.get("meta", {}),
        tensors=tensors,
        error=ErrorInfo(err[0], err[1]) if err is not None else None,
    )


# ---------------------------------------------------------------- stream I/O


class ByteStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class FrameReader:
    """Reads whole frames from a stream, eagerly, with its own exact-read loop.

    libp2p's ``read_exactly`` gives up after 100 partial reads; this loop has no such cap.
    Reading eagerly matters too: Yamux resets a stream whose reader stalls for 5 s.
    """

    def __init__(self, stream: ByteStream, limits: Limits) -> None:
        self._stream = stream
        self._limits = limits
        self._pending = memoryview(b"")

    async def _read_into(
        self,
        buf: bytearray | memoryview,
        *,
        at_boundary: bool = False,
        stall_seconds: float | None = None,
    ) -> bool:
        """Fill ``buf`` completely. False only at a clean end of stream on a frame boundary.

        Reads ask for at least READ_AHEAD_BYTES: a small frame then arrives in one read
        instead of three (every libp2p read costs locks and, in Yamux, window bookkeeping).
        The surplus waits in ``_pending`` for the next frame.
        """
        view = memoryview(buf)
        filled = 0
        if self._pending:
            take = min(len(self._pending), len(view))
            view[:take] = self._pending[:take]
            self._pending = self._pending[take:]
            filled = take
        while filled < len(view):
            chunk = await self._read_raw(len(view) - filled, stall_seconds)
            if not chunk:
                if at_boundary and filled == 0:
                    return False
                raise StreamClosedEarly(f"stream ended after {filled} of {len(view)} bytes")
            take = min(len(chunk), len(view) - filled)
            view[filled : filled + take] = memoryview(chunk)[:take]
            if take < len(chunk):
                self._pending = memoryview(chunk)[take:]
            filled += take
        return True

    async def read_frame(self) -> tuple[FrameHeader, tuple[Tensor, ...]] | None:
        """The next frame, or None when the stream ended cleanly between frames."""
        header = await self.read_header()
        if header is None:
            return None
        return header, await self.read_payload(header)

    async def read_header(self, *, stall_seconds: float | None = None) -> FrameHeader | None:
        """Prefix and header of the next frame (the payload is still to be read or
        discarded), or None when the stream ended cleanly between frames. Waiting for a
        frame to begin has no limit here; once it has begun, a gap of ``stall_seconds``
        raises StreamStalled."""
        prefix = bytearray(PREFIX_BYTES)
        if not await self._read_into(prefix, at_boundary=True):
            return None
        kind, header_len = parse_prefix(bytes(prefix), self._limits)
        header_bytes = bytearray(header_len)
        await self._read_into(header_bytes, stall_seconds=stall_seconds)
        return parse_header(kind, bytes(header_bytes), self._limits)

    async def _read_raw(self, n: int, stall_seconds: float | None) -> bytes:
        """One read of the stream (b"" at its end); StreamStalled after a silent gap."""
        with trio.move_on_after(math.inf if stall_seconds is None else stall_seconds):
            try:
                return await self._stream.read(max(n, READ_AHEAD_BYTES))
            except EOFError:  # libp2p's StreamEOF derives from it
                return b""
        raise StreamStalled(f"no byte for {stall_seconds:g} s inside a frame")

    async def _read_chunk(self, limit: int, stall_seconds: float | None) -> memoryview:
        """Up to ``limit`` bytes of what arrives next (at least one byte)."""
        if self._pending:
            view = self._pending[:limit]
            self._pending = self._pending[len(view) :]
            return view
        chunk = await self._read_raw(limit, stall_seconds)
        if not chunk:
            raise StreamClosedEarly("stream ended inside a payload")
        view = memoryview(chunk)
        if len(view) > limit:
            self._pending = view[limit:]
            view = view[:limit]
        return view

    async def read_payload(
        self,
        header: FrameHeader,
        reserve: Callable[[int], None] | None = None,
        *,
        stall_seconds: float | None = None,
    ) -> tuple[Tensor, ...]:
        """The frame's tensors. Memory is taken as bytes arrive, never as declared: a
        header may declare 256 MiB and then send nothing. ``reserve(n)`` is called
        before each ``n`` bytes are kept and may raise to refuse them; a stream silent
        for ``stall_seconds`` raises StreamStalled."""
        tensors = []
        for dtype, shape, nbytes in header.specs:
            data = bytearray()
            while len(data) < nbytes:
                chunk = await self._read_chunk(
                    min(nbytes - len(data), WRITE_CHUNK_BYTES), stall_seconds
                )
                if reserve is not None:
                    reserve(len(chunk))
                data += chunk
            tensors.append(Tensor(dtype, shape, data))
        return tuple(tensors)

    async def discard_payload(
        self, header: FrameHeader, *, stall_seconds: float | None = None
    ) -> None:
        """Read past the payload keeping nothing (each chunk is dropped as it comes):
        the stream stays in step, and a refused request holds no memory."""
        left = header.payload_bytes
        while left:
            left -= len(await self._read_chunk(min(left, WRITE_CHUNK_BYTES), stall_seconds))


async def write_frame(stream: ByteStream, pieces: list[bytes | memoryview]) -> None:
    for piece in pieces:
        await stream.write(piece)  # type: ignore[arg-type]  # Yamux slices any buffer
