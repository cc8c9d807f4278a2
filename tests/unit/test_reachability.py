"""The reachability verdict from peers' dial-back answers (net/reachability.judge)."""

from __future__ import annotations

import pytest

from net import Identity
from net._libp2p import PeerID
from net.reach.reachability import (
    DialBackAnswer,
    Reachability,
    _answer,
    judge,
    pool_answers,
    tcp_ports,
)

S = [Identity.generate().peer_id for _ in range(4)]
HOME_LAN = "198.18.1.10"  # our own interface address behind a NAT
ROUTER = "198.18.0.100"  # what peers outside see


def source(server: int) -> str:
    """Each server at an address of its own."""
    return f"198.18.0.{50 + server}"


def ok(server: int, ip: str = ROUTER, port: int = 4001, at: str | None = None) -> DialBackAnswer:
    """A verified dial-back (its dialer came in) from ``server``, which saw us at ``ip``."""
    return DialBackAnswer(S[server], ip, (port,), (port,), at or source(server))


def failed(server: int, ip: str = ROUTER, port: int = 4001) -> DialBackAnswer:
    return DialBackAnswer(S[server], ip, (), (port,), source(server))


def observed_only(server: int, ip: str = ROUTER) -> DialBackAnswer:
    return DialBackAnswer(S[server], ip, (), (), source(server))


LIE = "198.18.0.66"  # an address an attacker chose


@pytest.mark.parametrize(
    ("answers", "own_ips", "expected", "addrs"),
    [
        ([], (), Reachability.UNKNOWN, ()),
        # one peer got through: proof enough that we can be reached, once a second
        # source agrees on where we are seen from
        ([ok(0), failed(1)], (HOME_LAN,), Reachability.PUBLIC, (f"/ip4/{ROUTER}/tcp/4001",)),
        ([ok(0), observed_only(1)], (HOME_LAN,), Reachability.PUBLIC, (f"/ip4/{ROUTER}/tcp/4001",)),
        # ... one source alone is its word (issue 35: an attacker told a peer behind NAT
        # it was public at an address of the attacker's choosing)
        ([ok(0)], (HOME_LAN,), Reachability.UNKNOWN, ()),
        ([ok(0, LIE), ok(1, LIE, at=source(0))], (HOME_LAN,), Reachability.UNKNOWN, ()),
        ([ok(0, LIE), failed(1), failed(2)], (HOME_LAN,), Reachability.PRIVATE, ()),
        # one failure may be that peer's own network
        ([failed(0)], (HOME_LAN,), Reachability.UNKNOWN, ()),
        ([failed(0), failed(0)], (HOME_LAN,), Reachability.UNKNOWN, ()),
        ([failed(0), failed(1)], (HOME_LAN,), Reachability.PRIVATE, ()),
        # answers that only say where we are seen from are no dial-back
        ([observed_only(0), observed_only(1)], (HOME_LAN,), Reachability.UNKNOWN, ()),
        # a neighbour on the LAN got through; two peers outside did not: behind NAT
        (
            [ok(0, HOME_LAN), failed(1), failed(2)],
            (HOME_LAN,),
            Reachability.PRIVATE,
            (),
        ),
        # no NAT at all: everyone sees our interface address, and got through
        (
            [ok(0, "198.18.0.10"), ok(1, "198.18.0.10")],
            ("198.18.0.10",),
            Reachability.PUBLIC,
            ("/ip4/198.18.0.10/tcp/4001",),
        ),
        # no NAT but a firewall: everyone sees our address and nobody got through
        (
            [failed(0, "198.18.0.10"), failed(1, "198.18.0.10")],
            ("198.18.0.10",),
            Reachability.PRIVATE,
            (),
        ),
        # only neighbours answered: they speak for our LAN, the best we know
        ([ok(0, HOME_LAN)], (HOME_LAN,), Reachability.PUBLIC, (f"/ip4/{HOME_LAN}/tcp/4001",)),
    ],
)
def test_verdict(answers, own_ips, expected, addrs):
    verdict = judge(answers, own_ips)
    assert verdict.reachability is expected
    assert verdict.public_addrs == addrs


def test_the_address_most_peers_saw_is_the_observed_one():
    verdict = judge([failed(0, "198.18.0.7"), failed(1), failed(2)], (HOME_LAN,))
    assert verdict.observed_ip == ROUTER


def test_ports_of_our_ipv4_tcp_listeners():
    assert tcp_ports(
        [
            "/ip4/198.18.1.10/tcp/4001",
            "/ip4/127.0.0.1/tcp/4001",
            "/ip6/::1/tcp/5",
            "/ip4/1.2.3.4/udp/9",
        ]
    ) == [4001]


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"observed": 7, "reachable": [], "tried": []},
        {"observed": "not an ip", "reachable": [], "tried": []},
        {"observed": "::1", "reachable": [], "tried": []},
        {"observed": "198.18.0.1", "reachable": "4001", "tried": []},
        {"observed": "198.18.0.1", "reachable": [], "tried": None},
    ],
)
def test_malformed_answers_are_ignored(meta):
    assert _answer(S[0], meta, [4001]) is None


def test_an_answer_cannot_claim_ports_we_did_not_ask_about():
    answer = _answer(
        S[0], {"observed": ROUTER, "reachable": [4001, 22], "tried": [4001, 22]}, [4001]
    )
    assert answer == DialBackAnswer(S[0], ROUTER, (4001,), (4001,), "?")


NEW_ROUTER = "198.18.0.150"


def judged_pool(
    rounds: list[tuple[float, list[DialBackAnswer]]], window: float = 300
) -> Reachability:
    recent: dict[PeerID, tuple[float, DialBackAnswer]] = {}
    for now, answers in rounds:
        recent = pool_answers(recent, answers, now, window, own_ips=(HOME_LAN,))
    return judge([a for _, a in recent.values()], own_ips=(HOME_LAN,)).reachability


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        # peers rate-limit dial-backs: two rounds with one failure each add up
        ([(0, [failed(0)]), (10, [failed(1)])], Reachability.PRIVATE),
        # the latest answer of a peer replaces its earlier one
        ([(0, [failed(0), failed(1)]), (10, [ok(1)])], Reachability.PUBLIC),
        ([(0, [ok(0)]), (10, [failed(0)]), (20, [failed(1)])], Reachability.PRIVATE),
        # an answer older than the window no longer counts
        ([(0, [failed(0)]), (400, [failed(1)])], Reachability.UNKNOWN),
        # after a change of address, answers about the old one no longer count
        ([(0, [failed(0)]), (10, [failed(1, NEW_ROUTER)])], Reachability.UNKNOWN),
        (
            [(0, [ok(0)]), (10, [failed(1, NEW_ROUTER)]), (20, [failed(2, NEW_ROUTER)])],
            Reachability.PRIVATE,
        ),
        # a neighbour on the LAN stays in the pool but does not speak for the internet
        ([(0, [ok(0, HOME_LAN)]), (10, [failed(1), failed(2)])], Reachability.PRIVATE),
    ],
)
def test_answers_add_up_over_rounds(rounds, expected):
    assert judged_pool(rounds) is expected
