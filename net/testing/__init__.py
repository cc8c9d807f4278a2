"""The test rig of net/: real peers in one process (``open_swarm``), and the root-only
network lab (``net.testing.lab``: namespaces, NAT routers, a UPnP router). Never
imported by the product's roles (checked by tests/unit/test_architecture.py and
tests/processes/test_light_commands.py)."""

from net.testing.swarm import Swarm, count_connections, dial_from, open_swarm, raw_frame

__all__ = ["Swarm", "count_connections", "dial_from", "open_swarm", "raw_frame"]
