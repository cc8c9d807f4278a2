"""RPC and DHT figures beside plain trio TCP, measured in the same run.

    python benchmarks/net_rpc.py [--quick]

Prints one JSON line. The server side (our RPC peer, and a plain TCP server speaking a
minimal length-prefixed protocol) runs in a second process, as a remote peer would; the
client measures both the same way: upload N bytes and wait for a small acknowledgement
(``*_mb_s_*``), download N bytes (``*_down_mb_s_*``), and 64-byte round trips. The DHT part
runs 32 peers in this process and times ``get`` of records written by random peers.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import struct
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from net import Identity, Peer, PeerConfig, Reply, Tensor, parse_peer_addr
from net.rpc import CallContext
from net.testing import open_swarm

log = logging.getLogger("benchmarks.net_rpc")
MiB = 1024 * 1024
SIZES_MIB = (1, 16, 64)
_TCP_HEADER = struct.Struct(">cQ")


# ------------------------------------------------------------------ server process


async def _serve() -> None:
    async def sink(ctx: CallContext) -> Reply:
        return Reply({"bytes": sum(t.nbytes for t in ctx.request.tensors)})

    async def source(ctx: CallContext) -> Reply:
        n = int(ctx.request.meta["bytes"])
        return Reply({}, (Tensor("uint8", (n,), bytearray(n)),))

    async def small(ctx: CallContext) -> Reply:
        return Reply({}, ctx.request.tensors)

    async def tcp_handler(stream: trio.SocketStream) -> None:
        buf = bytearray(MiB)
        try:
            while True:
                header = await _recv_exact(stream, _TCP_HEADER.size, buf)
                if header is None:
                    return
                op, n = _TCP_HEADER.unpack(header)
                if op == b"U":
                    left = n
                    while left:
                        chunk = await stream.receive_some(min(left, MiB))
                        if not chunk:
                            return
                        left -= len(chunk)
                    await stream.send_all(struct.pack(">Q", n))
                elif op == b"D":
                    view = memoryview(bytearray(n))
                    for i in range(0, n, MiB):
                        await stream.send_all(view[i : i + MiB])
                else:  # ping: echo n bytes
                    data = await _recv_exact(stream, n, buf)
                    await stream.send_all(data or b"")
        except trio.BrokenResourceError:
            return

    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(Identity.generate()).run)
        peer.rpc.register("bench.sink", sink)
        peer.rpc.register("bench.source", source)
        peer.rpc.register("bench.small", small)
        listeners = await nursery.start(partial(trio.serve_tcp, tcp_handler, 0, host="127.0.0.1"))
        tcp_port = listeners[0].socket.getsockname()[1]
        sys.stdout.write(json.dumps({"rpc": peer.addrs()[0], "tcp": tcp_port}) + "\n")
        sys.stdout.flush()
        await trio.sleep_forever()


async def _recv_exact(stream: trio.SocketStream, n: int, _buf: bytearray) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        chunk = await stream.receive_some(n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


# ------------------------------------------------------------------ client side


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _bench_rpc(peer: Peer, addr: str, repeats: int, small_calls: int) -> dict[str, float]:
    target = parse_peer_addr(addr).peer_id
    await peer.host.connect_addr(addr)
    out: dict[str, float] = {}
    warm = bytearray(16 * MiB)  # let Yamux grow its window and the stream pool fill
    await peer.rpc.call(target, "bench.sink", tensors=[Tensor("uint8", (len(warm),), warm)])
    for size in SIZES_MIB:
        n = size * MiB
        payload = bytearray(n)
        up, down = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            blob = Tensor("uint8", (n,), payload)
            await peer.rpc.call(target, "bench.sink", tensors=[blob], timeout=120)
            up.append(n / (time.perf_counter() - t0) / 1e6)
            t0 = time.perf_counter()
            reply = await peer.rpc.call(target, "bench.source", {"bytes": n}, timeout=120)
            assert reply.tensors[0].nbytes == n
            down.append(n / (time.perf_counter() - t0) / 1e6)
        out[f"rpc_mb_s_{size}mib"] = round(statistics.median(up), 1)
        out[f"rpc_down_mb_s_{size}mib"] = round(statistics.median(down), 1)
    ping = Tensor("uint8", (64,), bytes(64))
    lat = []
    for _ in range(small_calls):
        t0 = time.perf_counter()
        await peer.rpc.call(target, "bench.small", tensors=[ping])
        lat.append((time.perf_counter() - t0) * 1000)
    out["rpc_small_ms_median"] = round(statistics.median(lat), 3)
    out["rpc_small_ms_p99"] = round(_pct(lat, 0.99), 3)
    return out


async def _bench_tcp(port: int, repeats: int, small_calls: int) -> dict[str, float]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out: dict[str, float] = {}
    buf = bytearray(MiB)
    async with stream:
        for size in SIZES_MIB:
            n = size * MiB
            view = memoryview(bytearray(n))
            up, down = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                await stream.send_all(_TCP_HEADER.pack(b"U", n))
                for i in range(0, n, MiB):
                    await stream.send_all(view[i : i + MiB])
                await _recv_exact(stream, 8, buf)
                up.append(n / (time.perf_counter() - t0) / 1e6)
                t0 = time.perf_counter()
                await stream.send_all(_TCP_HEADER.pack(b"D", n))
                got = 0
                while got < n:
                    got += len(await stream.receive_some(min(n - got, MiB)))
                down.append(n / (time.perf_counter() - t0) / 1e6)
            out[f"tcp_mb_s_{size}mib"] = round(statistics.median(up), 1)
            out[f"tcp_down_mb_s_{size}mib"] = round(statistics.median(down), 1)
        lat = []
        for _ in range(small_calls):
            t0 = time.perf_counter()
            await stream.send_all(_TCP_HEADER.pack(b"P", 64) + bytes(64))
            await _recv_exact(stream, 64, buf)
            lat.append((time.perf_counter() - t0) * 1000)
        out["tcp_small_ms_median"] = round(statistics.median(lat), 3)
        out["tcp_small_ms_p99"] = round(_pct(lat, 0.99), 3)
    return out


async def _bench_dht(n_peers: int, n_keys: int, n_gets: int) -> dict[str, float]:
    t_start = time.perf_counter()
    async with open_swarm(n_peers) as swarm:
        bootstrap_s = time.perf_counter() - t_start
        keys = {}
        put_lat = []
        for i in range(n_keys):
            writer = random.choice(swarm.peers)
            key = f"/moehome/demo/bench-{i}"
            t0 = time.perf_counter()
            await writer.dht.put(key, f"value-{i}".encode(), ttl=600)
            put_lat.append((time.perf_counter() - t0) * 1000)
            keys[key] = f"value-{i}".encode()
        lat, ok = [], 0
        names = list(keys)
        for _ in range(n_gets):
            key = random.choice(names)
            reader = random.choice(swarm.peers)
            t0 = time.perf_counter()
            records = await reader.dht.get(key)
            lat.append((time.perf_counter() - t0) * 1000)
            ok += any(r.value == keys[key] for r in records)
        # churn: a quarter of the peers leave at once, with no time to hand over records
        for peer in random.sample(swarm.peers[1:], n_peers // 4):
            swarm.stop(peer)
        await trio.sleep(0.5)
        churn_lat, churn_ok = [], 0
        for _ in range(n_gets // 2):
            key = random.choice(names)
            reader = random.choice(swarm.running())
            t0 = time.perf_counter()
            records = await reader.dht.get(key)
            churn_lat.append((time.perf_counter() - t0) * 1000)
            churn_ok += any(r.value == keys[key] for r in records)
        return {
            "dht_peers": n_peers,
            "dht_bootstrap_s": round(bootstrap_s, 2),
            "dht_put_ms_median": round(statistics.median(put_lat), 2),
            "dht_gets": n_gets,
            "dht_get_ms_median": round(statistics.median(lat), 2),
            "dht_get_ms_p90": round(_pct(lat, 0.9), 2),
            "dht_get_success": round(ok / n_gets, 4),
            "dht_churn_left": n_peers // 4,
            "dht_churn_get_ms_median": round(statistics.median(churn_lat), 2),
            "dht_churn_get_success": round(churn_ok / len(churn_lat), 4),
        }


async def _client(args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "net_rpc",
        "server": "separate process",
        "repeats": args.repeats,
    }
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(Peer(Identity.generate(), PeerConfig()).run)
        result.update(await _bench_rpc(peer, where["rpc"], args.repeats, args.small_calls))
        nursery.cancel_scope.cancel()
    result.update(await _bench_tcp(where["tcp"], args.repeats, args.small_calls))
    ratio = result["rpc_mb_s_64mib"] / result["tcp_mb_s_64mib"]
    result["rpc_vs_tcp_64mib"] = round(ratio, 4)
    result.update(await _bench_dht(args.dht_peers, args.dht_keys, args.dht_gets))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small-calls", type=int, default=2000)
    parser.add_argument("--dht-peers", type=int, default=32)
    parser.add_argument("--dht-keys", type=int, default=64)
    parser.add_argument("--dht-gets", type=int, default=500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.serve:
        trio.run(_serve)
        return
    if args.quick:
        args.repeats, args.small_calls, args.dht_peers, args.dht_keys, args.dht_gets = (
            1,
            100,
            8,
            8,
            40,
        )
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        where = json.loads(server.stdout.readline())  # the server's addresses
        result = trio.run(_client, args, where)
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
