"""The one place where py-libp2p is imported and configured.

py-libp2p 0.8.1 has measured bugs (see ../shared/notes/py-libp2p-0.8.1.md). Each workaround
lives here or next to the code that needs it, so no caller meets them:

* at import, libp2p sets its logger to ``propagate=False`` with no handlers, so its errors
  bypass the program's logging: re-enabled below;
* every dial waits a fixed 250 ms "happy eyeballs" delay unless ``max_connections_per_peer``
  is 1: :func:`connection_config` sets it;
* ``read_exactly`` gives up after 100 partial reads (fails above ~4-8 MiB) and Yamux resets a
  stream whose reader stalls for 5 s: net/ never uses libp2p's msgio helpers, and reads every
  frame eagerly with its own loop (see :mod:`net.wire`).
"""

from __future__ import annotations

import logging
import os

# Yamux in py-libp2p 0.8.1 sends a WINDOW_UPDATE frame after *every* read by default
# ("release on read"); go-yamux batches credit until half the window is consumed. The
# per-read frames doubled the cost of a small RPC (measured: 2.7 -> 1.9 ms per call under
# a profiler). Read at call time by libp2p, so setting it before any stream exists is enough.
os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")

from libp2p import new_host
from libp2p.crypto.ed25519 import Ed25519PrivateKey as _LibP2PPrivateKey
from libp2p.crypto.ed25519 import Ed25519PublicKey as LibP2PPublicKey
from libp2p.crypto.keys import KeyPair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID as PeerID  # noqa: N811 - libp2p's name for the type
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr


def _reconnect_libp2p_logging() -> None:
    """Route libp2p's records through the program's logging (it disables propagation at
    import) and undo the INFO levels some of its modules set on themselves."""
    root = logging.getLogger("libp2p")
    root.propagate = True
    if not os.environ.get("LIBP2P_DEBUG"):
        # WARNING keeps real problems visible without libp2p's chatter; LIBP2P_DEBUG or
        # `moehome -vv` lowers it.
        root.setLevel(logging.WARNING)
        for name, logger in logging.Logger.manager.loggerDict.items():
            if name.startswith("libp2p.") and isinstance(logger, logging.Logger):
                logger.setLevel(logging.NOTSET)


_reconnect_libp2p_logging()

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


def connection_config(dial_timeout: float = 10.0) -> ConnectionConfig:
    """Connection settings without the fixed 250 ms dial delay.

    ``Swarm.dial_peer`` only ends its happy-eyeballs wait early on failure or once
    ``max_connections_per_peer`` connections exist; with one connection per peer a dial
    on loopback takes ~10 ms instead of >= 250 ms.
    """
    return ConnectionConfig(max_connections_per_peer=1, dial_timeout=dial_timeout)


def key_pair_from_seed(seed: bytes) -> KeyPair:
    """libp2p's Ed25519 key pair for a 32-byte private seed."""
    private = _LibP2PPrivateKey.from_bytes(seed)
    return KeyPair(private, private.get_public_key())
