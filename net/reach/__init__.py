"""Reach: whether others can dial us (dial-backs), and the ways around a NAT (port
mapping, relays, hole punching), plus the signed address book that finds a peer again."""

from net.reach.portmap import PortMapConfig
from net.reach.reachability import Reachability, ReachabilityConfig, Verdict
from net.reach.relay import RelayLimits
from net.reach.relay_client import RelayClientConfig

__all__ = [
    "PortMapConfig",
    "Reachability",
    "ReachabilityConfig",
    "RelayClientConfig",
    "RelayLimits",
    "Verdict",
]
