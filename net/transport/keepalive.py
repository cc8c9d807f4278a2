"""Dead connections are noticed in seconds, not in a quarter of an hour.

When a home router restarts or the provider hands out a new address, every TCP
connection through it dies without a word: no FIN, no RST. Linux keeps sending into
such a connection for ~15 minutes (tcp_retries2) before giving up, and libp2p keeps
opening streams on it meanwhile, each waiting for its full timeout (measured in the lab:
RPCs to a peer behind a renumbered NAT timed out for minutes). With TCP keepalive
probes on idle connections and ``TCP_USER_TIMEOUT`` on busy ones, the kernel aborts a
dead connection within ~``Keepalive.dead_after_s`` (30 s); libp2p then drops it, and the
next call dials afresh.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any

from libp2p.abc import INotifee

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Keepalive:
    """When the kernel gives up on a connection: after ``idle_s`` without traffic it
    probes every ``interval_s``, and after ``probes`` unanswered ones the connection is
    dead; one whose sent data stays unacknowledged ``dead_after_s`` is dead too."""

    idle_s: int = 15
    interval_s: int = 5
    probes: int = 3
    dead_after_s: int = 30

    @staticmethod
    def within(seconds: int) -> Keepalive:
        """Dead connections noticed within ``seconds``, idle or busy (the default's
        proportions: half of it idle, then three probes)."""
        seconds = max(6, seconds)
        return Keepalive(seconds // 2, seconds // 6, 3, seconds)


#: Attributes leading from a libp2p connection to its socket, outermost first:
#: SwarmConn.muxed_conn (Yamux) .secured_conn (SecureSession) .conn (Noise read-writer)
#: .conn (RawConnection) .stream (TrioTCPStream) .stream (trio SocketStream) .socket.
_PATH = ("muxed_conn", "secured_conn", "conn", "conn", "stream", "stream", "socket")


def socket_of(conn: Any) -> Any | None:
    """The TCP socket under a libp2p connection, or None (another transport, or a
    layout this libp2p version does not have)."""
    obj = conn
    for attr in _PATH:
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj if hasattr(obj, "setsockopt") else None


def enable(sock: Any, times: Keepalive = Keepalive()) -> bool:
    """Turn keepalive and the user timeout on for ``sock``; False where the platform
    lacks an option (each option is best effort, as on macOS or Windows)."""
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), times.idle_s),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), times.interval_s),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), times.probes),
        (
            socket.IPPROTO_TCP,
            getattr(socket, "TCP_USER_TIMEOUT", None),
            times.dead_after_s * 1000,
        ),
    ]
    complete = True
    for level, option, value in options:
        if option is None:
            complete = False
            continue
        try:
            sock.setsockopt(level, option, value)
        except OSError as exc:
            log.debug("socket option %s not set: %s", option, exc)
            complete = False
    return complete


class KeepaliveNotifee(INotifee):
    """A libp2p network notifee that enables keepalive on every new connection."""

    def __init__(self, times: Keepalive = Keepalive()) -> None:
        self.times = times

    async def connected(self, network: Any, conn: Any) -> None:
        sock = socket_of(conn)
        if sock is not None:
            with contextlib.suppress(OSError):
                enable(sock, self.times)

    async def disconnected(self, network: Any, conn: Any) -> None:
        pass

    async def opened_stream(self, network: Any, stream: Any) -> None:
        pass

    async def closed_stream(self, network: Any, stream: Any) -> None:
        pass

    async def listen(self, network: Any, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        pass
