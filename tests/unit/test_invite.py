"""Invites: what a volunteer pastes, from a web page or a chat window (table-driven), and
the cache of peers met."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.control.invite import (
    MAX_INVITE_CHARS,
    MAX_PEERS,
    Invite,
    InviteError,
    make_invite,
    parse_invite,
)
from core.node.peer_cache import MAX_CACHE_BYTES, PeerCache, default_bootstrap_peers

PID = "0123456789abcdef" * 2
PEER_A = "/ip4/198.18.0.7/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
PEER_B = "/dns4/boot.example.org/tcp/443/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
PEER_6 = "/ip6/::1/tcp/9/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
LINK = Invite(project=PID, peers=(PEER_A, PEER_B)).link()


@pytest.mark.parametrize(
    ("text", "project", "peers"),
    [
        (PID, PID, ()),
        (PID.upper(), PID, ()),  # hex copied from somewhere that upper-cases it
        (f"  {PID}\n", PID, ()),
        (LINK, PID, (PEER_A, PEER_B)),
        (LINK.replace("%2F", "%2f"), PID, (PEER_A, PEER_B)),
        # wrapped by a mail program, pasted with the line break
        (LINK[:40] + "\n  " + LINK[40:], PID, (PEER_A, PEER_B)),
        (f"MOEHOME://JOIN/{PID}", PID, ()),
        (f"moehome://join/{PID}/", PID, ()),
        # the same peer twice is one peer; a key a newer app adds is ignored
        (f"{LINK}&peer={PEER_A.replace('/', '%2F')}&lang=en", PID, (PEER_A, PEER_B)),
        (Invite(project=PID, peers=(PEER_6,)).link(), PID, (PEER_6,)),
    ],
)
def test_invites_that_parse(text: str, project: str, peers: tuple[str, ...]) -> None:
    invite = parse_invite(text)
    assert invite.project == project
    assert invite.peers == peers
    assert parse_invite(invite.link()) == invite  # a round trip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "paste the invite link"),
        ("   ", "paste the invite link"),
        ("hello", "neither an invite nor a project id"),
        (PID[:-1], "neither an invite nor a project id"),
        (f"https://join/{PID}", "not a moehome invite"),
        (f"moehome://leave/{PID}", "not a moehome invite"),
        ("moehome://join/xyz", "project id 'xyz' is wrong"),
        (f"moehome://join/{PID}?peer=%2Fip4%2F1.2.3.4%2Ftcp%2F1", "bad peer"),  # no /p2p/
        (f"moehome://join/{PID}?peer=%2Fip4%2F1.2.3.4%2Fudp%2F1%2Fquic%2Fp2p%2FQm", "bad peer"),
        (f"moehome://join/{PID}?" + "&".join(["peer=x"] * (MAX_PEERS + 1)), "at most"),
        (f"moehome://join/{PID}?" + "&".join(["a=1"] * 100), "too many parts"),
        ("moehome://join/" + "a" * MAX_INVITE_CHARS, "too long"),
    ],
)
def test_invites_that_are_refused_say_why(text: str, says: str) -> None:
    with pytest.raises(InviteError, match=says):
        parse_invite(text)


@given(st.text(max_size=300))
def test_any_text_is_an_invite_or_a_clear_error(text: str) -> None:
    try:
        invite = parse_invite(text)
    except InviteError as exc:
        message = str(exc)
    else:
        message = "parsed"
        assert len(invite.peers) <= MAX_PEERS
        assert parse_invite(invite.link()) == invite
    assert message


def test_make_invite_keeps_only_dialable_tcp_addresses() -> None:
    quic = PEER_A.replace("/tcp/4001/", "/udp/4001/quic-v1/")
    invite = make_invite(PID, [quic, PEER_A, PEER_A, *[PEER_B] * 20])
    assert invite.peers == (PEER_A, PEER_B)


def test_the_peer_cache_keeps_the_newest_valid_addresses(tmp_path) -> None:
    cache = PeerCache(tmp_path / "peers.json", most=2)
    assert cache.load() == []
    cache.remember([PEER_A, "not an address"], now=1.0)
    cache.remember([PEER_B], now=2.0)
    assert cache.load() == [PEER_B, PEER_A]
    cache.remember([PEER_6], now=3.0)
    assert cache.load() == [PEER_6, PEER_B]  # the oldest went
    cache.remember([PEER_A], now=4.0)
    assert cache.load() == [PEER_A, PEER_6]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2, 3]",
        json.dumps({"rm -rf /": 1.0, PEER_A: "yesterday", PEER_B: True}).encode(),
        b" " * (MAX_CACHE_BYTES + 1),
    ],
)
def test_a_damaged_peer_cache_is_ignored(tmp_path, content: bytes) -> None:
    path = tmp_path / "peers.json"
    path.write_bytes(content)
    assert PeerCache(path).load() == []
    PeerCache(path).remember([PEER_A], now=5.0)  # and replaced by a good one
    assert PeerCache(path).load() == [PEER_A]


def test_default_bootstrap_peers_can_be_replaced(tmp_path) -> None:
    assert default_bootstrap_peers(tmp_path, environ={}) == []  # none shipped yet
    (tmp_path / "bootstrap-peers.txt").write_text(
        f"# the owner's peers\n{PEER_A}  # the first\n\nnonsense\n{PEER_B}\n"
    )
    assert default_bootstrap_peers(tmp_path, environ={}) == [PEER_A, PEER_B]
    env = {"MOEHOME_BOOTSTRAP": f"{PEER_6}, {PEER_A}"}
    assert default_bootstrap_peers(tmp_path, environ=env) == [PEER_6, PEER_A]
