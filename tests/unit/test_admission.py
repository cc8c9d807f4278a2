"""Admission of inbound connections (net/transport/admission.py): pure, table-driven."""

from __future__ import annotations

import pytest

from net.transport.admission import AdmissionLimits, InboundAdmission, source_of

LIMITS = AdmissionLimits(
    max_handshakes=6,
    max_handshakes_per_source=3,
    max_inbound_per_source=2,
    connections_per_second=1.0,
    connection_burst=4.0,
)


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("198.18.0.7", "198.18.0.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # same /64: one home line
        ("::ffff:198.18.0.7", "198.18.0.7"),
        ("fe80::1%eth0", "fe80::/64"),
        (None, "?"),
        ("not an address", "not an address"),
    ],
)
def test_sources_are_addresses_or_ipv6_networks(host, source):
    assert source_of(host) == source


def test_a_source_over_its_share_of_handshakes_loses_its_oldest():
    gate: InboundAdmission[str] = InboundAdmission(LIMITS)
    assert gate.begin_handshake("a", "a1") == []
    assert gate.begin_handshake("a", "a2") == []
    assert gate.begin_handshake("a", "a3") == []
    assert gate.begin_handshake("a", "a4") == ["a1"]
    assert gate.begin_handshake("a", "a5") == ["a2"]
    assert gate.pending("a") == 3
    assert gate.stats.handshakes_evicted == 2


def test_when_all_sources_together_are_full_the_heaviest_source_loses_its_oldest():
    gate: InboundAdmission[str] = InboundAdmission(LIMITS)
    for handle in ("a1", "a2", "a3", "b1", "b2", "c1"):
        assert gate.begin_handshake(handle[0], handle) == []
    # a newcomer from a fourth source: "a" holds the most, its oldest goes
    assert gate.begin_handshake("d", "d1") == ["a1"]
    # then "a" and "b" hold two each; the first of them found goes, never the newcomer
    assert gate.begin_handshake("e", "e1") in (["a2"], ["b1"])
    assert gate.pending() == LIMITS.max_handshakes


def test_a_finished_handshake_frees_its_place_and_ending_twice_is_harmless():
    gate: InboundAdmission[str] = InboundAdmission(LIMITS)
    gate.begin_handshake("a", "a1")
    gate.end_handshake("a", "a1")
    gate.end_handshake("a", "a1")
    gate.end_handshake("z", "never")
    assert gate.pending() == 0
    assert gate.pending("a") == 0


def test_connections_per_source_are_capped_and_freed_when_they_close():
    gate: InboundAdmission[str] = InboundAdmission(LIMITS)
    assert gate.admits("a", now=0.0)
    assert gate.connection_opened("a", "a1") == []
    assert gate.connection_opened("a", "a2") == []
    assert not gate.admits("a", now=0.0)
    assert gate.admits("b", now=0.0)  # another source is not affected
    gate.connection_closed("a", "a1")
    assert gate.admits("a", now=0.0)
    assert gate.stats.refused_per_source == 1
    gate.connection_closed("a", "a2")
    gate.connection_closed("a", "a2")  # closing more than opened never goes negative
    assert gate.inbound("a") == 0
    assert gate.inbound() == 0


def test_past_the_total_the_heaviest_sources_oldest_connection_makes_room():
    """Issue 35, finding 5: all inbound connections together are bounded by us, fairly,
    well below libp2p's own cap (which refused everyone, both ways, at 300)."""
    limits = AdmissionLimits(max_inbound_per_source=3, max_inbound=5, outbound_reserve=7)
    gate: InboundAdmission[str] = InboundAdmission(limits)
    opened = [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("b", "b2")]
    assert [gate.connection_opened(*o) for o in opened] == [[]] * 5
    assert gate.connection_opened("c", "c1") == ["a1"]  # a holds the most
    assert gate.connection_opened("d", "d1") == ["a2"]  # still a's turn (2 against b's 2)
    assert gate.connection_opened("e", "e1") == ["b1"]
    assert gate.inbound() == 5
    assert gate.stats.connections_evicted == 3
    for source, handle in [("a", "a1"), ("a", "a2"), ("b", "b1")]:  # their handlers end
        gate.connection_closed(source, handle)
    assert (gate.inbound("a"), gate.inbound("b"), gate.inbound()) == (1, 1, 5)
    assert limits.libp2p_max_connections == 5 + limits.max_handshakes + 7


def test_a_source_opening_connections_too_fast_is_refused_until_its_bucket_refills():
    gate: InboundAdmission[str] = InboundAdmission(LIMITS)
    assert [gate.admits("a", now=0.0) for _ in range(5)] == [True] * 4 + [False]
    assert gate.admits("b", now=0.0)  # per source
    assert not gate.admits("a", now=0.5)
    assert gate.admits("a", now=1.6)
    assert gate.stats.refused_rate == 2


def test_remembered_sources_are_bounded():
    gate: InboundAdmission[str] = InboundAdmission(AdmissionLimits(max_sources=10))
    for i in range(1000):
        gate.admits(f"198.18.{i // 256}.{i % 256}", now=0.0)
    assert len(gate._rates) == 10


def test_a_source_that_keeps_misbehaving_is_banned_for_a_while():
    limits = AdmissionLimits(offences_before_ban=3, offence_window_seconds=10, ban_seconds=60)
    gate: InboundAdmission[str] = InboundAdmission(limits)
    assert [gate.offence("a", now=t) for t in (0, 1, 2)] == [False] * 3
    assert gate.offence("b", now=2) is False  # per source
    assert gate.offence("a", now=3) is True  # the fourth in the window bans
    assert not gate.admits("a", now=30)
    assert gate.admits("b", now=30)
    assert gate.offence("a", now=31) is False  # already banned: not banned again
    assert gate.admits("a", now=64)  # the ban ended
    assert gate.stats.bans == 1
    assert gate.stats.refused_banned == 1


def test_offences_spread_over_time_never_ban():
    limits = AdmissionLimits(offences_before_ban=3, offence_window_seconds=10)
    gate: InboundAdmission[str] = InboundAdmission(limits)
    assert not any(gate.offence("a", now=t * 4.0) for t in range(100))
