"""Run inside a lab namespace: dial a peer at the addresses given, say how the
connection was made, how long the first answer took, whether hole punching made it
direct, and how fast bytes went.

    python -m tests.nat.caller PEER_ID ADDR [ADDR ...] [--bytes N]
        [--bootstrap ADDR ...] [--direct-within S]

With --bootstrap, the caller first learns where the internet sees it (reachability),
which hole punching needs. Prints one JSON line: {"connected", "first_kind",
"first_answer_s", "direct_after_s", "final_kind", "mb_s", "error"}. A real peer
(net.Peer) does the work; only the driving is a script.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import trio
from libp2p.connection_types import ConnectionType

from net import Identity, Peer, PeerConfig
from net._libp2p import PeerID
from net.peer import PING
from net.reach.reachability import Reachability, ReachabilityConfig
from net.rpc import RpcError
from net.rpc.frames import Tensor
from net.transport.host import DialError


def _chain(exc: BaseException | None) -> list[str]:
    """The error and its causes, type and message each (a bare message can be empty)."""
    out: list[str] = []
    while exc is not None and len(out) < 6:
        out.append(f"{type(exc).__name__}: {exc}"[:200])
        exc = exc.__cause__ or exc.__context__
    return out


def _connections(peer: Peer, other: PeerID) -> list[str]:
    conns = peer.host.libp2p_host.get_network().connections.get(other, [])
    return [
        f"{c.get_connection_type().name} closed={c.is_closed} muxer_closed={c.muxed_conn.is_closed}"
        f" streams={len(c.get_streams())}"
        for c in conns
    ]


def kinds(peer: Peer, other: PeerID) -> set[str]:
    conns = peer.host.libp2p_host.get_network().connections.get(other, [])
    return {
        "relayed" if c.get_connection_type() == ConnectionType.RELAYED else "direct"
        for c in conns
        if not c.is_closed
    }


async def call(args: argparse.Namespace) -> dict[str, object]:
    config = PeerConfig(
        listen=("/ip4/0.0.0.0/tcp/4001",),
        bootstrap=tuple(args.bootstrap),
        reachability=ReachabilityConfig(unknown_recheck_s=1) if args.bootstrap else None,
    )
    peer = Peer(Identity.generate(), config)
    out: dict[str, object] = {"connected": False}
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.run)
        monitor = peer.reachability
        if monitor is not None:
            with trio.move_on_after(30):
                while monitor.verdict.reachability is Reachability.UNKNOWN:
                    await trio.sleep(0.1)
            out["reachability"] = monitor.verdict.reachability.value
        target = PeerID.from_base58(args.peer)
        started = time.monotonic()
        try:
            # only the addresses given: nothing learned elsewhere helps
            out["already_connected"] = peer.host.is_connected(target)
            await peer.host.connect(target, args.addrs, timeout=30)
            out["connect_s"] = round(time.monotonic() - started, 3)
            await peer.rpc.call(target, PING, {}, timeout=30)
            answered = time.monotonic()
            out["first_answer_s"] = round(answered - started, 3)
            out["connected"] = True
            out["first_kind"] = "relayed" if kinds(peer, target) == {"relayed"} else "direct"
            with trio.move_on_after(args.direct_within):
                while "direct" not in kinds(peer, target):
                    await trio.sleep(0.05)
                out["direct_after_s"] = round(time.monotonic() - answered, 3)
                # the relayed connection is closed after a grace period
                while "relayed" in kinds(peer, target):
                    await trio.sleep(0.1)
            out["final_kind"] = "direct" if "direct" in kinds(peer, target) else "relayed"
            if args.bytes:
                payload = [Tensor("uint8", (args.bytes,), bytes(args.bytes))]
                t0 = time.monotonic()
                await peer.rpc.call(target, PING, {}, payload, timeout=120)
                out["mb_s"] = round(args.bytes / 1e6 / (time.monotonic() - t0), 3)
        except (DialError, RpcError) as exc:
            out["error"] = str(exc)[:300]
            out["error_chain"] = _chain(exc)
            out["connections_then"] = _connections(peer, target)
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer")
    parser.add_argument("addrs", nargs="+")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--direct-within", type=float, default=0.0)
    args = parser.parse_args()
    result = trio.run(call, args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
