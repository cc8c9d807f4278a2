"""Baseline measurement of py-libp2p 0.8.1's built-in Kademlia DHT (KadDHT).

One trio process, N hosts on 127.0.0.1 (TCP + Noise + Yamux, with
``max_connections_per_peer=1`` to avoid the 250 ms happy-eyeballs dial delay),
each running ``KadDHT`` in SERVER mode with a permissive ``/moehome/``
validator namespace.

Phases (all bounded by trio timeouts; the whole run aborts after --deadline s
and still prints the JSON line):

  1. bootstrap: every host i>0 dials host 0 and up to 2 random earlier hosts,
     adds them to its routing table, then ``refresh_routing_table()`` is run
     serially on every host (host 0 last).
  2. puts: --keys puts of distinct keys ``/moehome/k<i>`` from random hosts.
  3. gets: one get per key from a random other host, after removing the
     getter's local copy (``dht.value_store.remove``) so the get goes to the
     network. Default ``quorum=0`` as an application would call it.
  3b. (extra) --q1-gets gets with ``quorum=1`` (stops at the first valid record).
  4. churn: stop --churn random non-bootstrap hosts (their ``host.run`` and DHT
     service contexts exit normally), then --churn-gets gets of earlier keys
     from random survivors.

Final output: one JSON line on stdout.  Progress goes to logging (stderr).

    /work/main/.venv/bin/python benchmarks/kaddht_baseline.py [--peers 32] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger("kaddht_baseline")
NAMESPACE = "moehome"
CLOSE_TIMEOUT = 15.0  # bound on one host.close()


class AcceptAllValidator(Validator):
    """Accepts any value; select() always picks the first candidate."""

    def validate(self, key: str, value: bytes) -> None:
        if not key.startswith(f"/{NAMESPACE}/"):
            raise ValueError(f"bad key {key!r}")

    def select(self, key: str, values: list[bytes]) -> int:
        return 0


class LibLogCounter(logging.Handler):
    """Counts libp2p WARNING+ records (the library logs many benign ones)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.by_level: collections.Counter[str] = collections.Counter()
        self.by_msg: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.by_level[record.levelname] += 1
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        # Strip peer ids / details: keep the leading words only.
        self.by_msg[f"{record.levelname}: {msg[:90]}"] += 1
        if "timed out" in msg and "timed out" not in msg[:90]:
            self.by_msg[f"{record.levelname}: ...timed out"] += 1


class Node:
    def __init__(self, idx: int, seed: bytes, explicit_close: bool = True) -> None:
        self.idx = idx
        self.explicit_close = explicit_close
        self.host = new_host(
            key_pair=create_new_key_pair(seed),
            connection_config=ConnectionConfig(max_connections_per_peer=1),
        )
        self.dht = KadDHT(self.host, DHTMode.SERVER)
        self.dht.register_validator(NAMESPACE, AcceptAllValidator())
        self.ready = trio.Event()
        self.stop = trio.Event()
        self.done = trio.Event()
        self.addr: multiaddr.Multiaddr | None = None
        self.close_s: float | None = None
        self.close_timed_out = False

    async def run(self) -> None:
        try:
            async with self.host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                async with background_trio_service(self.dht):
                    self.addr = self.host.get_addrs()[0]
                    self.ready.set()
                    await self.stop.wait()
                if self.explicit_close:
                    # Without this, leaving host.run() does NOT close the TCP
                    # connections: Swarm.run's cleanup (network/swarm.py
                    # ~L419-447) runs after the service manager was cancelled,
                    # so its `await conn.close()` is cancelled immediately.
                    # Remote peers then keep a zombie connection and every
                    # new_stream to this peer hangs ~10 s.
                    tc = time.perf_counter()
                    with trio.move_on_after(CLOSE_TIMEOUT) as cs:
                        await self.host.close()
                    self.close_s = time.perf_counter() - tc
                    self.close_timed_out = cs.cancelled_caught
        finally:
            self.ready.set()
            self.done.set()

    @property
    def alive(self) -> bool:
        return not self.stop.is_set()


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 1)


