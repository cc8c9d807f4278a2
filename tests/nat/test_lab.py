"""The network lab behaves like the internet it stands for: NAT hides home machines,
keeps or randomizes ports, lets a simultaneous open through (or not), and cleans up."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from core.forkserver import ForkServer
from net.testing.lab import Home, LabError, network_lab, remove_stale
from tests.child_processes import stop_processes
from tests.nat.probes import ask, punch, start_echo


def namespace_pids(namespace: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return out.stdout.split()


def lab_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.startswith("mhlab")}


def test_home_machines_reach_out_behind_their_router_and_cannot_be_reached():
    with network_lab(["server"], [Home("a", 2), Home("b", 1, nat="symmetric")]) as lab:
        server = lab.host("server")
        echo = start_echo(server, 7000)
        try:
            # a cone NAT keeps the inside port when it is free; a second machine asking
            # from the same port gets another one
            assert ask(lab.host("a/0"), server.ip, 7000, 4001) == f"{lab.public_ip_of('a')} 4001"
            seen_ip, seen_port = ask(lab.host("a/1"), server.ip, 7000, 4001).split()
            assert seen_ip == lab.public_ip_of("a")
            assert seen_port != "4001"
            # a symmetric NAT picks a random port
            seen_ip, seen_port = ask(lab.host("b/0"), server.ip, 7000, 4001).split()
            assert seen_ip == lab.public_ip_of("b")
            assert seen_port != "4001"
        finally:
            stop_processes([echo])
        # nobody outside reaches a home machine: neither its own address nor its router's;
        # a machine of the same home does, at its own address
        home_echo = start_echo(lab.host("a/0"), 4002)
        try:
            assert ask(server, lab.host("a/0").ip, 4002).startswith("unreachable")
            assert ask(server, lab.public_ip_of("a"), 4002).startswith("unreachable")
            seen = ask(lab.host("a/1"), lab.host("a/0").ip, 4002, 4005)
            assert seen == f"{lab.host('a/1').ip} 4005"  # no NAT inside the home
        finally:
            stop_processes([home_echo])


@pytest.mark.parametrize(("nat", "expected"), [("cone", "connected"), ("symmetric", "failed")])
def test_a_simultaneous_open_crosses_two_cone_nats_and_not_a_symmetric_one(nat, expected):
    with network_lab([], [Home("a"), Home("b", nat=nat)]) as lab:
        at = time.time() + 0.5
        a = punch(lab.host("a/0"), lab.public_ip_of("b"), 4001, 4001, at)
        b = punch(lab.host("b/0"), lab.public_ip_of("a"), 4001, 4001, at)
        try:
            outcomes = {p.communicate(timeout=30)[0].split()[0] for p in (a, b)}
        finally:
            stop_processes([a, b])
        assert outcomes == {expected}


def test_a_home_line_can_be_cut_renumbered_and_rate_limited():
    with network_lab(["server"], [Home("a", uplink_mbit=20)]) as lab:
        server, home = lab.host("server"), lab.host("a/0")
        qdiscs = subprocess.run(
            ["ip", "netns", "exec", lab.router_namespace("a"), "tc", "qdisc", "show", "dev", "wan"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "tbf" in qdiscs
        assert "20Mbit" in qdiscs
        echo = start_echo(server, 7000)
        try:
            before = lab.public_ip_of("a")
            assert ask(home, server.ip, 7000).split()[0] == before
            lab.cut("a")
            assert ask(home, server.ip, 7000).startswith("unreachable")
            lab.restore("a")
            assert ask(home, server.ip, 7000).split()[0] == before
            after = lab.renumber("a")
            assert after != before
            assert ask(home, server.ip, 7000).split()[0] == after
        finally:
            stop_processes([echo])
        lab.set_uplink("a", None)


def test_the_lab_is_removed_when_its_body_fails_and_stale_labs_are_swept():
    before = lab_namespaces()
    started: list[subprocess.Popen[bytes]] = []

    def failing_body() -> None:
        with network_lab(["server"], [Home("a")]) as lab:
            host = lab.host("a/0")
            started.append(subprocess.Popen(host.command(["sleep", "600"])))
            # running inside once `ip netns exec` has entered the namespace (it then
            # execs sleep, same pid): before that, nothing of it is in there to kill
            deadline = time.monotonic() + 30
            while str(started[0].pid) not in namespace_pids(host.namespace):
                assert time.monotonic() < deadline, "sleep never ran in the namespace"
                time.sleep(0.05)
            raise RuntimeError("the body failed")

    with pytest.raises(RuntimeError, match="the body failed"):
        failing_body()
    assert started[0].wait(timeout=10) != 0  # what ran inside was killed with the lab
    assert lab_namespaces() == before

    # a lab whose process died without cleaning up (kill -9) is swept by the next one;
    # a pid past the kernel's largest is certainly not running
    with open("/proc/sys/kernel/pid_max") as f:
        gone = int(f.read()) + 1
    stale = f"mhlab{gone}-1-inet"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in remove_stale()
    assert stale not in lab_namespaces()


def test_home_names_are_checked():
    with pytest.raises(LabError, match="unique"), network_lab([], [Home("a"), Home("a")]):
        pass


def test_the_demos_fork_server_puts_a_child_in_a_lab_hosts_namespace(tmp_path: Path) -> None:
    # the demo with --nat forks its processes into the lab's hosts as `ip netns exec` would
    root = Path(__file__).resolve().parents[2]
    with network_lab(["server"], [Home("a", 1)]) as lab:
        namespace = lab.host("a/0").namespace
        server = ForkServer(tmp_path / "server-log.txt", preload=())
        try:
            with open(tmp_path / "child-log.txt", "a") as log:
                child = server.start(
                    ["exit", "0"],
                    env=dict(os.environ),
                    stderr=log,
                    cwd=root,
                    module="tests.forkserver_probe",
                    netns=namespace,
                )
            assert child.stdout is not None
            seen = json.loads(child.stdout.readline())
            assert child.wait(timeout=30) == 0
            child.stdout.close()
        finally:
            server.close()
        inode = os.stat(f"/run/netns/{namespace}").st_ino
        assert seen["network_namespace"] == f"net:[{inode}]"
        assert seen["network_namespace"] != os.readlink("/proc/self/ns/net")
