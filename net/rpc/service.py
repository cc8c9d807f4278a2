"""Request/response RPC with tensor payloads over raw libp2p streams: the service a peer
runs, its configuration and its counts. The service is two halves that share the host,
the configuration and the counts: the calling side (:mod:`net.rpc.client`: pooled
streams, deadlines, responses read and checked) and the serving side
(:mod:`net.rpc.server`: handlers and screens, admission by rate, in-flight caps and memory
budget, dispatch, refusals). Each keeps its own robustness rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from net._libp2p import PeerID
from net.ratelimit import RateLimits
from net.rpc.calls import Handler, Reply, ReplyLink, Screen
from net.rpc.client import RpcClient
from net.rpc.frames import Limits, MiB, Tensor
from net.rpc.server import RpcServer
from net.transport.host import SwarmHost


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


# ---------------------------------------------------------------- service


class RpcService:
    """Serves registered methods and makes calls to other peers."""

    def __init__(self, host: SwarmHost, config: RpcConfig | None = None) -> None:
        self.host = host
        self.config = config or RpcConfig()
        self.stats = RpcStatistics()
        self._client = RpcClient(self.host, self.config, self.stats)
        self._server = RpcServer(self.host, self.config, self.stats)

    # ---- registration

    def register(self, method: str, handler: Handler, *, screen: Screen | None = None) -> None:
        """Serve ``method``. ``screen`` sees each request's head before its payload is
        read, and may refuse it (junk that would otherwise be buffered whole)."""
        self._server.register(method, handler, screen=screen)

    def unregister(self, method: str) -> None:
        """Stop answering ``method`` (calls get UnknownMethod); calls running go on."""
        self._server.unregister(method)

    def attach(self) -> None:
        """Start accepting RPC streams on the host."""
        self._server.attach()

    def close(self) -> None:
        """Stop serving: cancel every inbound stream loop."""
        self._server.close()

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
        """Call ``method`` on ``peer_id`` (:meth:`net.rpc.client.RpcClient.call`)."""
        return await self._client.call(
            peer_id, method, meta, tensors, timeout=timeout, dial_attempts=dial_attempts
        )

    def forget_peer(self, peer_id: PeerID) -> None:
        """Drop pooled streams of a peer (e.g. after it left)."""
        self._client.forget_peer(peer_id)

    # ---- server side

    def buffered_bytes(self) -> int:
        """Request payload bytes held right now, all peers together."""
        return self._server.buffered_bytes()

    @property
    def _handlers(self) -> dict[str, Handler]:
        """The registered handlers by method (the server's own dict: tests replace one)."""
        return self._server._handlers


__all__ = [
    "RpcConfig",
    "RpcService",
    "RpcStatistics",
]
