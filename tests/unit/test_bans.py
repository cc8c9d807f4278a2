"""Ban records: their schema, and how a peer's view of a project's bans follows them
(who may ban, expiry, pardons); an aggregator honouring a ban."""

from __future__ import annotations

import math

import pytest

from core.aggregator.core import AggregatorCore
from core.aggregator.verify import Rejected
from core.protocol.bans import MAX_BANS, Ban, decode_bans, encode_bans
from core.protocol.fields import MessageError
from net import Identity
from tests.unit.test_aggregator_core import contribution, settings

PROJECT = "p" * 32


def test_ban_lists_round_trip_and_keep_the_newest():
    bans = [Ban(f"peer{i}", "wrong answer", 1e9 + i, b"", 1.5) for i in range(MAX_BANS + 5)]
    bans.append(Ban("unsigned", "no statement", 2e9, b"", math.inf))
    project, back = decode_bans(encode_bans(PROJECT, bans))
    assert project == PROJECT
    assert len(back) == MAX_BANS
    assert back[-1] == bans[-1]  # infinity survives the trip
    assert back[0] == bans[-MAX_BANS]


@pytest.mark.parametrize(
    "value",
    [
        b"\xc1",  # not msgpack
        b"\x90",  # a list, not a map
        encode_bans(PROJECT, [])[:-1],  # truncated
    ],
)
def test_garbage_is_not_a_ban_list(value):
    with pytest.raises(MessageError):
        decode_bans(value)


@pytest.mark.parametrize(
    "obj",
    [
        ["peer", "r", 1.0, b""],  # a field short
        ["", "r", 1.0, b"", 1.0],  # no peer
        ["peer", "r" * 201, 1.0, b"", 1.0],  # a reason too long
        ["peer", "r", True, b"", 1.0],  # a boolean is no time
        ["peer", "r", 1.0, b"not a statement", 1.0],
    ],
)
def test_a_malformed_ban_is_refused(obj):
    with pytest.raises(MessageError):
        Ban.from_obj(obj)


def test_an_aggregator_honouring_a_ban_refuses_and_drops_the_contributor(tmp_path):
    core = AggregatorCore(settings(), tmp_path)
    try:
        cheater, honest = Identity.from_seed(b"x" * 32), Identity.from_seed(b"y" * 32)
        core.submit(*contribution(core, cheater))
        core.submit(*contribution(core, honest))
        assert core.ban_contributor(cheater.public_key) == 1
        assert [p.contributor for p in core.pending["ffn0.0.0"]] == [honest.public_key.hex()]
        with pytest.raises(Rejected, match="banned_by_project"):
            core.submit(*contribution(core, cheater))
        assert core.stats.banned_peers == 0  # not a strike of its own: the project's word
        core.submit(*contribution(core, honest))  # others go on
    finally:
        core.close()