def med(xs: Sequence[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


async def timed_get(
    node: Node,
    key: str,
    expected: bytes,
    timeout: float,
    quorum: int,
    errors: collections.Counter[str],
) -> tuple[bool, float, bool]:
    """Return (correct, ms, had_local_copy_removed)."""
    kb = key.encode()
    removed = node.dht.value_store.remove(kb)
    assert node.dht.value_store.get(kb) is None
    t0 = time.perf_counter()
    val = None
    with trio.move_on_after(timeout) as cs:
        try:
            val = await node.dht.get_value(key, quorum=quorum)
        except Exception as e:  # noqa: BLE001 - we count every failure kind
            errors[f"get:{type(e).__name__}"] += 1
    ms = (time.perf_counter() - t0) * 1000
    if cs.cancelled_caught:
        errors["get:timeout"] += 1
    elif val is None:
        errors["get:not_found"] += 1
    elif val != expected:
        errors["get:wrong_value"] += 1
    return (val == expected), ms, removed


def holders(nodes: list[Node], key: str) -> int:
    kb = key.encode()
    return sum(1 for n in nodes if n.alive and kb in n.dht.value_store.store)


async def bench(args: argparse.Namespace, res: dict[str, Any]) -> None:
    rng = random.Random(args.seed)
    errors: collections.Counter[str] = collections.Counter()
    res["errors"] = errors
    nodes = [Node(i, rng.randbytes(32), args.stop_mode == "close") for i in range(args.peers)]
    res["stop_mode"] = args.stop_mode
    res["peers"] = len(nodes)

    async with trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        for n in nodes:
            nursery.start_soon(n.run)
        with trio.fail_after(30):
            for n in nodes:
                await n.ready.wait()
        if not all(n.addr for n in nodes):
            raise RuntimeError("some hosts failed to start")
        res["start_s"] = round(time.perf_counter() - t0, 2)
        log.info("%d hosts listening in %.2fs", len(nodes), res["start_s"])

        try:
            await run_phases(args, rng, nodes, res, errors)
        finally:
            t_stop = time.perf_counter()
            for n in nodes:
                n.stop.set()
            with trio.move_on_after(CLOSE_TIMEOUT + 15) as cs:
                for n in nodes:
                    await n.done.wait()
            res["shutdown_s"] = round(time.perf_counter() - t_stop, 2)
            if cs.cancelled_caught:
                errors["shutdown:timeout"] += 1
                nursery.cancel_scope.cancel()


async def run_phases(
    args: argparse.Namespace,
    rng: random.Random,
    nodes: list[Node],
    res: dict[str, Any],
    errors: collections.Counter[str],
) -> None:
    # ---------------- bootstrap ----------------
    res["phase"] = "bootstrap"
    t0 = time.perf_counter()
    connect_ms: list[float] = []
    for n in nodes[1:]:
        targets = [0, *rng.sample(range(1, n.idx), min(2, n.idx - 1))]
        for j in targets:
            info = info_from_p2p_addr(nodes[j].addr)
            tc = time.perf_counter()
            try:
                with trio.fail_after(10):
                    await n.host.connect(info)
                connect_ms.append((time.perf_counter() - tc) * 1000)
                await n.dht.add_peer(info.peer_id)
            except Exception as e:  # noqa: BLE001
                errors[f"connect:{type(e).__name__}"] += 1
    res["connect_s"] = round(time.perf_counter() - t0, 2)
    res["connect_ms_median"] = med(connect_ms)
    log.info(
        "connected in %.2fs (median dial %.1f ms)", res["connect_s"], res["connect_ms_median"] or -1
    )

    t1 = time.perf_counter()
    refresh_ms: list[float] = []
    for n in nodes[1:] + nodes[:1]:
        tr = time.perf_counter()
        with trio.move_on_after(args.refresh_timeout) as cs:
            try:
                await n.dht.refresh_routing_table()
            except Exception as e:  # noqa: BLE001
                errors[f"refresh:{type(e).__name__}"] += 1
        if cs.cancelled_caught:
            errors["refresh:timeout"] += 1
        refresh_ms.append((time.perf_counter() - tr) * 1000)
    res["refresh_s"] = round(time.perf_counter() - t1, 2)
    res["refresh_ms_median"] = med(refresh_ms)
    res["bootstrap_s"] = round(time.perf_counter() - t0, 2)
    rt = [n.dht.get_routing_table_size() for n in nodes]
    res["rt_size_min"], res["rt_size_median"], res["rt_size_max"] = min(rt), med(rt), max(rt)
    res["conns_per_host_median"] = med([len(n.host.get_connected_peers()) for n in nodes])
    log.info(
        "bootstrap %.2fs (refresh %.2fs); routing table sizes min/med/max %s/%s/%s",
        res["bootstrap_s"],
        res["refresh_s"],
        *rt_stats(rt),
    )

    # ---------------- puts ----------------
    res["phase"] = "put"
    keys: dict[str, tuple[bytes, int]] = {}
    put_ms: list[float] = []
    put_ok = 0
    for k in range(args.keys):
        key = f"/{NAMESPACE}/k{k}"
        value = f"value-{k}-{rng.getrandbits(64):016x}".encode()
        putter = rng.randrange(len(nodes))
        tp = time.perf_counter()
        with trio.move_on_after(args.op_timeout) as cs:
            try:
                await nodes[putter].dht.put_value(key, value)
                put_ok += 1
            except Exception as e:  # noqa: BLE001
                errors[f"put:{type(e).__name__}"] += 1
        if cs.cancelled_caught:
            errors["put:timeout"] += 1
        put_ms.append((time.perf_counter() - tp) * 1000)
        keys[key] = (value, putter)
    res["puts"] = len(put_ms)
    res["put_ok"] = put_ok
    res["put_ms_median"], res["put_ms_p90"], res["put_ms_max"] = (
        med(put_ms),
        pct(put_ms, 90),
        round(max(put_ms), 1),
    )
    rep = [holders(nodes, key) for key in keys]
    res["replicas_median"], res["replicas_min"] = med(rep), min(rep)
    res["keys_with_only_putter_copy"] = sum(1 for r in rep if r <= 1)
    log.info(
        "puts: median %.1f ms, replicas per key median %s min %s",
        res["put_ms_median"],
        res["replicas_median"],
        res["replicas_min"],
    )

    # ---------------- gets ----------------
    res["phase"] = "get"
    get_ms: list[float] = []
    ok = removed = 0
    for key, (value, putter) in keys.items():
        getter = rng.choice([i for i in range(len(nodes)) if i != putter])
        good, ms, rm = await timed_get(nodes[getter], key, value, args.op_timeout, 0, errors)
        ok += good
        removed += rm
        get_ms.append(ms)
    res["gets"] = len(get_ms)
    res["get_success"] = round(ok / len(get_ms), 3) if get_ms else None
    res["get_local_copies_removed"] = removed
    res["get_ms_median"], res["get_ms_p90"], res["get_ms_max"] = (
        med(get_ms),
        pct(get_ms, 90),
        round(max(get_ms), 1),
    )
    log.info(
        "gets: %d/%d ok, median %.1f ms p90 %.1f ms",
        ok,
        len(get_ms),
        res["get_ms_median"],
        res["get_ms_p90"],
    )

    # ---------------- extra: gets with quorum=1 ----------------
    if args.q1_gets:
        res["phase"] = "get_q1"
        q1_ms: list[float] = []
        ok = 0
        for key in rng.sample(list(keys), min(args.q1_gets, len(keys))):
            value, putter = keys[key]
            getter = rng.choice([i for i in range(len(nodes)) if i != putter])
            good, ms, _ = await timed_get(nodes[getter], key, value, args.op_timeout, 1, errors)
            ok += good
            q1_ms.append(ms)
        res["get_q1_success"] = round(ok / len(q1_ms), 3)
        res["get_q1_ms_median"], res["get_q1_ms_p90"] = med(q1_ms), pct(q1_ms, 90)
        log.info("gets quorum=1: %d/%d ok, median %.1f ms", ok, len(q1_ms), res["get_q1_ms_median"])

    # ---------------- churn ----------------
    res["phase"] = "churn"
    victims = rng.sample(range(1, len(nodes)), args.churn)
    tc = time.perf_counter()
    for v in victims:
        nodes[v].stop.set()
    with trio.move_on_after(CLOSE_TIMEOUT + 15) as cs:
        for v in victims:
            await nodes[v].done.wait()
    if cs.cancelled_caught:
        errors["churn:stop_timeout"] += 1
    res["churn_stopped"] = len(victims)
    closes = [c for v in victims if (c := nodes[v].close_s) is not None]
    res["churn_close_ms"] = sorted(round(c * 1000) for c in closes)
    res["churn_close_timeouts"] = sum(nodes[v].close_timed_out for v in victims)
    res["churn_stop_s"] = round(time.perf_counter() - tc, 2)
    await trio.sleep(args.settle)
    survivors = [n.idx for n in nodes if n.alive]
    dead_ids = {nodes[v].host.get_id() for v in victims}
    zombies = {
        i: sum(1 for p in nodes[i].host.get_connected_peers() if p in dead_ids) for i in survivors
    }
    # survivor -> number of stopped peers it still believes it is connected to
    res["churn_zombie_conns"] = sum(zombies.values())
    res["churn_hosts_with_zombies"] = sorted(i for i, z in zombies.items() if z)
    rep = [holders(nodes, key) for key in keys]
    res["churn_replicas_median"], res["churn_replicas_min"] = med(rep), min(rep)
    log.info(
        "stopped hosts %s in %.2fs; live replicas per key median %s min %s",
        sorted(victims),
        res["churn_stop_s"],
        res["churn_replicas_median"],
        res["churn_replicas_min"],
    )

    res["phase"] = "churn_get"
    c_ms: list[float] = []
    ok = 0
    klist = list(keys)
    for _ in range(args.churn_gets):
        key = rng.choice(klist)
        value, _putter = keys[key]
        getter = rng.choice(survivors)
        good, ms, _ = await timed_get(nodes[getter], key, value, args.op_timeout, 0, errors)
        ok += good
        c_ms.append(ms)
        if ms > 1000 or not good:
            log.info("slow/failed churn get: host %d key %s ok=%s %.0f ms", getter, key, good, ms)
    res["churn_gets"] = len(c_ms)
    res["churn_get_success"] = round(ok / len(c_ms), 3) if c_ms else None
    res["churn_get_ms_median"], res["churn_get_ms_p90"], res["churn_get_ms_max"] = (
        med(c_ms),
        pct(c_ms, 90),
        round(max(c_ms), 1),
    )
    log.info(
        "churn gets: %d/%d ok, median %.1f ms p90 %.1f ms",
        ok,
        len(c_ms),
        res["churn_get_ms_median"],
        res["churn_get_ms_p90"],
    )
    res["phase"] = "done"


def rt_stats(rt: list[int]) -> tuple[int, float | None, int]:
    return min(rt), med(rt), max(rt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", type=int, default=32)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--q1-gets", type=int, default=32, help="extra gets with quorum=1 (0 = skip)")
    ap.add_argument("--churn", type=int, default=8)
    ap.add_argument("--churn-gets", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--op-timeout", type=float, default=15.0, help="per put/get bound, s")
    ap.add_argument("--refresh-timeout", type=float, default=20.0, help="per refresh bound, s")
    ap.add_argument("--settle", type=float, default=1.0, help="pause after churn, s")
    ap.add_argument("--deadline", type=float, default=290.0, help="whole-run bound, s")
    ap.add_argument(
        "--stop-mode",
        choices=["close", "exit"],
        default="close",
        help="close: await host.close() before leaving host.run() (graceful leave); "
        "exit: only leave the contexts (leaves zombie connections, see Node.run)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # libp2p disables propagation and installs no handler at import; count its
    # warnings/errors instead of letting them hit the last-resort handler.
    lib = logging.getLogger("libp2p")
    counter = LibLogCounter()
    lib.addHandler(counter)
    lib.setLevel(logging.WARNING)
    lib.propagate = args.verbose

    res: dict[str, Any] = {"bench": "kaddht_baseline", "libp2p": "0.8.1", "seed": args.seed}
    t0 = time.perf_counter()

    async def runner() -> None:
        with trio.move_on_after(args.deadline) as cs:
            await bench(args, res)
        if cs.cancelled_caught:
            res["aborted_in_phase"] = res.get("phase")

    try:
        trio.run(runner)
    except BaseException as e:
        res["fatal"] = f"{type(e).__name__}: {e}"[:300]
        log.exception("benchmark failed")
    res["total_s"] = round(time.perf_counter() - t0, 2)
    res["errors"] = dict(res.get("errors") or {})
    res["libp2p_log_counts"] = dict(counter.by_level)
    res["libp2p_log_top"] = dict(counter.by_msg.most_common(6))
    # stream-open timeouts (zombie connections) show up as "... timed out after 10s"
    res["libp2p_timed_out_msgs"] = sum(c for m, c in counter.by_msg.items() if "timed out" in m)
    if res.get("phase") == "done":
        del res["phase"]
    print(json.dumps(res, sort_keys=False), flush=True)


if __name__ == "__main__":
    main()
