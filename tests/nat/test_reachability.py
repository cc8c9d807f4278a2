"""Reachability learned from dial-backs, in the lab: a peer on the public network is
reachable, one behind a home NAT is not (it is seen at its router's address)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from net.testing.lab import Home, network_lab
from tests.child_processes import stop_processes
from tests.nat.probes import PEER_PORT, Lines, start_peer

ROOT = Path(__file__).resolve().parents[2]
PORT = PEER_PORT


def verdict(lines: Lines, reachability: str, timeout: float = 30) -> dict[str, Any]:
    line = lines.wait_for(
        lambda line: line.startswith("{") and json.loads(line).get("reachability") == reachability,
        timeout,
    )
    return json.loads(line)


@pytest.mark.slow
def test_public_peers_are_reachable_and_a_peer_behind_nat_is_not():
    with network_lab(["boot", "other"], [Home("a")]) as lab:
        procs = []
        try:
            boot, boot_lines, boot_addr = start_peer(lab.host("boot"), [])
            procs.append(boot)
            other, other_lines, other_addr = start_peer(lab.host("other"), [boot_addr])
            procs.append(other)
            home, home_lines, _ = start_peer(lab.host("a/0"), [boot_addr, other_addr])
            procs.append(home)

            seen = verdict(home_lines, "private")
            assert seen["observed_ip"] == lab.public_ip_of("a")  # its router, not its LAN
            assert seen["public_addrs"] == []
            for lines, host in ((boot_lines, "boot"), (other_lines, "other")):
                seen = verdict(lines, "public")
                assert seen["public_addrs"] == [f"/ip4/{lab.host(host).ip}/tcp/{PORT}"]

        finally:
            stop_processes(procs)


@pytest.mark.slow
def test_a_peer_whose_router_gets_a_new_address_is_seen_there_without_a_restart():
    """The provider renumbers the home's router: every connection through it dies
    silently. The peer notices (keepalive, its observers see a new address), dials its
    peers again and learns its new public address."""
    # connections that died silently are dropped within 8 s here (30 s by default: the
    # mechanism is the same, and the test waited 35-50 s on it)
    dead = 8
    with network_lab(["boot", "other"], [Home("a")]) as lab:
        procs = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [], dead_after_s=dead)
            procs.append(boot)
            other, _, other_addr = start_peer(lab.host("other"), [boot_addr], dead_after_s=dead)
            procs.append(other)
            home, home_lines, _ = start_peer(
                lab.host("a/0"), [boot_addr, other_addr], observe_s=2, dead_after_s=dead
            )
            procs.append(home)
            assert verdict(home_lines, "private")["observed_ip"] == lab.public_ip_of("a")

            new_ip = lab.renumber("a")
            # observed every 2 s here (30 s by default), then a round of dial-backs
            seen = home_lines.wait_for(
                lambda line: (
                    line.startswith("{")
                    and json.loads(line).get("reachability") == "private"
                    and json.loads(line)["observed_ip"] == new_ip
                ),
                90,
            )
            assert json.loads(seen)["public_addrs"] == []
        finally:
            stop_processes(procs)
