"""The serving side of the RPC: registered handlers and their screens, requests admitted
by rate, handlers in flight and a shared memory budget, dispatch under a deadline, and
typed refusals.

Robustness rules this module keeps:

* limits are checked from the frame header before any payload is allocated
  (:mod:`net.rpc.frames`); an oversized or malformed frame gets an error reply and the stream is
  reset, and the server goes on serving everything else;
* the server reads a whole request before it runs the handler, so no writer ever waits on
  a stalled reader (Yamux resets a stream after 5 s without window updates);
* the deadline that travels in each request bounds its handler, so the server drops work
  the caller no longer waits for;
* per-peer rate limits (requests and bytes) and a per-peer cap on handlers in flight.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import trio
from libp2p.exceptions import BaseLibp2pError

from net._libp2p import PeerID
from net.logs import ThrottledLog
from net.ratelimit import Admission, PeerRateLimiter
from net.rpc.budget import BudgetLimits, SharedBudget
from net.rpc.calls import CallContext, Handler, RequestHead, Screen
from net.rpc.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    Overloaded,
    RateLimited,
    RemoteError,
    TooLarge,
    UnknownMethod,
)
from net.rpc.frames import (
    KIND_REQUEST,
    ErrorInfo,
    FrameError,
    FrameHeader,
    FrameReader,
    FrameTooLarge,
    Request,
    Response,
    StreamClosedEarly,
    StreamStalled,
    Tensor,
    build_request,
    encode_response,
    write_frame,
)
from net.rpc.streams import RPC_PROTOCOL, close_quietly, drain_quietly, remote_host, reset_quietly
from net.transport.admission import source_of
from net.transport.host import SwarmHost

if TYPE_CHECKING:
    from net.rpc.service import RpcConfig, RpcStatistics

log = logging.getLogger(__name__)


class RpcServer:
    """Serves registered methods to other peers (the serving half of
    :class:`net.rpc.service.RpcService`)."""

    def __init__(self, host: SwarmHost, config: RpcConfig, stats: RpcStatistics) -> None:
        self.host = host
        self.config = config
        self.stats = stats
        self._handlers: dict[str, Handler] = {}
        self._screens: dict[str, Screen] = {}
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
        self._serving: set[trio.CancelScope] = set()

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

    def buffered_bytes(self) -> int:
        """Request payload bytes held right now, all peers together."""
        return self._budget.used

    async def _serve_stream(self, stream: Any) -> None:
        peer_id: PeerID = stream.muxed_conn.peer_id
        source = source_of(remote_host(stream))
        reader = FrameReader(stream, self.config.limits)
        with trio.CancelScope() as scope:
            self._serving.add(scope)
            try:
                await self._serve_requests(stream, reader, peer_id, source)
            except (BaseLibp2pError, OSError) as exc:
                log.debug("rpc stream from %s ended: %s", peer_id, exc)
                await reset_quietly(stream)
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
                await reset_quietly(stream)
            finally:
                self._serving.discard(scope)
        if scope.cancelled_caught:
            await reset_quietly(stream)

    async def _serve_requests(
        self, stream: Any, reader: FrameReader, peer_id: PeerID, source: str
    ) -> None:
        config = self.config
        while True:
            try:
                with trio.move_on_after(config.server_idle_seconds) as idle:
                    header = await reader.read_header(stall_seconds=config.stall_seconds)
                if idle.cancelled_caught:
                    await close_quietly(stream)
                    return
                if header is None:
                    await close_quietly(stream)
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
                await reset_quietly(stream)
                return
            except StreamStalled:
                self.stats.rejected["stalled"] += 1
                self.host.penalize(source)
                await reset_quietly(stream)
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
        await reset_quietly(stream)
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
            await drain_quietly(
                stream, self.config.max_refused_drain_bytes, seconds=self.config.stall_seconds
            )
            await reset_quietly(stream)
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
        await drain_quietly(stream, drain, seconds=self.config.stall_seconds)
        await reset_quietly(stream)

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


class _OverBudget(Exception):
    """A request's payload would pass its holder's share of the memory budget."""


def _error(request_id: int, error: RemoteError) -> Response:
    return Response(request_id, error=ErrorInfo(error.code, error.message[:2000]))
