"""The one place where py-libp2p is imported and configured.

py-libp2p 0.8.1 has measured bugs (see ../shared/notes/py-libp2p-0.8.1.md). Each workaround
lives here or next to the code that needs it, so no caller meets them:

* at import, libp2p sets its logger to ``propagate=False`` with no handlers, so its errors
  bypass the program's logging: re-enabled below;
* every dial waits a fixed 250 ms "happy eyeballs" delay unless ``max_connections_per_peer``
  is 1: :func:`connection_config` sets it;
* ``read_exactly`` gives up after 100 partial reads (fails above ~4-8 MiB) and Yamux resets a
  stream whose reader stalls for 5 s: net/ never uses libp2p's msgio helpers, and reads every
  frame eagerly with its own loop (see :mod:`net.rpc.frames`);
* a Yamux frame written while its task is cancelled (a call's deadline) may leave half a
  Noise message on the socket, which kills the connection and every stream on it: frames
  are written whole below (:func:`_write_frames_whole`);
* inbound connections leak their admission slot and libp2p's resource manager counts
  leak with them: :mod:`net.transport.inbound` replaces both.
"""

from __future__ import annotations

import logging
import os

# Yamux in py-libp2p 0.8.1 sends a WINDOW_UPDATE frame after *every* read by default
# ("release on read"); go-yamux batches credit until half the window is consumed. The
# per-read frames doubled the cost of a small RPC (measured: 2.7 -> 1.9 ms per call under
# a profiler). Read at call time by libp2p, so setting it before any stream exists is enough.
os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")

import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import Ed25519PrivateKey as _LibP2PPrivateKey
from libp2p.crypto.ed25519 import Ed25519PublicKey as LibP2PPublicKey
from libp2p.crypto.keys import KeyPair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID as PeerID  # noqa: N811 - libp2p's name for the type
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.stream_muxer.exceptions import MuxedConnUnavailable
from libp2p.stream_muxer.yamux.yamux import Yamux


def _reconnect_libp2p_logging() -> None:
    """Route libp2p's records through the program's logging (it disables propagation at
    import) and undo the INFO levels some of its modules set on themselves."""
    root = logging.getLogger("libp2p")
    root.propagate = True
    if not os.environ.get("LIBP2P_DEBUG"):
        # WARNING keeps real problems visible without libp2p's chatter; LIBP2P_DEBUG or
        # `moehome -vv` lowers it (a level the program set before this import stays)
        if root.level == logging.NOTSET:
            root.setLevel(logging.WARNING)
        for name, logger in logging.Logger.manager.loggerDict.items():
            if name.startswith("libp2p.") and isinstance(logger, logging.Logger):
                logger.setLevel(logging.NOTSET)


_reconnect_libp2p_logging()

#: The longest one Yamux frame (at most 256 KiB) may take to leave: a peer that stops
#: reading its socket for this long loses the connection.
FRAME_WRITE_SECONDS = 30.0
#: The longest closing a connection may take (a goodbye frame, within 1 s, then the
#: socket); past it the socket is closed without the goodbye.
CLOSE_SECONDS = 3.0


def _write_frames_whole() -> None:
    """Make every Yamux frame go out whole, whatever cancels the task writing it.

    ``trio.SocketStream.send_all`` cancelled midway leaves part of the data sent; with
    Noise on top, the peer then fails to decrypt everything after it (measured: a call
    cancelled while writing a 2 MiB request broke the connection; the next call to that
    peer failed with "connection reset"). A frame is now written shielded, within
    FRAME_WRITE_SECONDS; past that the connection is closed, since half a frame may be on
    the wire. Closing the connection cancels the writes in flight (a peer that stopped
    reading must not hold a shutdown for FRAME_WRITE_SECONDS), and a close, once begun,
    finishes whatever cancels the task closing (within CLOSE_SECONDS)."""
    original_write = Yamux._write_frame
    original_close = Yamux.close
    if getattr(original_write, "_moehome_whole", False):
        return

    async def write_frame_whole(self: Yamux, data: bytes) -> None:
        writes: set[trio.CancelScope] = self.__dict__.setdefault("_moehome_writes", set())
        closing = self.__dict__.get("_moehome_closing", False)
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + (1.0 if closing else FRAME_WRITE_SECONDS)
            writes.add(scope)
            try:
                await original_write(self, data)
            finally:
                writes.discard(scope)
        if scope.cancelled_caught:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await self.secured_conn.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken connection
                    logging.getLogger(__name__).debug("closing a stuck connection: %s", exc)
            raise MuxedConnUnavailable("a frame could not be sent whole; connection closed")

    async def close_promptly(self: Yamux, error_code: int = 0) -> None:
        self.__dict__["_moehome_closing"] = True
        for scope in list(self.__dict__.get("_moehome_writes", ())):
            scope.cancel()
        # Finished whatever cancels the closer: SwarmConn.close() marks the connection
        # closed before it closes the muxer, and never tries again, so a close cancelled
        # half way (the swarm's own, when the host stops) left the socket open for good.
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + CLOSE_SECONDS
            await original_close(self, error_code)
        if scope.cancelled_caught:  # its lock held by a task that is stuck: the socket
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await self.secured_conn.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken connection
                    logging.getLogger(__name__).debug("closing a stuck connection: %s", exc)
            self.event_closed.set()

    write_frame_whole._moehome_whole = True  # type: ignore[attr-defined]
    Yamux._write_frame = write_frame_whole  # type: ignore[method-assign]
    Yamux.close = close_promptly  # type: ignore[method-assign]


_write_frames_whole()

__all__ = [
    "ConnectionConfig",
    "KeyPair",
    "LibP2PPublicKey",
    "PeerID",
    "PeerInfo",
    "RetryConfig",
    "TProtocol",
    "connection_config",
    "info_from_p2p_addr",
    "key_pair_from_seed",
    "new_host",
]


def connection_config(dial_timeout: float = 10.0, max_connections: int = 300) -> ConnectionConfig:
    """Connection settings without the fixed 250 ms dial delay.

    ``Swarm.dial_peer`` only ends its happy-eyeballs wait early on failure or once
    ``max_connections_per_peer`` connections exist; with one connection per peer a dial
    on loopback takes ~10 ms instead of >= 250 ms.
    """
    # two: a relayed connection and the direct one that hole punching makes (libp2p
    # trims the extra one otherwise); streams go to the direct one ("best" strategy)
    # ``max_connections``: libp2p refuses every connection past it, inbound and our own
    # dials alike (300 by default: 5 addresses x 62 idle connections shut a node off).
    # Our admission (net/transport/admission.py) bounds inbound connections below it, fairly.
    return ConnectionConfig(
        max_connections_per_peer=2,
        dial_timeout=dial_timeout,
        max_connections=max_connections,
        high_watermark=max_connections,
    )


def key_pair_from_seed(seed: bytes) -> KeyPair:
    """libp2p's Ed25519 key pair for a 32-byte private seed."""
    private = _LibP2PPrivateKey.from_bytes(seed)
    return KeyPair(private, private.get_public_key())
