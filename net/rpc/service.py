"""Request/response RPC with tensor payloads over raw libp2p streams.

One call occupies one stream at a time; streams are pooled per peer and reused, because
opening a libp2p stream costs several milliseconds (multistream negotiation) while a
round trip on an open one costs well under one. Many calls to one peer run concurrently on
as many streams (all over one connection).

Robustness rules this module keeps:

* limits are checked from the frame header before any payload is allocated
  (:mod:`net.rpc.frames`); an oversized or malformed frame gets an error reply and the stream is
  reset, and the server goes on serving everything else;
* the server reads a whole request before it runs the handler, and the client reads a
  whole response as soon as it arrives, so no writer ever waits on a stalled reader (Yamux
  resets a stream after 5 s without window updates);
* every call has a deadline; the deadline travels in the request so the server drops work
  the caller no longer waits for;
* per-peer rate limits (requests and bytes) and a per-peer cap on handlers in flight.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from libp2p.exceptions import BaseLibp2pError

from net._libp2p import PeerID
from net.logs import ThrottledLog
from net.ratelimit import Admission, PeerRateLimiter, RateLimits
from net.rpc.budget import BudgetLimits, SharedBudget
from net.rpc.calls import CallContext, Handler, Reply, ReplyLink, RequestHead, Screen
from net.rpc.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    Overloaded,
    PeerUnreachable,
    ProtocolViolation,
    RateLimited,
    RemoteError,
    RpcError,
    RpcTimeout,
    TooLarge,
    Unavailable,
    UnknownMethod,
    remote_error,
)
from net.rpc.frames import (
    KIND_REQUEST,
    KIND_RESPONSE,
    ErrorInfo,
    FrameError,
    FrameHeader,
    FrameReader,
    FrameTooLarge,
    Limits,
    MiB,
    Request,
    Response,
    StreamClosedEarly,
    StreamStalled,
    Tensor,
    build_request,
    build_response,
    encode_request,
    encode_response,
    write_frame,
)
from net.transport.admission import source_of
from net.transport.host import DialError, SwarmHost

log = logging.getLogger(__name__)

RPC_PROTOCOL: Final = "/moehome/rpc/1.0.0"


@dataclass(frozen=True)
class RpcConfig:
    limits: Limits = field(default_factory=Limits)
    rate_limits: RateLimits = field(default_factory=RateLimits)
    default_timeout: float = 30.0
    #: Server: handlers of one peer running at once; more get ``Overloaded``.
    max_inflight_per_peer: int = 64
    #: Server: request payloads held in memory at once, all peers together. Memory is
    #: taken as bytes arrive; a request that would pass its share gets ``Overloaded``.
    max_buffered_bytes: int = 1024 * MiB
    #: Server: the share of that one peer, and one source address (a crowd of
    #: identities from one address shares one share), may hold. None: a quarter.
    max_buffered_per_peer: int | None = None
    max_buffered_per_source: int | None = None
    #: Server: the longest a handler may run, whatever the caller asked.
    max_handler_seconds: float = 600.0
    #: Server: an inbound stream with no new request for this long is closed.
    server_idle_seconds: float = 300.0
    #: Server: once a request has begun, a gap this long without a byte resets the
    #: stream, and its payload must arrive at least this fast (plus one gap).
    stall_seconds: float = 20.0
    min_upload_bytes_per_second: float = 128 * 1024
    #: Server: a refused request's payload is read and dropped up to this size, so that
    #: the sender can finish writing and read the refusal (the stream stays usable).
    max_discard_bytes: int = 4 * MiB
    #: Server: of a larger refused payload, at most this much is read (and dropped)
    #: while the sender reads the refusal, before the stream is reset.
    max_refused_drain_bytes: int = 64 * MiB
    #: Client: streams to one peer at once (calls beyond wait for a free one).
    max_streams_per_peer: int = 64
    #: Client: idle streams kept per peer, and for how long.
    max_idle_streams_per_peer: int = 16
    client_idle_seconds: float = 60.0
    #: Server: the rig's emulated link, which holds every answer as a slow home line
    #: would (net/testing/link.py); None in real use.
    link: ReplyLink | None = None


@dataclass
class RpcStatistics:
    calls_sent: int = 0
    calls_failed: int = 0
    requests_served: int = 0
    streams_opened: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


@dataclass
class _PooledStream:
    stream: Any
    reader: FrameReader
    last_used: float
    uses: int = 0


class _PeerPool:
    def __init__(self, max_streams: int) -> None:
        self.idle: list[_PooledStream] = []
        self.slots = trio.Semaphore(max_streams)
        self.users = 0  # calls waiting for or holding a slot


# ---------------------------------------------------------------- service


class RpcService:
    """Serves registered methods and makes calls to other peers."""

    def __init__(self, host: SwarmHost, config: RpcConfig | None = None) -> None:
        self.host = host
        self.config = config or RpcConfig()
        self._handlers: dict[str, Handler] = {}
        self._screens: dict[str, Screen] = {}
        self._ids = itertools.count(1)
        self._pools: dict[PeerID, _PeerPool] = {}
        self._limiter: PeerRateLimiter[PeerID] = PeerRateLimiter(self.config.rate_limits)
        self._inflight: defaultdict[PeerID, int] = defaultdict(int)
        total = self.config.max_buffered_bytes
        self._budget: SharedBudget[PeerID] = SharedBudget(
            BudgetLimits(
                total,
                self.config.max_buffered_per_peer or total // 4,
                self.config.max_buffered_per_source or total // 4,
            )
        )
        self._log = ThrottledLog(log)
        self._next_sweep = 0.0
        self._serving: set[trio.CancelScope] = set()
        self.stats = RpcStatistics()

    # ---- registration

    def register(self, method: str, handler: Handler, *, screen: Screen | None = None) -> None:
        """Serve ``method``. ``screen`` sees each request's head before its payload is
        read, and may refuse it (junk that would otherwise be buffered whole)."""
        if not 0 < len(method) <= self.config.limits.max_method_chars:
            raise ValueError(f"method name {method!r} is empty or too long")
        if method in self._handlers:
            raise ValueError(f"method {method!r} is already registered")
        self._handlers[method] = handler
        if screen is not None:
            self._screens[method] = screen

    def unregister(self, method: str) -> None:
        """Stop answering ``method`` (calls get UnknownMethod); calls running go on."""
        self._handlers.pop(method, None)
        self._screens.pop(method, None)

    def attach(self) -> None:
        """Start accepting RPC streams on the host."""
        self.host.set_stream_handler(RPC_PROTOCOL, self._serve_stream)

    def close(self) -> None:
        """Stop serving: cancel every inbound stream loop (they belong to libp2p's
        connection nurseries, so we keep their cancel scopes to end them on shutdown)."""
        for scope in list(self._serving):
            scope.cancel()

    def statistics(self) -> RpcStatistics:
        return self.stats

    # ---- client side

    async def call(
        self,
        peer_id: PeerID,
        method: str,
        meta: Mapping[str, Any] | None = None,
        tensors: Sequence[Tensor] = (),
        *,
        timeout: float | None = None,
        dial_attempts: int = 3,
    ) -> Reply:
        """Call ``method`` on ``peer_id``; raises a :class:`RpcError` subclass on failure.

        ``dial_attempts``: tries to connect when there is no connection yet (callers with
        alternatives, like DHT lookups, use 1 and move on to another peer)."""
        timeout = self.config.default_timeout if timeout is None else timeout
        payload = sum(t.nbytes for t in tensors)
        if payload > self.config.limits.max_payload_bytes:
            raise TooLarge(
                f"{payload} bytes of tensors exceed the limit of "
                f"{self.config.limits.max_payload_bytes}; split the call"
            )
        deadline = trio.current_time() + timeout
        self.stats.calls_sent += 1
        try:
            with trio.fail_after(timeout):
                return await self._call(
                    peer_id, method, meta or {}, tuple(tensors), deadline, dial_attempts
                )
        except trio.TooSlowError:
            self.stats.calls_failed += 1
            raise RpcTimeout(f"{method} on {peer_id}: no response within {timeout:.3g} s") from None
        except RpcError:
            self.stats.calls_failed += 1
            raise

    async def _call(
        self,
        peer_id: PeerID,
        method: str,
        meta: Mapping[str, Any],
        tensors: tuple[Tensor, ...],
        deadline: float,
        dial_attempts: int,
    ) -> Reply:
        request_id = next(self._ids)
        if trio.current_time() >= self._next_sweep:
            await self._close_stale_streams()
        pool = self._pools.get(peer_id)
        if pool is None:
            pool = self._pools[peer_id] = _PeerPool(self.config.max_streams_per_peer)
        pool.users += 1
        try:
            return await self._call_pooled(
                peer_id, pool, method, meta, tensors, deadline, request_id, dial_attempts
            )
        finally:
            pool.users -= 1
            if not pool.users and not pool.idle:
                self._drop_pool(peer_id, pool)  # a pool per peer ever met would grow forever

    def _drop_pool(self, peer_id: PeerID, pool: _PeerPool) -> None:
        """Forget ``pool`` if it is still the peer's: a sweep that awaited a stream's
        closing, or a call that ended meanwhile, may have dropped it (or another may
        have taken its place) already. (A KeyError here stopped a bootstrap peer.)"""
        if self._pools.get(peer_id) is pool:
            del self._pools[peer_id]

    async def _call_pooled(
        self,
        peer_id: PeerID,
        pool: _PeerPool,
        method: str,
        meta: Mapping[str, Any],
        tensors: tuple[Tensor, ...],
        deadline: float,
        request_id: int,
        dial_attempts: int,
    ) -> Reply:
        async with pool.slots:
            # A reused stream may have died while idle (peer restarted). If writing the
            # request fails, the peer cannot have acted on it, so one retry is safe.
            for attempt in (1, 2):
                entry = await self._checkout(peer_id, pool, deadline, dial_attempts)
                reused = entry.uses > 0
                request = Request(
                    method,
                    request_id,
                    meta,
                    tensors,
                    timeout=max(0.001, deadline - trio.current_time()),
                )
                ok = False
                try:
                    try:
                        response, complete = await self._exchange(entry, request, peer_id)
                    except _WriteFailed as exc:
                        if reused and attempt == 1:
                            continue
                        raise PeerUnreachable(f"{method} on {peer_id}: {exc.__cause__}") from exc
                    ok = complete and not response.meta.get("fatal")
                finally:
                    if ok:
                        await self._checkin(pool, entry)
                    else:
                        await _reset_quietly(entry.stream)
                if response.error is not None:
                    raise remote_error(response.error)
                return Reply(response.meta, response.tensors)
        raise AssertionError("unreachable")

    async def _exchange(
        self, entry: _PooledStream, request: Request, peer_id: PeerID
    ) -> tuple[Response, bool]:
        """Write the request and read the response: (response, whether the request was
        written whole). A large request is written while the response is awaited, so a
        server that refuses it from its header (memory, rate) is heard at once and the
        rest is never sent. Raises _WriteFailed when the request could not be written."""
        pieces = encode_request(request)
        if sum(t.nbytes for t in request.tensors) <= _COALESCE_LIMIT:
            try:
                await write_frame(entry.stream, pieces)
            except (BaseLibp2pError, OSError) as exc:
                raise _WriteFailed from exc
            return await self._read_response(entry, request.request_id, peer_id), True
        written = False
        failure: BaseException | None = None
        response: Response | None = None
        read_error: RpcError | None = None

        async def write(done: trio.CancelScope) -> None:
            nonlocal written, failure
            try:
                await write_frame(entry.stream, pieces)
                written = True
            except (BaseLibp2pError, OSError) as exc:
                failure = exc
                done.cancel()  # nothing more will come: stop waiting for a response

        # Errors stay inside: a nursery would wrap them in an ExceptionGroup, which no
        # caller's `except RpcError` catches.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, nursery.cancel_scope)
            try:
                response = await self._read_response(entry, request.request_id, peer_id)
            except RpcError as exc:
                read_error = exc
            nursery.cancel_scope.cancel()  # an early answer: the rest is not wanted
        if response is not None:
            return response, written
        if failure is not None and not written:
            raise _WriteFailed from failure
        if read_error is not None:
            raise read_error
        raise _WriteFailed("the request was not written")

    async def _close_stale_streams(self) -> None:
        """Close idle streams past their time, and forget peers left with none. Runs from
        calls now and then, so an RpcService needs no background task of its own."""
        now = trio.current_time()
        self._next_sweep = now + self.config.client_idle_seconds
        for peer_id, pool in list(self._pools.items()):
            fresh = [e for e in pool.idle if now - e.last_used < self.config.client_idle_seconds]
            stale = [e for e in pool.idle if e not in fresh]
            pool.idle = fresh
            if not pool.users and not pool.idle:
                self._drop_pool(peer_id, pool)
            for entry in stale:
                await _close_quietly(entry.stream)

    async def _read_response(
        self, entry: _PooledStream, request_id: int, peer_id: PeerID
    ) -> Response:
        try:
            frame = await entry.reader.read_frame()
        except FrameError as exc:
            raise ProtocolViolation(f"bad response from {peer_id}: {exc}") from exc
        except (BaseLibp2pError, OSError) as exc:
            raise PeerUnreachable(f"connection to {peer_id} broke: {exc}") from exc
        if frame is None:
            raise PeerUnreachable(f"{peer_id} closed the stream without answering")
        header, tensors = frame
        if header.kind != KIND_RESPONSE:
            raise ProtocolViolation(f"{peer_id} sent a request where a response was due")
        response = build_response(header, tensors)
        if response.request_id != request_id and not (
            response.request_id == 0 and response.error is not None  # request unreadable
        ):
            raise ProtocolViolation(
                f"{peer_id} answered request {response.request_id}, expected {request_id}"
            )
        return response

    async def _checkout(
        self, peer_id: PeerID, pool: _PeerPool, deadline: float, dial_attempts: int
    ) -> _PooledStream:
        now = trio.current_time()
        while pool.idle:
            entry = pool.idle.pop()
            # Idle streams on a connection that ended are all dead: reusing them one by
            # one spent a call's only retry on the second (a relayed connection closed
            # after hole punching failed 12 of 20 calls in benchmarks/nat.py).
            fresh = now - entry.last_used < self.config.client_idle_seconds
            if fresh and self.host.worth_reusing(entry.stream):
                return entry
            await _close_quietly(entry.stream)
        try:
            stream = await self.host.new_stream(
                peer_id, RPC_PROTOCOL, timeout=max(0.001, deadline - now), attempts=dial_attempts
            )
        except DialError as exc:
            raise PeerUnreachable(str(exc)) from exc
        self.stats.streams_opened += 1
        return _PooledStream(stream, FrameReader(stream, self.config.limits), now)

    async def _checkin(self, pool: _PeerPool, entry: _PooledStream) -> None:
        entry.uses += 1
        entry.last_used = trio.current_time()
        if len(pool.idle) < self.config.max_idle_streams_per_peer:
            pool.idle.append(entry)
        else:
            await _close_quietly(entry.stream)

    def forget_peer(self, peer_id: PeerID) -> None:
        """Drop pooled streams of a peer (e.g. after it left)."""
        self._pools.pop(peer_id, None)

    # ---- server side

    def buffered_bytes(self) -> int:
        """Request payload bytes held right now, all peers together."""
        return self._budget.used

    async def _serve_stream(self, stream: Any) -> None:
        peer_id: PeerID = stream.muxed_conn.peer_id
        source = source_of(_remote_host(stream))
        reader = FrameReader(stream, self.config.limits)
        with trio.CancelScope() as scope:
            self._serving.add(scope)
            try:
                await self._serve_requests(stream, reader, peer_id, source)
            except (BaseLibp2pError, OSError) as exc:
                log.debug("rpc stream from %s ended: %s", peer_id, exc)
                await _reset_quietly(stream)
            except Exception as exc:  # noqa: BLE001 - last resort: one stream, never the node
                self.stats.rejected["internal"] += 1
                self._log.log(
                    logging.ERROR,
                    f"internal:{type(exc).__name__}",
                    "rpc stream from %s failed: %r",
                    peer_id,
                    exc,
                    exc_info=True,
                )
                await _reset_quietly(stream)
            finally:
                self._serving.discard(scope)
        if scope.cancelled_caught:
            await _reset_quietly(stream)

    async def _serve_requests(
        self, stream: Any, reader: FrameReader, peer_id: PeerID, source: str
    ) -> None:
        config = self.config
        while True:
            try:
                with trio.move_on_after(config.server_idle_seconds) as idle:
                    header = await reader.read_header(stall_seconds=config.stall_seconds)
                if idle.cancelled_caught:
                    await _close_quietly(stream)
                    return
                if header is None:
                    await _close_quietly(stream)
                    return
                if header.kind != KIND_REQUEST:
                    raise FrameError("expected a request", header.request_id)
                refusal = self._admit(peer_id, source, header)
                if refusal is not None:
                    if not await self._refuse_request(stream, reader, header, refusal):
                        return
                    continue
                tensors = await self._read_payload(stream, reader, header, peer_id, source)
                if tensors is None:
                    return
            except StreamClosedEarly:
                self.stats.rejected["truncated"] += 1
                await _reset_quietly(stream)
                return
            except StreamStalled:
                self.stats.rejected["stalled"] += 1
                self.host.penalize(source)
                await _reset_quietly(stream)
                return
            except FrameError as exc:
                self.host.penalize(source)
                await self._refuse_frame(stream, peer_id, exc)
                return
            try:
                response = await self._dispatch(peer_id, source, build_request(header, tensors))
            finally:
                self._release(peer_id, source, sum(t.nbytes for t in tensors))
            await write_frame(stream, encode_response(response))

    async def _read_payload(
        self, stream: Any, reader: FrameReader, header: FrameHeader, peer_id: PeerID, source: str
    ) -> tuple[Tensor, ...] | None:
        """The request's payload, its memory reserved as it arrives; None (the stream
        reset, nothing held) when it would pass the peer's or the source's share, or
        arrives too slowly."""
        reserved = 0

        def reserve(nbytes: int) -> None:
            nonlocal reserved
            if not self._budget.try_reserve(peer_id, source, nbytes):
                raise _OverBudget
            reserved += nbytes

        config = self.config
        seconds = config.stall_seconds + header.payload_bytes / config.min_upload_bytes_per_second
        try:
            with trio.fail_after(seconds):
                return await reader.read_payload(
                    header, reserve, stall_seconds=config.stall_seconds
                )
        except _OverBudget:
            self.stats.rejected["memory"] += 1
            refusal: RemoteError = Overloaded("too much data in flight; retry later")
        except trio.TooSlowError:
            self.stats.rejected["stalled"] += 1
            self.host.penalize(source)
            refusal = DeadlineExceeded(f"payload slower than {seconds:.0f} s")
        except BaseException:
            self._release(peer_id, source, reserved)
            raise
        # refused mid-payload: nothing is kept, and the stream cannot be resynchronised
        self._release(peer_id, source, reserved)
        await self._send_error_quietly(stream, header.request_id, refusal.code, refusal.message)
        await _reset_quietly(stream)
        return None

    async def _refuse_request(
        self, stream: Any, reader: FrameReader, header: FrameHeader, refusal: RemoteError
    ) -> bool:
        """Answer a request refused from its header. A small payload is read and dropped
        (the stream stays usable, and the caller reads the refusal); a large one is not
        kept in step: the stream is reset once the caller had the answer. True when the
        stream goes on."""
        if header.payload_bytes > self.config.max_discard_bytes:
            # Answer, then drop what comes until the caller (which reads while it writes)
            # has read the answer and resets the stream. Resetting first would lose the
            # answer: Yamux drops a stream's unread data when a reset arrives.
            await self._send_error_quietly(stream, header.request_id, refusal.code, refusal.message)
            await _drain_quietly(
                stream, self.config.max_refused_drain_bytes, seconds=self.config.stall_seconds
            )
            await _reset_quietly(stream)
            return False
        with trio.fail_after(
            self.config.stall_seconds
            + header.payload_bytes / self.config.min_upload_bytes_per_second
        ):
            await reader.discard_payload(header, stall_seconds=self.config.stall_seconds)
        await write_frame(stream, encode_response(_error(header.request_id, refusal)))
        return True

    async def _refuse_frame(self, stream: Any, peer_id: PeerID, exc: FrameError) -> None:
        """No resynchronising inside a broken or oversized frame: answer, let the sender
        finish writing (bounded) so that it can read the answer, then reset the stream."""
        self.stats.rejected[exc.code] += 1
        self._log.log(
            logging.INFO, f"frame:{exc.code}", "rejecting a frame from %s: %s", peer_id, exc
        )
        code = TooLarge.code if isinstance(exc, FrameTooLarge) else BadRequest.code
        await self._send_error_quietly(stream, exc.request_id or 0, code, str(exc))
        # Size unknown (broken header): drain until the sender, having read the answer,
        # resets the stream, within the same bounds. Drained bytes are dropped as read.
        declared = exc.declared_bytes if isinstance(exc, FrameTooLarge) else 0
        drain = min(declared or self.config.max_discard_bytes, self.config.max_discard_bytes)
        await _drain_quietly(stream, drain, seconds=self.config.stall_seconds)
        await _reset_quietly(stream)

    def _admit(self, peer_id: PeerID, source: str, header: FrameHeader) -> RemoteError | None:
        """Decide from the header alone whether to take a request. When it is taken, its
        handler slot is reserved (see _release); its memory is reserved as it arrives."""
        nbytes = header.payload_bytes
        admission = self._limiter.admit(peer_id, nbytes, trio.current_time())
        if admission is not Admission.ADMIT:
            self.stats.rejected[admission.value] += 1
            self.host.penalize(source)
            return RateLimited(f"{admission.value}; slow down")
        if header.method not in self._handlers:
            self.stats.rejected["unknown_method"] += 1
            return UnknownMethod(f"no method {header.method!r}")
        if self._inflight[peer_id] >= self.config.max_inflight_per_peer:
            self.stats.rejected["overloaded"] += 1
            return Overloaded(f"more than {self.config.max_inflight_per_peer} calls in flight")
        if not self._budget.could_ever_fit(nbytes):
            self.stats.rejected["too_large"] += 1
            return TooLarge(f"{nbytes} bytes exceed what one peer may send at once")
        if self._budget.used + nbytes > self._budget.limits.total:
            # it may fit later: no memory is held for it now in any case
            self.stats.rejected["memory"] += 1
            return Overloaded("too much data in flight; retry later")
        screen = self._screens.get(header.method)
        if screen is not None:
            meta = header.fields.get("meta", {})
            specs = tuple((dtype, shape) for dtype, shape, _ in header.specs)
            head = RequestHead(peer_id, source, header.method, meta, nbytes, specs)
            try:
                refusal = screen(head)
            except Exception:  # noqa: BLE001 - a screen's bug refuses one request, no more
                self._log.log(
                    logging.ERROR, f"screen:{header.method}", "screen failed", exc_info=True
                )
                refusal = InternalError(f"{header.method} failed")
            if refusal is not None:
                self.stats.rejected[f"screened:{refusal.code}"] += 1
                if isinstance(refusal, RateLimited):
                    self.host.penalize(source)
                return refusal
        self._inflight[peer_id] += 1
        return None

    def _release(self, peer_id: PeerID, source: str, reserved: int) -> None:
        self._budget.release(peer_id, source, reserved)
        self._inflight[peer_id] -= 1
        if not self._inflight[peer_id]:
            del self._inflight[peer_id]

    async def _dispatch(self, peer_id: PeerID, source: str, request: Request) -> Response:
        handler = self._handlers[request.method]
        budget = min(
            request.timeout or self.config.max_handler_seconds, self.config.max_handler_seconds
        )
        try:
            with trio.move_on_after(budget) as scope:
                reply = await handler(CallContext(peer_id, request, source))
                if self.config.link is not None:
                    await self.config.link.carry(sum(t.nbytes for t in reply.tensors))
            if scope.cancelled_caught:
                return _error(
                    request.request_id,
                    DeadlineExceeded(f"{request.method} took over {budget:.3g} s"),
                )
            self.stats.requests_served += 1
            return Response(request.request_id, reply.meta, reply.tensors)
        except RemoteError as exc:
            if isinstance(exc, RateLimited):  # a limit of the handler's own was passed
                self.host.penalize(source)
            return _error(request.request_id, exc)
        except Exception:  # noqa: BLE001 - a handler's bug is an error reply, never a crash
            self._log.log(
                logging.ERROR,
                f"handler:{request.method}",
                "handler for %s failed on a request from %s",
                request.method,
                peer_id,
                exc_info=True,
            )
            return _error(request.request_id, InternalError(f"{request.method} failed"))

    async def _send_error_quietly(
        self, stream: Any, request_id: int, code: str, message: str
    ) -> None:
        # "fatal" tells the caller this stream is finished (it cannot be reused)
        response = Response(request_id, meta={"fatal": True}, error=ErrorInfo(code, message[:500]))
        with trio.move_on_after(2):
            with contextlib.suppress(BaseLibp2pError, OSError):
                await write_frame(stream, encode_response(response))


#: Requests with more payload than this are written while their response is awaited.
_COALESCE_LIMIT: Final = 64 * 1024


class _WriteFailed(Exception):
    """A request could not be written (the stream or connection broke)."""


class _OverBudget(Exception):
    """A request's payload would pass its holder's share of the memory budget."""


def _remote_host(stream: Any) -> str | None:
    try:
        remote = stream.get_remote_address()
    except (BaseLibp2pError, OSError, AttributeError):
        return None
    return str(remote[0]) if remote else None


def _error(request_id: int, error: RemoteError) -> Response:
    return Response(request_id, error=ErrorInfo(error.code, error.message[:2000]))


async def _drain_quietly(stream: Any, max_bytes: int, *, seconds: float) -> None:
    """Read and drop up to ``max_bytes`` (without keeping them) for at most ``seconds``."""
    left = max_bytes
    with trio.move_on_after(seconds):
        try:
            while left > 0:
                chunk = await stream.read(min(left, 1 * MiB))
                if not chunk:
                    return
                left -= len(chunk)
        except (BaseLibp2pError, OSError, EOFError):
            return


async def _reset_quietly(stream: Any) -> None:
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(BaseLibp2pError, OSError),
    ):
        await stream.reset()


async def _close_quietly(stream: Any) -> None:
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        contextlib.suppress(BaseLibp2pError, OSError),
    ):
        await stream.close()


__all__ = [
    "RPC_PROTOCOL",
    "BadRequest",
    "CallContext",
    "DeadlineExceeded",
    "Handler",
    "InternalError",
    "Overloaded",
    "PeerUnreachable",
    "ProtocolViolation",
    "RateLimited",
    "RemoteError",
    "Reply",
    "RequestHead",
    "RpcConfig",
    "RpcError",
    "RpcService",
    "RpcTimeout",
    "Screen",
    "TooLarge",
    "Unavailable",
    "UnknownMethod",
]
