"""Transport: the libp2p host (TCP + Noise + Yamux), dialing, keepalive, and the inbound
gates (admission per source address, per-stream limits)."""

from net.transport.host import (
    DEFAULT_LISTEN,
    EVERY_INTERFACE,
    AddressError,
    DialError,
    SwarmHost,
    interface_addresses,
    is_loopback_addr,
    parse_peer_addr,
)
from net.transport.keepalive import Keepalive

__all__ = [
    "DEFAULT_LISTEN",
    "EVERY_INTERFACE",
    "AddressError",
    "DialError",
    "Keepalive",
    "SwarmHost",
    "interface_addresses",
    "is_loopback_addr",
    "parse_peer_addr",
]
