"""Which of a peer's addresses are dialled, in what order (net/dialing.dial_order)."""

from __future__ import annotations

import pytest

from net.dialing import MAX_DIAL_ADDRS, dial_order
from net.peer import network_config

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
