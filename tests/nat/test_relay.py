"""Relays and hole punching behind real NAT (network namespaces). One lab for the
module: a bootstrap peer and two more public peers (all relay), a volunteer in home
"a", callers in home "b" (a NAT that keeps ports, like most home routers) and home "c"
(a symmetric NAT, like many carrier NATs). The relays let a circuit carry 2 MiB one
way (64 by default), so that a test can go over. The destructive test comes last."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from net.testing.lab import Home, Lab, LabHost, network_lab
from tests.child_processes import stop_processes
from tests.nat.conftest import require_lab
from tests.nat.probes import ROOT, Lines, start_peer
from tests.nat.test_reachability import verdict

pytestmark = pytest.mark.slow

CIRCUIT_MIB = 2


@dataclass
class World:
    lab: Lab
    boot_addr: str
    #: peer id -> process, for the public peers that are not the bootstrap peer
    relays: dict[str, subprocess.Popen[str]]
    home_lines: Lines
    target: str
    circuits: list[str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)


def relayed_announcement(lines: Lines, wanted: Any, timeout: float = 60) -> list[str]:
    """The relayed addresses of the next announcement for which ``wanted`` holds."""
    line = lines.wait_for(
        lambda line: (
            line.startswith('{"relayed_addrs"') and wanted(json.loads(line)["relayed_addrs"])
        ),
        timeout,
    )
    addrs: list[str] = json.loads(line)["relayed_addrs"]
    return addrs


def call(host: LabHost, world: World, *, punch: bool, nbytes: int = 0) -> dict[str, Any]:
    """Run tests/nat/caller.py in ``host``: it knows only the volunteer's relayed
    addresses; with ``punch`` it first learns where it is seen (hole punching needs it)
    and waits up to 20 s for a direct connection."""
    cmd = [sys.executable, "-m", "tests.nat.caller", world.target, *world.circuits]
    cmd += ["--bytes", str(nbytes)]
    if punch:  # three attempts of at most 5 s each (net/reach/holepunch.py)
        cmd += ["--bootstrap", world.boot_addr, "--direct-within", "20"]
    done = subprocess.run(
        host.command(cmd), cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def peer_id_of(addr: str) -> str:
    return addr.removesuffix("/p2p-circuit").rsplit("/p2p/", 1)[1]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    require_lab()
    homes = [Home("a"), Home("b"), Home("c", nat="symmetric")]
    with network_lab(["boot", "r2", "r3"], homes) as lab:
        procs: list[subprocess.Popen[str]] = []
        try:
            boot, _, boot_addr = start_peer(lab.host("boot"), [], relay_circuit_mib=CIRCUIT_MIB)
            procs.append(boot)
            relays = {}
            for name in ("r2", "r3"):
                proc, lines, addr = start_peer(
                    lab.host(name), [boot_addr], relay_circuit_mib=CIRCUIT_MIB
                )
                procs.append(proc)
                relays[peer_id_of(addr)] = proc
                verdict(lines, "public")
            home, home_lines, home_addr = start_peer(lab.host("a/0"), [boot_addr])
            procs.append(home)
            assert verdict(home_lines, "private")["observed_ip"] == lab.public_ip_of("a")
            circuits = relayed_announcement(home_lines, lambda addrs: len(addrs) == 2)
            assert all(a.endswith("/p2p-circuit") for a in circuits)
            yield World(lab, boot_addr, relays, home_lines, peer_id_of(home_addr), circuits, procs)
        finally:
            stop_processes(procs)


def test_a_peer_behind_nat_is_reached_through_a_relay_from_another_home(world):
    result = call(world.lab.host("b/0"), world, punch=False, nbytes=256 * 1024)
    assert result["connected"], result
    assert result["first_kind"] == "relayed"
    assert result["mb_s"] > 0


def test_across_two_nats_that_keep_ports_hole_punching_makes_it_direct(world):
    result = call(world.lab.host("b/0"), world, punch=True, nbytes=1024 * 1024)
    assert result["connected"], result
    assert result["reachability"] == "private"
    assert result["first_kind"] == "relayed"
    assert result["final_kind"] == "direct", result
    assert result["mb_s"] > 0, result  # 1 MiB over the direct connection


def test_behind_a_symmetric_nat_the_connection_stays_relayed_and_works(world):
    result = call(world.lab.host("c/0"), world, punch=True, nbytes=1024 * 1024)
    assert result["connected"], result
    assert result["first_kind"] == "relayed"
    assert result["final_kind"] == "relayed", result
    assert result["mb_s"] > 0


def test_a_caller_over_the_relays_limit_is_cut_off_and_the_relay_serves_others(world):
    # behind the symmetric NAT the caller has only the relay: 4 MiB cannot pass
    greedy = call(world.lab.host("c/0"), world, punch=False, nbytes=2 * CIRCUIT_MIB * 2**20)
    assert greedy["connected"], greedy
    assert greedy["first_kind"] == "relayed"
    assert "mb_s" not in greedy
    assert greedy.get("error"), greedy
    # the volunteer keeps its places, and the relays carry the next caller
    modest = call(world.lab.host("b/0"), world, punch=False, nbytes=256 * 1024)
    assert modest["connected"], modest
    assert modest["first_kind"] == "relayed"
    assert modest["mb_s"] > 0


def test_when_its_relay_leaves_the_peer_moves_to_another(world):
    leaving = next(peer_id_of(a) for a in world.circuits if peer_id_of(a) in world.relays)
    stop_processes([world.relays.pop(leaving)])
    world.circuits = relayed_announcement(
        world.home_lines,
        lambda addrs: len(addrs) == 2 and not any(leaving in a for a in addrs),
    )
    result = call(world.lab.host("b/0"), world, punch=False)
    assert result["connected"], result
    assert result["first_kind"] == "relayed"
