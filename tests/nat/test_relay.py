"""Relays behind real NAT (network namespaces): a peer in one home is reached from
another home through a public peer's relay, and moves to another relay when its relay
leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from net.lab import Home, LabHost, network_lab
from tests.child_processes import stop_processes
from tests.nat.probes import Lines, start_peer
from tests.nat.test_reachability import verdict

ROOT = Path(__file__).resolve().parents[2]


def relayed_addrs(lines: Lines, count: int, timeout: float = 60) -> list[str]:
    """The next announcement of exactly ``count`` relayed addresses."""
    line = lines.wait_for(
        lambda line: (
            line.startswith('{"relayed_addrs"') and len(json.loads(line)["relayed_addrs"]) == count
        ),
        timeout,
    )
    addrs: list[str] = json.loads(line)["relayed_addrs"]
    return addrs


def call(
    host: LabHost,
    peer: str,
    addrs: list[str],
    nbytes: int = 0,
    bootstrap: str | None = None,
    direct_within: float = 0.0,
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.nat.caller", peer, *addrs, "--bytes", str(nbytes)]
    cmd += ["--direct-within", str(direct_within)]
    if bootstrap:
        cmd += ["--bootstrap", bootstrap]
    done = subprocess.run(
        host.command(cmd), cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def peer_id_of(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


@pytest.mark.slow
def test_a_peer_behind_nat_is_reached_through_a_relay_and_moves_when_it_leaves():
    with network_lab(["boot", "r2", "r3"], [Home("a"), Home("b")]) as lab:
        procs: list[subprocess.Popen[str]] = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [])
            procs.append(boot)
            relays = {}
            for name in ("r2", "r3"):
                proc, lines, addr = start_peer(lab.host(name), [boot_addr])
                procs.append(proc)
                relays[peer_id_of(addr)] = proc
                verdict(lines, "public")
            home, home_lines, home_addr = start_peer(lab.host("a/0"), [boot_addr])
            procs.append(home)
            assert verdict(home_lines, "private")["observed_ip"] == lab.public_ip_of("a")
            circuits = relayed_addrs(home_lines, 2)
            assert all(a.endswith("/p2p-circuit") for a in circuits)

            # from another home, knowing only the relayed addresses
            target = peer_id_of(home_addr)
            result = call(lab.host("b/0"), target, circuits, nbytes=256 * 1024)
            assert result["connected"], result
            assert result["first_kind"] == "relayed"

            # the relay that is not the bootstrap peer leaves: another takes its place
            used = {peer_id_of(a.removesuffix("/p2p-circuit")) for a in circuits}
            leaving = next(p for p in used if p in relays)
            stop_processes([relays[leaving]])
            moved = home_lines.wait_for(
                lambda line: (
                    line.startswith('{"relayed_addrs"')
                    and len(json.loads(line)["relayed_addrs"]) == 2
                    and leaving not in line
                ),
                60,
            )
            new_circuits = json.loads(moved)["relayed_addrs"]
            result = call(lab.host("b/0"), target, new_circuits)
            assert result["connected"], result
            assert result["first_kind"] == "relayed"
        finally:
            stop_processes(procs)


@pytest.mark.slow
@pytest.mark.parametrize(("nat", "final"), [("cone", "direct"), ("symmetric", "relayed")])
def test_peers_behind_two_nats_punch_through_or_stay_relayed(nat, final):
    """Two homes: across two NATs that keep ports, hole punching makes the connection
    direct; when the caller's NAT picks a new port per destination, it stays relayed."""
    with network_lab(["boot", "r2"], [Home("a"), Home("b", nat=nat)]) as lab:
        procs: list[subprocess.Popen[str]] = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [])
            procs.append(boot)
            r2, r2_lines, _ = start_peer(lab.host("r2"), [boot_addr])
            procs.append(r2)
            verdict(r2_lines, "public")
            home, home_lines, home_addr = start_peer(lab.host("a/0"), [boot_addr])
            procs.append(home)
            circuits = relayed_addrs(home_lines, 2)
            result = call(
                lab.host("b/0"),
                peer_id_of(home_addr),
                circuits,
                nbytes=1024 * 1024,
                bootstrap=boot_addr,
                direct_within=30,
            )
            assert result["connected"], result
            assert result["reachability"] == "private"
            assert result["first_kind"] == "relayed"
            assert result["final_kind"] == final, result
        finally:
            stop_processes(procs)
