"""Which of a peer's addresses are dialled, in what order (net/dialing.dial_order)."""

from __future__ import annotations

import pytest

from net.peer import network_config
from net.transport.dialing import MAX_DIAL_ADDRS, MAX_PORTS_PER_IP, dial_order, proven_addrs

PUB = "/ip4/198.18.0.10/tcp/4001"
LAN = "/ip4/198.18.1.10/tcp/4001"
LOOP = "/ip4/127.0.0.1/tcp/4001"
ANY = "/ip4/0.0.0.0/tcp/4001"
ANY6 = "/ip6/::/tcp/4001"
PID = "/p2p/12D3KooWD6odRR9xVj5zW1bxEVB2QL1jQpm3TfzFUt2qafiVwufJ"


@pytest.mark.parametrize(
    ("addrs", "own", "expected"),
    [
        ([PUB, LAN], (), [PUB, LAN]),  # the peer's order is kept
        ([LAN, PUB], (), [LAN, PUB]),
        ([LOOP, PUB], (), [PUB, LOOP]),  # loopback last
        ([LOOP], (), [LOOP]),  # a peer on this computer
        ([ANY, PUB], (), [PUB]),  # unspecified reaches whoever dials: never
        ([ANY6, ANY], (), []),
        ([PUB + PID, PUB], (), [PUB]),  # duplicates, with or without /p2p/
        ([LAN, PUB], (LAN,), [PUB]),  # our own listener: the dial would reach us
        ([f"{PUB}{PID}/p2p-circuit{PID}", PUB], (), [PUB]),  # relay client's job
        (["/ip4/224.0.0.1/tcp/1", "/ip4/not-an-ip/tcp/1", PUB], (), [PUB]),
        (["/dns4/example.test/tcp/4001"], (), ["/dns4/example.test/tcp/4001"]),
    ],
)
def test_dial_order(addrs, own, expected):
    assert dial_order(addrs, own) == expected


def test_a_record_naming_many_addresses_is_dialled_at_a_few():
    many = [f"/ip4/198.18.0.{i}/tcp/4001" for i in range(1, 100)]
    assert dial_order(many) == many[:MAX_DIAL_ADDRS]


@pytest.mark.parametrize(
    ("listen", "relay", "reach", "relays"),
    [
        (["/ip4/127.0.0.1/tcp/0"], True, False, False),  # a local swarm: nothing to learn
        (["/ip6/::1/tcp/0"], False, False, False),
        (["/ip4/0.0.0.0/tcp/4001"], False, True, False),
        (["/ip4/0.0.0.0/tcp/4001"], True, True, True),
        (["/ip4/127.0.0.1/tcp/0", "/ip4/198.18.0.10/tcp/4001"], False, True, False),
    ],
)
def test_roles_learn_their_reachability_only_beyond_loopback(listen, relay, reach, relays):
    config = network_config(listen, [], relay=relay)
    assert (config.reachability is not None) is reach
    assert (config.relay_client is not None) is reach  # places on relays when needed
    assert (config.relay is not None) is relays


@pytest.mark.parametrize(
    ("claimed", "source", "proven"),
    [
        (["/ip4/198.18.0.7/tcp/4001"], "198.18.0.7", ["/ip4/198.18.0.7/tcp/4001"]),
        # a third party's ports, claimed by someone at another address
        (["/ip4/198.18.0.9/tcp/22", "/ip4/198.18.0.9/tcp/80"], "198.18.0.7", []),
        # another port of the address the connection came from: proven as far as
        # addresses go (what the peer itself listens on)
        (
            ["/ip4/198.18.0.7/tcp/9/p2p/x", "/ip4/10.0.0.2/tcp/4001"],
            "198.18.0.7",
            ["/ip4/198.18.0.7/tcp/9/p2p/x"],
        ),
        # IPv6: the /64 the connection came from
        (
            ["/ip6/2001:db8::1/tcp/4001", "/ip6/2001:db9::1/tcp/1"],
            "2001:db8::/64",
            ["/ip6/2001:db8::1/tcp/4001"],
        ),
        # circuits through the relay the connection came through
        (
            ["/ip4/198.18.0.1/tcp/4001/p2p/R/p2p-circuit"],
            "198.18.0.1",
            ["/ip4/198.18.0.1/tcp/4001/p2p/R/p2p-circuit"],
        ),
        (["/dns4/example.org/tcp/4001", "/ip4/not-an-ip/tcp/1"], "198.18.0.7", []),
    ],
)
def test_only_the_addresses_a_connection_proves_are_taken_from_a_peers_claim(
    claimed, source, proven
):
    assert list(proven_addrs(claimed, source)) == proven


def test_a_record_naming_many_ports_of_one_address_is_dialled_at_a_few():
    ports = [f"/ip4/198.18.0.9/tcp/{p}" for p in (22, 80, 443, 8080, 8443, 9000)]
    assert dial_order([*ports, "/ip4/198.18.0.10/tcp/4001"]) == [
        *ports[:MAX_PORTS_PER_IP],
        "/ip4/198.18.0.10/tcp/4001",
    ]
