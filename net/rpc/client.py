"""The calling side of the RPC: calls with deadlines over streams pooled per peer, and
their responses read and checked.

One call occupies one stream at a time; streams are pooled per peer and reused, because
opening a libp2p stream costs several milliseconds (multistream negotiation) while a
round trip on an open one costs well under one. Many calls to one peer run concurrently on
as many streams (all over one connection).

Robustness rules this module keeps:

* the client reads a whole response as soon as it arrives, so no writer ever waits on a
  stalled reader (Yamux resets a stream after 5 s without window updates);
* every call has a deadline; the deadline travels in the request so the server drops work
  the caller no longer waits for.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio
from libp2p.exceptions import BaseLibp2pError

from net._libp2p import PeerID
from net.rpc.calls import Reply
from net.rpc.errors import (
    PeerUnreachable,
    ProtocolViolation,
    RpcError,
    RpcTimeout,
    TooLarge,
    remote_error,
)
from net.rpc.frames import (
    KIND_RESPONSE,
    FrameError,
    FrameReader,
    Request,
    Response,
    Tensor,
    build_response,
    encode_request,
    write_frame,
)
from net.rpc.streams import RPC_PROTOCOL, close_quietly, reset_quietly
from net.transport.host import DialError, SwarmHost

if TYPE_CHECKING:
    from net.rpc.service import RpcConfig, RpcStatistics


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


class RpcClient:
    """Makes calls to other peers, over streams pooled per peer (the calling half of
    :class:`net.rpc.service.RpcService`)."""

    def __init__(self, host: SwarmHost, config: RpcConfig, stats: RpcStatistics) -> None:
        self.host = host
        self.config = config
        self.stats = stats
        self._ids = itertools.count(1)
        self._pools: dict[PeerID, _PeerPool] = {}
        self._next_sweep = 0.0

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
                        await reset_quietly(entry.stream)
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
                await close_quietly(entry.stream)

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
            await close_quietly(entry.stream)
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
            await close_quietly(entry.stream)

    def forget_peer(self, peer_id: PeerID) -> None:
        """Drop pooled streams of a peer (e.g. after it left)."""
        self._pools.pop(peer_id, None)


#: Requests with more payload than this are written while their response is awaited.
_COALESCE_LIMIT: Final = 64 * 1024


class _WriteFailed(Exception):
    """A request could not be written (the stream or connection broke)."""
