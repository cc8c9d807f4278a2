"""Where `moehome demo --nat` puts its processes: volunteers take turns in their homes,
the trainer sits in home b, a symmetric NAT in home c (table-driven)."""

from __future__ import annotations

import pytest

from core.demo.options import DemoOptions
from core.demo.scenario import Places


@pytest.mark.parametrize(
    ("options", "homes", "volunteers", "public"),
    [
        (
            DemoOptions(volunteers=2, nat=True),
            [("a", 1, "cone"), ("b", 2, "cone")],
            ["a/0", "b/0"],
            ["bootstrap", "owner", "aggregator"],
        ),
        (
            DemoOptions(volunteers=3, nat=True),
            [("a", 2, "cone"), ("b", 2, "cone")],
            ["a/0", "b/0", "a/1"],
            ["bootstrap", "owner", "aggregator"],
        ),
        (
            DemoOptions(volunteers=2, nat=True, symmetric=True, kill_relay=True),
            [("a", 1, "cone"), ("b", 1, "cone"), ("c", 1, "symmetric")],
            ["a/0", "c/0"],
            ["bootstrap", "owner", "aggregator", "relay"],
        ),
        (
            DemoOptions(volunteers=3, attackers=1, nat=True, symmetric=True),
            [("a", 2, "cone"), ("b", 1, "cone"), ("c", 2, "symmetric")],
            ["a/0", "c/0", "a/1", "c/1"],
            ["bootstrap", "owner", "aggregator"],
        ),
    ],
)
def test_places(options, homes, volunteers, public):
    places = Places.for_options(options)
    assert [(h.name, h.hosts, h.nat) for h in places.homes(options)] == homes
    assert [places.next_volunteer() for _ in volunteers] == volunteers
    assert Places.public(options) == public
