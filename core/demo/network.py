"""``moehome demo``: a local swarm on 127.0.0.1, every peer its own process.

Shows the networking layer at work: peers join through a bootstrap peer, signed records
are stored and found again from other peers, and RPCs measure round trips and upload
speed. (The training demo of the full system builds on this.)
"""

from __future__ import annotations

import logging
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from net import DhtConfig, Identity, Peer, PeerConfig, RpcError, Tensor, parse_peer_addr
from net.peer import PING

log = logging.getLogger(__name__)
_START_TIMEOUT_S = 30.0


def peer_command(bootstrap: list[str]) -> list[str]:
    """The command line of one demo peer (a separate Python process)."""
    cmd = [sys.executable, "-m", "core.cli", "--quiet", "peer", "--ephemeral"]
    for addr in bootstrap:
        cmd += ["--bootstrap", addr]
    return cmd


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()


async def _start_peer(procs: list[subprocess.Popen[str]], bootstrap: list[str]) -> str:
    # Popen returns at once (it does not wait for the child); readline runs in a thread.
    proc = subprocess.Popen(peer_command(bootstrap), stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    procs.append(proc)
    assert proc.stdout is not None
    with trio.fail_after(_START_TIMEOUT_S):
        line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
    if not line:
        raise RuntimeError(f"a demo peer exited with code {proc.wait()} before it listened")
    return line.strip()


async def run_demo(peers: int, gets: int) -> None:
    console = Console()
    console.print(
        f"[bold]moehome demo[/]: a swarm of {peers} peers on 127.0.0.1, each its own process"
    )
    with _processes() as procs:
        addrs: list[str] = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("starting peers", total=peers)
            for _ in range(peers):
                bootstrap = random.sample(addrs, min(2, len(addrs)))
                addrs.append(await _start_peer(procs, bootstrap))
                progress.advance(task)

        me = Identity.generate()
        config = PeerConfig(bootstrap=tuple(addrs[:3]), dht=DhtConfig())
        async with trio.open_nursery() as nursery:
            peer: Peer = await nursery.start(Peer(me, config).run)
            await _show(console, peer, addrs, gets)
            nursery.cancel_scope.cancel()


async def _show(console: Console, peer: Peer, addrs: list[str], gets: int) -> None:
    table = Table(title="peers", show_lines=False)
    table.add_column("peer id")
    table.add_column("address")
    table.add_column("ping ms (median of 20)", justify="right")
    for addr in addrs:
        info = parse_peer_addr(addr)
        rtts = []
        try:
            for _ in range(20):
                t0 = time.perf_counter()
                await peer.rpc.call(info.peer_id, PING, timeout=5)
                rtts.append((time.perf_counter() - t0) * 1000)
            rtt = f"{statistics.median(rtts):.2f}"
        except RpcError as exc:
            rtt = f"failed: {exc}"
        table.add_row(str(info.peer_id)[-12:], addr.split("/p2p/")[0], rtt)
    console.print(table)

    # upload speed to one peer
    target = parse_peer_addr(addrs[0]).peer_id
    blob = bytearray(16 * 1024 * 1024)
    t0 = time.perf_counter()
    await peer.rpc.call(target, PING, tensors=[Tensor("uint8", (len(blob),), blob)], timeout=60)
    upload = len(blob) / (time.perf_counter() - t0) / 1e6

    # records: put some, read them back from fresh lookups
    keys = [f"/moehome/demo/record-{i}" for i in range(10)]
    replicas = [await peer.dht.put(k, f"hello {i}".encode(), ttl=120) for i, k in enumerate(keys)]
    latencies, hits = [], 0
    for _ in range(gets):
        i = random.randrange(len(keys))
        t0 = time.perf_counter()
        records = await peer.dht.get(keys[i])
        latencies.append((time.perf_counter() - t0) * 1000)
        hits += any(r.value == f"hello {i}".encode() for r in records)
    latencies.sort()
    console.print(
        f"DHT: {len(keys)} signed records stored on {min(replicas)}-{max(replicas)} peers each; "
        f"{gets} lookups: median {statistics.median(latencies):.1f} ms, "
        f"p90 {latencies[int(0.9 * (len(latencies) - 1))]:.1f} ms, found {hits}/{gets}"
    )
    console.print(
        f"RPC: 16 MiB upload to one peer at {upload:.0f} MB/s; "
        f"routing table: {len(peer.dht.routing)} peers"
    )
