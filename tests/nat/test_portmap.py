"""Port mapping with a real router: miniupnpd (UPnP IGD) in a home router of the lab.
A peer that asks its router to forward its port is reachable directly from the public
network; its neighbour behind the same router, which does not ask, is not; the port is
closed again when the peer stops."""

from __future__ import annotations

import pytest

from net.testing.lab import Home, network_lab
from tests.child_processes import stop_processes
from tests.nat.conftest import require_upnp
from tests.nat.probes import PEER_PORT, start_peer
from tests.nat.test_reachability import verdict

pytestmark = pytest.mark.slow


def test_a_peer_that_maps_its_port_is_reachable_and_the_port_closes_when_it_stops():
    require_upnp()
    with network_lab(["boot", "other"], [Home("a", hosts=2, upnp=True)]) as lab:
        procs = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [])
            procs.append(boot)
            other, _, other_addr = start_peer(lab.host("other"), [boot_addr])
            procs.append(other)
            mapped, mapped_lines, _ = start_peer(
                lab.host("a/0"), [boot_addr, other_addr], map_port=True
            )
            procs.append(mapped)
            # the neighbour listens on another port (one port outside per mapping)
            plain, plain_lines, _ = start_peer(
                lab.host("a/1"), [boot_addr, other_addr], port=PEER_PORT + 1
            )
            procs.append(plain)

            seen = verdict(mapped_lines, "public", timeout=60)
            router = lab.public_ip_of("a")
            assert seen["public_addrs"] == [f"/ip4/{router}/tcp/{PEER_PORT}"]
            assert verdict(plain_lines, "private", timeout=60)["observed_ip"] == router
            forwards = lab.upnp_mappings("a")
            assert f"dport {PEER_PORT} " in forwards, forwards
            assert f"to {lab.host('a/0').ip}:{PEER_PORT}" in forwards, forwards

            stop_processes([mapped])  # SIGTERM: it stops cleanly and closes the port
            assert mapped.returncode == 0
            assert f"dport {PEER_PORT} " not in lab.upnp_mappings("a")
        finally:
            stop_processes(procs)
