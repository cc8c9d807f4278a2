"""Peers in separate OS processes: `moehome peer` processes, a test-process peer, and a
`moehome dht get` process that reads what the test process wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from net import Identity, Peer, PeerConfig, Tensor, parse_peer_addr
from net.peer import PING
from tests.child_processes import stop_processes

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "core.cli", "--quiet"]


def start_peer(bootstrap: list[str]) -> tuple[subprocess.Popen[str], str]:
    cmd = [*CLI, "peer", "--ephemeral"]
    for addr in bootstrap:
        cmd += ["--bootstrap", addr]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    # on every interface by default: this computer's first address other than loopback
    assert line.startswith("/ip4/"), line
    assert "/tcp/" in line, line
    return proc, line


@pytest.mark.slow
async def test_peers_in_separate_processes():
    procs = []
    try:
        p1, addr1 = start_peer([])
        procs.append(p1)
        p2, addr2 = start_peer([addr1])
        procs.append(p2)
        async with trio.open_nursery() as nursery:
            me: Peer = await nursery.start(
                Peer(Identity.generate(), PeerConfig(bootstrap=(addr2,))).run
            )
            # RPC across processes, with a payload
            for addr in (addr1, addr2):
                reply = await me.rpc.call(
                    parse_peer_addr(addr).peer_id,
                    PING,
                    tensors=[Tensor("uint8", (1 << 20,), bytes(1 << 20))],
                )
                assert reply.meta == {"bytes": 1 << 20}
            assert (
                await me.dht.put("/moehome/demo/cross-process", b"hello from the test", ttl=120)
                >= 2
            )

            # a third process, joining through the first, reads the record
            result = await trio.run_process(
                [*CLI, "dht", "get", "/moehome/demo/cross-process", "--bootstrap", addr1, "--json"],
                capture_stdout=True,
                cwd=ROOT,
            )
            records = json.loads(result.stdout)
            assert [(r["value"], r["author"]) for r in records] == [
                ("hello from the test", str(me.host.peer_id))
            ]
            nursery.cancel_scope.cancel()
    finally:
        stop_processes(procs)
