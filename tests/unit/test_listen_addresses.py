"""A node listening on every interface gives its peers the interfaces' own addresses:
0.0.0.0 is no address to dial. Table-driven (the interfaces are given)."""

from __future__ import annotations

import pytest

from net.transport.host import expand_unspecified

INTERFACES = ["127.0.0.1", "::1", "192.168.1.20", "fd00::2", "fe80::1", "169.254.3.4", "10.0.0.5"]


@pytest.mark.parametrize(
    ("bound", "given"),
    [
        (["/ip4/127.0.0.1/tcp/5"], ["/ip4/127.0.0.1/tcp/5"]),
        (
            ["/ip4/0.0.0.0/tcp/4001"],
            ["/ip4/192.168.1.20/tcp/4001", "/ip4/10.0.0.5/tcp/4001", "/ip4/127.0.0.1/tcp/4001"],
        ),
        (["/ip6/::/tcp/4001"], ["/ip6/fd00::2/tcp/4001", "/ip6/::1/tcp/4001"]),
        # one listener given twice (two names of one socket) is one address
        (
            ["/ip4/0.0.0.0/tcp/9", "/ip4/192.168.1.20/tcp/9"][::-1],
            ["/ip4/192.168.1.20/tcp/9", "/ip4/10.0.0.5/tcp/9", "/ip4/127.0.0.1/tcp/9"],
        ),
        (["/dns4/example.org/tcp/1"], ["/dns4/example.org/tcp/1"]),
    ],
)
def test_unspecified_listeners_become_the_interfaces_addresses(bound, given):
    assert expand_unspecified(bound, INTERFACES) == given


def test_no_interface_of_the_family_gives_no_address():
    assert expand_unspecified(["/ip6/::/tcp/1"], ["127.0.0.1"]) == []
