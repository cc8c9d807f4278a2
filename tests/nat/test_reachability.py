"""Reachability learned from dial-backs, in the lab: a peer on the public network is
reachable, one behind a home NAT is not (it is seen at its router's address)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from net.lab import Home, LabHost, network_lab
from tests.child_processes import stop_processes
from tests.nat.probes import Lines

ROOT = Path(__file__).resolve().parents[2]
PORT = 4001


def start_peer(host: LabHost, bootstrap: list[str]) -> tuple[subprocess.Popen[str], Lines, str]:
    """A bare swarm peer in ``host``'s namespace; returns it, its output and its address
    on the lab's network."""
    cmd = [sys.executable, "-m", "core.cli", "--quiet", "peer", "--ephemeral"]
    cmd += ["-l", f"/ip4/0.0.0.0/tcp/{PORT}", "--recheck-s", "1"]
    for addr in bootstrap:
        cmd += ["-b", addr]
    proc = subprocess.Popen(host.command(cmd), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    lines = Lines(proc)
    addr = lines.wait_for(lambda line: line.startswith(f"/ip4/{host.ip}/"), 30)
    return proc, lines, addr


def verdict(lines: Lines, reachability: str, timeout: float = 30) -> dict[str, Any]:
    line = lines.wait_for(
        lambda line: line.startswith("{") and json.loads(line)["reachability"] == reachability,
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
