"""Strangers against a real node process (issue 14): each attack beside an honest caller
measured before, during and after it, in the same run.

    python benchmarks/hostile.py [--quick] [--attacks name,name,...]

Three processes, as on the internet: the *target* (a volunteer's expert server, its DHT,
and an aggregator, in one process; pinned to CPU 0), the *attacker* (its own process,
dialling from 127.0.0.2 and other loopback addresses, as a stranger comes from an
address of its own; CPU 1), and this one, the *honest caller* (127.0.0.1; CPU 1). For
each attack the honest caller makes the calls that attack threatens (a trainer's
forward and backward through a kept graph, a newcomer's first call, a DHT store and get,
a volunteer's contribution) before the attack, while it runs at full strength, and after
it stopped; the target's memory (RSS) is sampled every 20 ms.

Prints one JSON line: per attack, ``success`` (share of honest calls that succeeded) and
``median_ms`` for before / during / after, ``latency_ratio`` (during / before), the
target's ``rss_mb`` before and peak during, whether the target was still running, and
what the attacker did while measured (``actions_per_s`` started, the share
``refused_or_cut``, and ``in_progress``: streams or sockets it still held at the end).
Goals (issue 14): success 1.0 during every attack, latency ratio <= 3, no exit, memory
within the configured budgets (``budgets_mb``).

The second round (issue 35) adds, against the same target (which also relays for a
volunteer behind NAT, by assumption, and serves a small project's weights):
``poisoned_receipts`` (backward requests with receipts the stranger signed; the line
says how many such receipts the target's accumulators took: ``foreign_receipts``, 0 or
the volunteer's next contribution is refused and counted against it), ``connection_cap``
(8 addresses x 40 idle connections, past libp2p's 300), ``silent_providers`` (8 peers
announcing the project's weights and never answering; the honest call is a newcomer's
whole fetch), ``relay_squat`` (16 idle circuits from one address to the relayed
volunteer), ``relay_hog`` (6 circuits from one address pushing all they can; the honest
call is 128 KiB through the relay) and ``dht_amplifier`` (60 ``dht.find`` messages from
fresh identities naming 8 ports of a third party while 4 honest peers go about their
lookups; ``third_party_connections_per_message``, goal <= 1), ``manifest_bomb`` (a
validly signed manifest of 4096^4 x 64 experts on the attacker's own DHT node, looked up
by the target as a volunteer's node does when the tray opens an invite link, again and
again), ``quorum_framing`` (8 pairs of Sybil servers of the target's expert running the
same x1.05 cheat; the honest call is a trainer's audited answer where the trainer cannot
hold the weights, so answers are put to other servers and a dispute to the expert's
aggregator; the line says how many disputes the aggregator settled and how many Sybils
were excluded), ``reachability_lie`` (4 identities at one address answering the target's
dial-back requests "reached you, at 198.18.0.66" without dialling; the honest call is one
round of the target's reachability check, which must believe no such address) and
``holepunch_aim`` (circuits from one address to the volunteer behind NAT, punching as
side B with a third party's ports and answering its punches with them; the line says how
many connections the third party saw and how many times the attacker heard the
volunteer's address, both goal 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import multiaddr
import psutil
import torch
import trio
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.contributing.codecs import codec
from core.demo.cheats import ANSWER_CHEATS
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.experts.wire import from_wire, to_wire
from core.moe.answer_checks import Answer
from core.moe.audit import AnswerAuditor
from core.moe.client import ExpertCaller, ExpertServerRef
from core.namespaces import moehome_validator
from core.node.serving import project_summary
from core.project import records as project_records
from core.project.chunks import ChunkStore
from core.project.distribution import (
    GET_CHUNK,
    ProjectNotFound,
    WeightsFetcher,
    find_manifest,
    list_projects,
)
from core.project.keys import OwnerKey
from core.project.manifest import load_manifest
from core.project.pins import PinStore
from core.project.publish import prepare, serve_project
from core.project.records import ProviderAnnouncement, providers_key
from core.project.signed import SignedManifest, canonical, project_id
from core.project.template import write_template
from core.protocol.aggregator_methods import CONTRIBUTE
from core.protocol.contributions import Contribution, ParamSpec, Receipt
from core.protocol.expert_methods import BACKWARD, FORWARD
from net import (
    CallContext,
    DialError,
    Identity,
    NamespacedValidator,
    Peer,
    PeerConfig,
    RemoteError,
    Reply,
    RpcService,
    SwarmHost,
    parse_peer_addr,
)
from net._libp2p import PeerID
from net.codec import pack
from net.dht import sign_record
from net.dht.node import FIND, GET, STORE, DhtError
from net.peer import PING
from net.reach.circuit import read_message, write_message
from net.reach.holepunch import PROTOCOL as HOLE_PUNCH
from net.reach.reachability import (
    DIAL_BACK,
    DialBackService,
    ReachabilityConfig,
    ReachabilityMonitor,
)
from net.reach.relay import RelayService
from net.reach.relay_client import RelayClient, RelayClientConfig
from net.rpc import RPC_PROTOCOL, RpcConfig, RpcError
from net.rpc.frames import Tensor
from net.testing import count_connections, dial_from, raw_frame

log = logging.getLogger("benchmarks.hostile")
MiB = 1024 * 1024
SPEC = ExpertSpec("ffn", hidden=256, inner=1024)
UID = "ffn.0.0"
PROJECT = "bench"
TRAINER = Identity.from_seed(b"hostile-benchmark-trainer".ljust(32, b"."))
VOLUNTEER = Identity.from_seed(b"hostile-benchmark-volunteer".ljust(32, b"."))
RPC_BUDGET = 1024 * MiB  # RpcConfig.max_buffered_bytes, the default

ATTACKS = (
    "bad_frames",
    "connection_churn",
    "idle_sockets",
    "declared_payloads",
    "stalled_refusals",
    "dht_flood",
    "expert_crowd",
    "aggregator_junk",
    # the second round (issue 35)
    "poisoned_receipts",
    "connection_cap",
    "silent_providers",
    "relay_squat",
    "relay_hog",
    "dht_amplifier",
    "manifest_bomb",
    "quorum_framing",
    "reachability_lie",
    "holepunch_aim",
)
#: benchmark-only: the target says what its accumulators hold
TARGET_STATS = "bench.stats"
#: benchmark-only: the target opens an invite link (what the tray does for a volunteer
#: who clicked one: the attacker stands in for the click)
OPEN_INVITE = "bench.open_invite"
#: benchmark-only: the target runs one round of its reachability check
CHECK_REACHABILITY = "bench.reachability"
#: the address the reachability liars say they saw the target at
LIAR_IP = "198.18.0.66"
#: the home's public address, as the relayed volunteer's reachability check found it
HOME_ADDR = "/ip4/198.18.0.100/tcp/4001"
#: a grid that multiplies to 4096^4 x 64 experts (issue 35, finding 2)
BOMB: dict[str, Any] = {"mixture_layers": 64, "grid": [4096, 4096, 4096, 4096]}
#: the third party the amplifier aims at: ports on this address (the driver listens)
THIRD_PARTY_IP = "127.0.0.50"


# ------------------------------------------------------------------ target process


def aggregator_settings() -> AggregatorSettings:
    return AggregatorSettings(
        project=PROJECT,
        spec=SPEC,
        uids=(UID,),
        trainers=frozenset({TRAINER.public_key}),
        optimizer="sgd",
        round_samples=1 << 30,
        round_seconds=1e9,
    )


def small_project(workdir: Path) -> Any:
    """A project of 4 small experts whose weights the target serves."""
    path = workdir / "project.toml"
    write_template(path, "hostile-bench")
    text = path.read_text().replace("grid = [4, 4]", "grid = [2, 2]")
    path.write_text(text.replace("mixture_layers = 2", "mixture_layers = 1"))
    return prepare(path, OwnerKey.generate(), (), workdir / "owner")


async def run_target(workdir: Path) -> None:
    backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1), device="cpu")
    # the expert's aggregator holds the weights the volunteer serves (version 0)
    initial = {UID: build_expert(SPEC, seed=1)}
    core = AggregatorCore(aggregator_settings(), workdir / "aggregator", initial=initial)
    config = PeerConfig(listen=("/ip4/127.0.0.1/tcp/0",), rpc=RpcConfig())
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), config, validator=moehome_validator()).run
        )
        server_config = ServerConfig(
            project=PROJECT, trainers=frozenset({TRAINER.public_key}), require_receipts=True
        )
        await nursery.start(ExpertServer(peer, {UID: backend}, server_config).run)
        await nursery.start(AggregatorService(peer, core).run)
        # a relay, and a volunteer behind NAT (by assumption) holding a place on it
        relay = RelayService(peer.host, enabled=lambda: True)
        await nursery.start(relay.run)
        # no listener: behind NAT, nothing but its relay reaches it
        hidden: Peer = await nursery.start(Peer(Identity.generate(), PeerConfig(listen=())).run)
        # it punches holes, and says its address, only for the project's trainers (as a
        # serving node does)
        hidden.holepunch.observed = lambda: [HOME_ADDR]
        hidden.holepunch.allowed = lambda other: other == TRAINER.peer_id
        placed = trio.Event()
        client = RelayClient(
            hidden.host,
            candidates=lambda: [peer.peer_id],
            wanted=lambda: True,
            config=RelayClientConfig(check_s=0.2),
            on_change=lambda addrs: placed.set() if addrs else None,
            on_circuit=hidden.holepunch.punch,
        )
        await hidden.host.connect(peer.peer_id, peer.host.listen_addrs())
        await nursery.start(client.run)
        await placed.wait()
        prepared = await trio.to_thread.run_sync(small_project, workdir)
        await nursery.start(serve_project, peer, prepared)

        async def stats(ctx: CallContext) -> Reply:
            foreign = sum(
                1
                for _, acc in backend.accumulators()
                for r in acc.receipts
                if r.trainer != TRAINER.public_key
            )
            return Reply(
                {
                    "foreign_receipts": foreign,
                    "samples": backend.accumulator.samples,
                    "relayed_mb": round(relay.stats.bytes_relayed / MiB, 1),
                    "circuits_evicted": relay.stats.circuits_evicted,
                    "circuits_cut_idle": relay.stats.circuits_cut_idle,
                }
            )

        peer.rpc.register(TARGET_STATS, stats)
        pins = PinStore(workdir / "pinned-owners.json")

        async def open_invite(ctx: CallContext) -> Reply:
            """What a volunteer's node does when the tray opens an invite: meet the
            invite's peers, look the project up and sum it up (Node.find_project), and
            list the swarm's directory (Node.announced_projects)."""
            meta = ctx.request.meta
            outcome: dict[str, Any] = {"found": False}
            with trio.move_on_after(20):
                with contextlib.suppress(DhtError):
                    await peer.dht.bootstrap([str(a) for a in meta["peers"]][:4], timeout=10)
                try:
                    summary = project_summary(await find_manifest(peer, str(meta["project"]), pins))
                    outcome["found"] = summary.experts
                except ProjectNotFound as exc:
                    outcome["refused"] = str(exc)[:120]
                listed = await list_projects(peer)
                outcome["listed"] = sum(project_summary(s).experts for s in listed)
            return Reply(outcome)

        peer.rpc.register(OPEN_INVITE, open_invite)

        # it checks its reachability in rounds of dial-back requests, and announces
        # what it finds, as a node does (Peer._reached)
        monitor = ReachabilityMonitor(
            peer.rpc,
            peer.host,
            ReachabilityConfig(dial_timeout_s=3),
            on_change=lambda verdict: peer.host.set_public_addrs(verdict.public_addrs),
        )
        nursery.start_soon(monitor.run)

        async def check_reachability(ctx: CallContext) -> Reply:
            """Its verdict and the addresses it announces (what newcomers dial); a new
            round of its check starts."""
            verdict = monitor.verdict
            monitor.recheck_soon()
            return Reply(
                {
                    "reachability": verdict.reachability.name,
                    "observed_ip": verdict.observed_ip,
                    "public_addrs": list(verdict.public_addrs),
                    "announced": list(peer.host.announce_addrs()),
                }
            )

        peer.rpc.register(CHECK_REACHABILITY, check_reachability)
        circuit = f"{client.relayed_addrs()[0]}/p2p/{hidden.peer_id}"
        print("READY", peer.addrs()[0], circuit, prepared.signed.project_id, flush=True)
        await trio.sleep_forever()


# ------------------------------------------------------------------ attacker process


frame = raw_frame


@contextlib.asynccontextmanager
async def stranger(target: Any, source_ip: str = "127.0.0.2") -> Any:
    host = dial_from(SwarmHost(Identity.generate(), listen=[]), source_ip)
    async with host.running():
        host.remember(target.peer_id, [str(a) for a in target.addrs])
        yield host


#: What the attacker tried: actions started, those the target refused or cut off, and
#: those still in progress (streams or sockets held open: a stalling attack's actions
#: start once and last).
TRIED = {"actions": 0, "failed": 0, "open": 0}
#: what an attack says besides (e.g. what it heard from the target)
SAID: dict[str, Any] = {}


async def quietly(fn: Callable[[], Awaitable[Any]]) -> None:
    """Run one attacker action; whatever the target does to it is fine."""
    TRIED["actions"] += 1
    TRIED["open"] += 1
    try:
        await fn()
    except Exception:  # noqa: BLE001 - refusals are what the target should answer
        TRIED["failed"] += 1
    finally:
        TRIED["open"] -= 1


async def forever(action: Callable[[], Awaitable[Any]], pause: float = 0.0) -> None:
    while True:
        await quietly(action)
        await trio.sleep(pause)


async def attack_bad_frames(target: Any, started: trio.Event) -> None:
    frames = [
        frame({"id": 3, "m": FORWARD, "t": specs})
        for specs in ([[[], [4]]], [[{"a": 1}, [4]]], [["float32", [[4]]]], {"x": 1}, [[None, 1]])
    ] + [b"\x00" * 37, frame({"id": [1], "m": "x"})]

    async def one(i: int) -> None:
        async with stranger(target) as host:

            async def send() -> None:
                stream = await host.new_stream(target.peer_id, RPC_PROTOCOL)
                await stream.write(frames[i % len(frames)])
                with trio.move_on_after(2):
                    await stream.read(65536)
                await stream.reset()

            await forever(send)

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(one, i)
        started.set()


async def attack_connection_churn(target: Any, started: trio.Event) -> None:
    async def one(i: int) -> None:
        async with stranger(target, f"127.0.0.{10 + i}") as host:
            swarm = host.libp2p_host.get_network()

            async def cycle() -> None:
                await host.connect(target.peer_id, timeout=5)
                await swarm.close_peer(target.peer_id)

            await forever(cycle)

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, i)
        started.set()


async def attack_idle_sockets(target: Any, started: trio.Event) -> None:
    ip, port = str(target.addrs[0]).split("/")[2], int(str(target.addrs[0]).split("/")[4])

    async def hold() -> None:
        sock = trio.socket.socket()
        await sock.bind(("127.0.0.2", 0))
        await sock.connect((ip, port))
        async with trio.SocketStream(sock) as stream:
            while await stream.receive_some(4096):
                pass

    async with trio.open_nursery() as nursery:
        for _ in range(260):
            nursery.start_soon(forever, hold, 0.01)
        started.set()


async def attack_declared_payloads(target: Any, started: trio.Event) -> None:
    header = frame({"id": 1, "m": FORWARD, "t": [["float32", [64 * MiB]]]})  # 256 MiB

    async def one(i: int) -> None:
        async with stranger(target) as host:

            async def hold() -> None:
                stream = await host.new_stream(target.peer_id, RPC_PROTOCOL)
                await stream.write(header)
                await stream.read(65536)  # until the target gives up on it

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(forever, hold, 0.05)

    async with trio.open_nursery() as nursery:
        for i in range(16):
            nursery.start_soon(one, i)
        started.set()


async def attack_stalled_refusals(target: Any, started: trio.Event) -> None:
    header = frame({"id": 1, "m": "no.such.method", "t": [["uint8", [2 * MiB]]]})

    async def one(i: int) -> None:
        async with stranger(target) as host:

            async def hold() -> None:
                stream = await host.new_stream(target.peer_id, RPC_PROTOCOL)
                await stream.write(header)
                await stream.read(65536)

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(forever, hold, 0.05)

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, i)
        started.set()


def records_tensor(records: list[Any]) -> Tensor:
    blob = pack([r.encode() for r in records])
    return Tensor("uint8", (len(blob),), blob)


async def attack_dht_flood(target: Any, started: trio.Event) -> None:
    crowd = [Identity.generate() for _ in range(250)]
    value = bytes(8 * 1024 - 64)
    now = int(time.time() * 1000)
    big = [
        [
            sign_record(crowd[(b * 64 + i) % 250], f"/moehome/demo/b{b}-{i}", value, 3600, now)
            for i in range(64)
        ]
        for b in range(640)  # 40,960 records of 8 KiB
    ]
    sybil = [sign_record(who, "/moehome/demo/honest-key", b"sybil", 3600, now) for who in crowd]
    tiny_author = Identity.generate()
    round_ = [0]

    async def sender(i: int) -> None:
        async with stranger(target) as host:
            rpc = RpcService(host)

            async def send() -> None:
                n = round_[0] = round_[0] + 1
                if n % 3 == 0:
                    batch = sybil
                elif n % 3 == 1:
                    batch = big[n % len(big)]
                else:
                    stamp = int(time.time() * 1000)
                    batch = [
                        sign_record(tiny_author, f"/moehome/demo/t{n}-{j}", b"", 3600, stamp)
                        for j in range(500)
                    ]
                await rpc.call(target.peer_id, STORE, {}, [records_tensor(batch)], timeout=30)

            await forever(send)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(sender, i)
        started.set()


async def attack_expert_crowd(target: Any, started: trio.Event) -> None:
    # half send full batches (4096 rows), half the largest a stranger may send (256)
    full, allowed = to_wire(torch.randn(4096, SPEC.hidden)), to_wire(torch.randn(256, SPEC.hidden))

    async def one(i: int) -> None:
        x = full if i % 2 else allowed
        async with stranger(target) as host:
            rpc = RpcService(host)

            async def call() -> None:
                await rpc.call(target.peer_id, FORWARD, {"uid": UID, "keep": True}, [x], timeout=60)

            await forever(call)

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(one, i)
        started.set()


async def attack_aggregator_junk(target: Any, started: trio.Event) -> None:
    module = build_expert(SPEC)
    params = [ParamSpec(n, p.numel()) for n, p in module.named_parameters()]
    blob = torch.zeros(4 * MiB)  # 16 MiB of junk payload

    async def one(i: int) -> None:
        who = Identity.generate()
        host = dial_from(SwarmHost(who, listen=[]), "127.0.0.2")
        async with host.running():
            host.remember(target.peer_id, [str(a) for a in target.addrs])
            rpc = RpcService(host)

            async def send() -> None:
                receipts = [Receipt.sign(who, PROJECT, UID, 0, [], [], 4)]
                msg = Contribution.create(
                    who,
                    project=PROJECT,
                    uid=UID,
                    base_version=0,
                    codec="fp32",
                    params=params,
                    receipts=receipts,
                    parts=[blob],
                )
                await rpc.call(
                    target.peer_id,
                    CONTRIBUTE,
                    {"header": msg.encode()},
                    [to_wire(blob)],
                    timeout=30,
                )

            await forever(send, 0.01)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)
        started.set()


async def attack_poisoned_receipts(target: Any, started: trio.Event) -> None:
    """One-row backward requests, each with a receipt the stranger signed itself."""

    async def one(i: int) -> None:
        async with stranger(target) as host:
            rpc = RpcService(host)
            x, grad = torch.randn(1, SPEC.hidden), torch.ones(1, SPEC.hidden)

            async def send() -> None:
                receipt = Receipt.sign(host.identity, PROJECT, UID, 0, [x], [grad], 1)
                meta = {"uid": UID, "receipt": receipt.encode()}
                await rpc.call(target.peer_id, BACKWARD, meta, [to_wire(x), to_wire(grad)])

            await forever(send, 0.05)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(one, i)
        started.set()


async def attack_connection_cap(target: Any, started: trio.Event) -> None:
    """8 addresses x 40 idle connections of fresh identities (past libp2p's 300)."""
    up = trio.Semaphore(0)

    async def one(source: str, dialing: trio.CapacityLimiter) -> None:
        async with stranger(target, source) as host:
            async with dialing:
                while True:
                    TRIED["actions"] += 1
                    try:
                        await host.connect(target.peer_id, timeout=10)
                        break
                    except DialError:
                        TRIED["failed"] += 1
                        await trio.sleep(0.2)
            up.release()
            TRIED["open"] += 1
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for i in range(8):
            dialing = trio.CapacityLimiter(4)  # within a source's handshakes in progress
            for _ in range(40):
                nursery.start_soon(one, f"127.0.0.{20 + i}", dialing)
        for _ in range(300):
            await up.acquire()
        started.set()


async def attack_silent_providers(target: Any, started: trio.Event, project: str) -> None:
    """8 peers announcing the project's weights that never answer a chunk request."""

    async def silent(ctx: CallContext) -> Reply:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with trio.open_nursery() as nursery:
        for i in range(8):
            sybil = Peer(
                Identity.generate(),
                PeerConfig(
                    listen=(f"/ip4/127.0.0.{30 + i}/tcp/0",),
                    bootstrap=(f"{target.addrs[0]}/p2p/{target.peer_id}",),
                ),
                validator=moehome_validator(),
            )
            await nursery.start(sybil.run)
            sybil.rpc.register(GET_CHUNK, silent)
            index = await project_index(sybil, project)
            await sybil.dht.put(
                providers_key(project), ProviderAnnouncement(index, ()).encode(), 600
            )
            TRIED["actions"] += 1
        started.set()


def split_relayed(circuit: str) -> tuple[str, PeerID]:
    """(the circuit address, the relayed peer's id) of ``.../p2p-circuit/p2p/<id>``."""
    via, _, peer = circuit.rpartition("/p2p/")
    return via, PeerID.from_base58(peer)


async def project_index(peer: Peer, project: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        signed = await find_manifest(peer, project, PinStore(Path(tmp) / "pins.json"))
    return signed.weights_index


async def attack_relay_squat(target: Any, started: trio.Event, circuit: str) -> None:
    """16 idle relayed connections, fresh identities, one address."""
    via, hidden = split_relayed(circuit)

    async def one() -> None:
        peer = Peer(Identity.generate(), PeerConfig(listen=()))
        dial_from(peer.host, "127.0.0.2")
        async with trio.open_nursery() as inner:
            await inner.start(peer.run)
            with contextlib.suppress(DialError):
                TRIED["actions"] += 1
                await peer.host.connect(hidden, [via])
            TRIED["open"] += 1
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(one)
            await trio.sleep(0.05)
        started.set()


async def attack_relay_hog(target: Any, started: trio.Event, circuit: str) -> None:
    """6 relayed connections from one address, each pushing 256 KiB after 256 KiB."""
    via, hidden = split_relayed(circuit)
    blob = Tensor("uint8", (256 * 1024,), bytes(256 * 1024))

    async def one() -> None:
        peer = Peer(Identity.generate(), PeerConfig(listen=()))
        dial_from(peer.host, "127.0.0.2")
        async with trio.open_nursery() as inner:
            await inner.start(peer.run)
            with contextlib.suppress(DialError):
                await peer.host.connect(hidden, [via])

            async def push() -> None:
                await peer.rpc.call(hidden, PING, {}, [blob], timeout=30)

            await forever(push)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
        await trio.sleep(2.0)  # whatever one shared bucket held is drained
        started.set()


async def attack_dht_amplifier(target: Any, started: trio.Event, third_party: str) -> None:
    """``dht.find`` messages from fresh identities naming a third party's ports as
    their own addresses (60 of them, then one a second)."""
    claimed = [f"/ip4/{THIRD_PARTY_IP}/tcp/{p}" for p in third_party.split(",")]

    async def send() -> None:
        async with stranger(target) as host:
            meta = {"target": os.urandom(32), "addrs": claimed}
            await RpcService(host).call(target.peer_id, FIND, meta, timeout=10)

    for _ in range(60):
        await quietly(send)
    started.set()
    while True:
        await quietly(send)
        await trio.sleep(1.0)


def bomb_manifest(owner: OwnerKey, workdir: Path) -> SignedManifest:
    """A validly signed manifest whose grid is the bomb (signed by hand: our own
    publishing code refuses to sign it)."""
    path = workdir / "bomb.toml"
    write_template(path, "bomb")
    obj = load_manifest(path).to_obj()
    obj["model"].update(BOMB)
    unsigned = SignedManifest(
        pack(canonical(obj)),
        owner.public_key,
        owner.public_key,
        (),
        "0" * 64,
        time.time_ns() // 1000,
        b"",
    )
    return replace(unsigned, signature=owner.sign(unsigned.payload()))


async def attack_manifest_bomb(target: Any, started: trio.Event) -> None:
    """The bomb on the attacker's own DHT node (which keeps it unchecked) and in the
    directory; the target opens the attacker's invite to it, again and again."""
    owner = OwnerKey.generate()
    with tempfile.TemporaryDirectory() as tmp:
        signed = bomb_manifest(owner, Path(tmp))
    lax = {**project_records.RULES}
    lax["project"] = replace(lax["project"], check=None)
    peer = Peer(
        Identity.generate(),
        PeerConfig(listen=("/ip4/127.0.0.2/tcp/0",)),
        validator=NamespacedValidator().with_rules(lax),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.run)
        pid = project_id(owner.public_key, "bomb")
        for key, value in [
            (project_records.project_key(pid), signed.encode()),
            (project_records.DIRECTORY_KEY, pack([pid])),
        ]:
            with contextlib.suppress(DhtError):  # kept at home whatever the others say
                await peer.dht.put(key, value, 3600)
        invite = {"project": pid, "peers": [peer.addrs()[0]]}
        SAID["bombs_found"] = 0

        async def click() -> None:
            reply = await peer.rpc.call(target.peer_id, OPEN_INVITE, invite, timeout=60)
            if reply.meta.get("found") or reply.meta.get("listed"):
                SAID["bombs_found"] += 1
            if reply.meta.get("refused"):
                raise RuntimeError(reply.meta["refused"])

        started.set()
        await forever(click, 0.1)


async def attack_quorum_framing(target: Any, started: trio.Event) -> None:
    """8 pairs of Sybil servers of the target's expert, each running the same x1.05
    cheat: put to them as other servers' opinions, a pair agrees against any honest
    answer."""
    bootstrap = (f"{target.addrs[0]}/p2p/{target.peer_id}",)
    async with trio.open_nursery() as nursery:
        servers = []
        for i in range(16):
            sybil = Peer(
                Identity.generate(),
                PeerConfig(listen=(f"/ip4/127.0.0.{40 + i // 2}/tcp/0",), bootstrap=bootstrap),
                validator=moehome_validator(),
            )
            await nursery.start(sybil.run)
            backend = ExpertBackend(
                ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1), device="cpu"
            )
            config = ServerConfig(
                project=PROJECT,
                trainers=frozenset({TRAINER.public_key}),
                answer_hook=ANSWER_CHEATS["scaled-answers"],
            )
            await nursery.start(ExpertServer(sybil, {UID: backend}, config).run)
            servers.append(sybil.addrs()[0])
            TRIED["actions"] += 1
        print("SERVERS", " ".join(servers), flush=True)
        started.set()
        await trio.sleep_forever()


async def attack_reachability_lie(target: Any, started: trio.Event) -> None:
    """4 identities at one address, connected to the target, answering its dial-back
    requests "reached you, at 198.18.0.66" without dialling."""

    async def liar(ctx: CallContext) -> Reply:
        TRIED["actions"] += 1
        ports = list(ctx.request.meta.get("ports") or [])
        return Reply(
            {
                "observed": LIAR_IP,
                "reachable": ports,
                "tried": ports,
                "dialer": ctx.peer_id.to_bytes(),
            }
        )

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            peer = Peer(Identity.generate(), PeerConfig(listen=("/ip4/127.0.0.2/tcp/0",)))
            dial_from(peer.host, "127.0.0.2")
            await nursery.start(peer.run)
            peer.rpc.register(DIAL_BACK, liar)
            await peer.host.connect(target.peer_id, [str(a) for a in target.addrs])
        started.set()
        await trio.sleep_forever()


async def attack_holepunch_aim(
    target: Any, started: trio.Event, circuit: str, third_party: str
) -> None:
    """4 peers at one address open circuits to the volunteer behind NAT and punch as
    side B, naming a third party's ports; they answer its punches with those ports
    too. Counts the times the volunteer said its address (``addresses_heard``)."""
    via, hidden = split_relayed(circuit)
    claimed = [
        multiaddr.Multiaddr(f"/ip4/{THIRD_PARTY_IP}/tcp/{p}").to_bytes()
        for p in third_party.split(",")
    ]
    SAID["addresses_heard"] = 0

    async def answer(stream: Any) -> None:
        """The volunteer punching us: whatever address it says is heard."""
        with contextlib.suppress(Exception):
            offer = await read_message(stream, HolePunch)
            SAID["addresses_heard"] += bool(offer.ObsAddrs)
            await write_message(stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=claimed))
            await read_message(stream, HolePunch)

    async def one() -> None:
        peer = Peer(Identity.generate(), PeerConfig(listen=()))
        dial_from(peer.host, "127.0.0.2")
        async with trio.open_nursery() as inner:
            await inner.start(peer.run)
            peer.host.set_stream_handler(HOLE_PUNCH, answer)

            async def punch() -> None:
                if not peer.host.is_connected(hidden):
                    await peer.host.connect(hidden, [via])
                stream = await peer.host.libp2p_host.new_stream(hidden, [HOLE_PUNCH])
                try:
                    await write_message(stream, HolePunch(type=HolePunch.CONNECT, ObsAddrs=claimed))
                    reply = await read_message(stream, HolePunch)
                    SAID["addresses_heard"] += bool(reply.ObsAddrs)
                    await write_message(stream, HolePunch(type=HolePunch.SYNC))
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()

            await forever(punch, 0.2)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
        started.set()


async def run_attacker(name: str, target_addr: str, extra: list[str]) -> None:
    target = parse_peer_addr(target_addr)
    started = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(globals()[f"attack_{name}"], target, started, *extra)
            await started.wait()
            await trio.sleep(2.0)  # let it reach full strength
            began, tried = time.monotonic(), dict(TRIED)
            print("ATTACKING", flush=True)
            async for _ in signals:
                seconds = time.monotonic() - began
                actions = TRIED["actions"] - tried["actions"]
                failed = TRIED["failed"] - tried["failed"]
                print(
                    "TRIED",
                    json.dumps(
                        {
                            "actions_per_s": round(actions / seconds, 1),
                            "refused_or_cut": round(failed / max(1, actions), 3),
                            "in_progress": TRIED["open"],
                            "total_actions": TRIED["actions"],
                            **SAID,
                        }
                    ),
                    flush=True,
                )
                nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ honest caller


class Honest:
    """The calls each attack threatens, made the way honest peers make them."""

    def __init__(self, target_addr: str, circuit: str = "", project: str = "") -> None:
        self.target_addr = target_addr
        self.target = parse_peer_addr(target_addr)
        self.addrs = [str(a) for a in self.target.addrs]
        self.trainer = SwarmHost(TRAINER, listen=[])
        self.volunteer = SwarmHost(VOLUNTEER, listen=[])
        self.version = 0
        self.circuit = circuit
        self.project = project
        #: peers that go about their DHT lookups (dht_amplifier), started by drive()
        self.lookers: list[Peer] = []
        self.workdir = Path(".")
        # a trainer that cannot hold the expert's weights (over its audit budget): it
        # puts the answers it audits to other servers of the expert, and a dispute to
        # the expert's aggregator (the target, whose core holds the weights)
        self.caller = ExpertCaller(RpcService(self.trainer))
        self.auditor = AnswerAuditor(
            OverBudget(), torch.float32, rate=1.0, second_opinion=self.opinion
        )
        self.auditor.referee = partial(self.caller.referee, aggregator=self.target.peer_id)
        self.caller.auditor = self.auditor
        #: the other servers of the expert the trainer knows (quorum_framing: the Sybils)
        self.servers: list[ExpertServerRef] = []

    async def opinion(
        self, answer: Answer, asked: set[PeerID]
    ) -> tuple[PeerID, torch.Tensor] | None:
        servers = [s for s in self.servers if not self.auditor.is_excluded(s.peer_id)]
        return await self.caller.opinion(answer, servers, asked)

    async def audited_answer(self) -> None:
        """A trainer's forward pass to the target; every answer is drawn for an audit,
        which runs beside (``auditor.run``, as in a trainer). Fails once the target
        is excluded: the trainer would call it no more."""
        if self.auditor.is_excluded(self.target.peer_id):
            raise RuntimeError("the honest volunteer was excluded by an audit")
        x = torch.randn(16, SPEC.hidden)
        await self.caller.forward(UID, [ExpertServerRef(self.target.peer_id)], x)

    async def reachability(self) -> None:
        """A newcomer reaches the target at the addresses it announces (its verdict
        is asked for, and a new round of its check started): it must believe no
        address that the liars named, nor turn private."""
        reply = await RpcService(self.volunteer).call(
            self.target.peer_id, CHECK_REACHABILITY, {}, timeout=30
        )
        said = reply.meta
        believed = [said["observed_ip"], *said["public_addrs"], *said["announced"]]
        if said["reachability"] == "PRIVATE" or any(LIAR_IP in str(a) for a in believed):
            raise RuntimeError(f"the target believes a lie: {said}")
        host = SwarmHost(Identity.generate(), listen=[])
        async with host.running():
            host.remember(self.target.peer_id, [str(a) for a in said["announced"]])
            await RpcService(host).call(self.target.peer_id, PING, timeout=10)

    async def trainer_step(self) -> None:
        """Forward keeping the graph, then backward through it (a trainer's use)."""
        rpc = RpcService(self.trainer)
        x = torch.randn(64, SPEC.hidden)
        reply = await rpc.call(
            self.target.peer_id, FORWARD, {"uid": UID, "keep": True}, [to_wire(x)], timeout=30
        )
        handle = reply.meta.get("handle")
        grad = torch.ones_like(from_wire(reply.tensors[0]))
        # the trainer's receipt: what makes the volunteer's gradient count
        receipt = Receipt.sign(TRAINER, PROJECT, UID, self.version, [x], [grad], x.shape[0])
        meta: dict[str, Any] = {"uid": UID, "receipt": receipt.encode()}
        tensors = [to_wire(grad)]
        if isinstance(handle, int):
            meta["handle"] = handle
        else:
            tensors = [to_wire(x), *tensors]
        await rpc.call(self.target.peer_id, BACKWARD, meta, tensors, timeout=30)
        if not isinstance(handle, int):
            raise RuntimeError("the trainer's forward graph was not kept")

    async def fetch(self) -> None:
        """A newcomer's whole fetch of the project's weights (the manifest, the index,
        every expert), from the providers the DHT names."""
        peer = Peer(
            Identity.generate(),
            PeerConfig(listen=(), bootstrap=(self.target_addr,)),
            validator=moehome_validator(),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            fresh = self.workdir / f"newcomer-{time.monotonic_ns()}"
            signed = await find_manifest(peer, self.project, PinStore(fresh / "pins.json"))
            store = ChunkStore(fresh / "chunks")
            uids = list(signed.manifest.model.expert_uids())
            files = await WeightsFetcher(peer, store).fetch(signed, uids)
            if sorted(files) != sorted(uids):
                raise RuntimeError("not every expert's weights came")
            nursery.cancel_scope.cancel()

    async def relay_call(self) -> None:
        """A newcomer reaches the volunteer behind NAT through its relay: 128 KiB."""
        via, hidden = split_relayed(self.circuit)
        peer = Peer(Identity.generate(), PeerConfig(listen=()))
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            await peer.host.connect(hidden, [via])
            blob = Tensor("uint8", (128 * 1024,), bytes(128 * 1024))
            reply = await peer.rpc.call(hidden, PING, {}, [blob], timeout=30)
            if reply.meta.get("bytes") != 128 * 1024:
                raise RuntimeError(f"the relay carried {reply.meta.get('bytes')} bytes")
            nursery.cancel_scope.cancel()

    async def lookups(self) -> None:
        """Every honest peer of the swarm looks a key up (what refreshes and gets do)."""
        async with trio.open_nursery() as nursery:
            for peer in self.lookers:
                nursery.start_soon(peer.dht.get, f"/moehome/demo/{os.urandom(4).hex()}")

    async def target_stats(self) -> dict[str, Any]:
        reply = await RpcService(self.volunteer).call(self.target.peer_id, TARGET_STATS, {})
        return dict(reply.meta)

    async def newcomer(self) -> None:
        """A peer never seen before: connect and make one call."""
        host = SwarmHost(Identity.generate(), listen=[])
        async with host.running():
            host.remember(self.target.peer_id, self.addrs)
            await RpcService(host).call(self.target.peer_id, PING, timeout=10)

    async def dht(self) -> None:
        """Store a new record on the target and read it back."""
        rpc = RpcService(self.volunteer)
        key = f"/moehome/demo/honest-{time.monotonic_ns()}"
        record = sign_record(VOLUNTEER, key, b"honest", 600, int(time.time() * 1000))
        reply = await rpc.call(
            self.target.peer_id, STORE, {}, [records_tensor([record])], timeout=10
        )
        if reply.meta.get("stored") != [True]:
            raise RuntimeError(f"record not stored: {reply.meta}")
        got = await rpc.call(self.target.peer_id, GET, {"key": key}, timeout=10)
        if not got.tensors:
            raise RuntimeError("record not found")

    async def contribution(self) -> None:
        """A volunteer's valid contribution (receipts signed by the project's trainer)."""
        module = build_expert(SPEC)
        chosen = codec("fp16")
        grads = {n: torch.full((p.numel(),), 1e-3) for n, p in module.named_parameters()}
        parts = [part for n in grads for part in chosen.encode(grads[n])]
        msg = Contribution.create(
            VOLUNTEER,
            project=PROJECT,
            uid=UID,
            base_version=self.version,
            codec="fp16",
            params=[ParamSpec(n, p.numel()) for n, p in module.named_parameters()],
            receipts=[Receipt.sign(TRAINER, PROJECT, UID, self.version, [], [], 4)],
            parts=parts,
        )
        reply = await RpcService(self.volunteer).call(
            self.target.peer_id,
            CONTRIBUTE,
            {"header": msg.encode()},
            [to_wire(p) for p in parts],
            timeout=30,
        )
        if reply.meta.get("accepted") is not True:
            raise RuntimeError(f"contribution not accepted: {reply.meta}")


HONEST_CALL = {
    "bad_frames": "trainer_step",
    "connection_churn": "newcomer",
    "idle_sockets": "newcomer",
    "declared_payloads": "trainer_step",
    "stalled_refusals": "trainer_step",
    "dht_flood": "dht",
    "expert_crowd": "trainer_step",
    "aggregator_junk": "contribution",
    "poisoned_receipts": "trainer_step",
    "connection_cap": "newcomer",
    "silent_providers": "fetch",
    "relay_squat": "relay_call",
    "relay_hog": "relay_call",
    "dht_amplifier": "lookups",
    "manifest_bomb": "trainer_step",
    "quorum_framing": "audited_answer",
    "reachability_lie": "reachability",
    "holepunch_aim": "relay_call",
}


class OverBudget:
    """A trainer's audit weights (VersionWeights) where every expert is over its memory
    budget: no weights, as PublishedWeights answers for an expert bigger than it may
    hold."""

    async def module(self, uid: str, version: int) -> torch.nn.Module | None:
        return None


#: what an honest call may fail with (counted, not raised)
HONEST_FAILURES = (RpcError, RemoteError, RuntimeError, DialError, trio.TooSlowError, OSError)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def measure(call: Callable[[], Awaitable[None]], n: int) -> dict[str, Any]:
    ok, times = 0, []
    errors: dict[str, int] = {}
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            with trio.fail_after(30):
                await call()
            ok += 1
            times.append((time.perf_counter() - t0) * 1000)
        except (*HONEST_FAILURES, ExceptionGroup) as exc:
            failure = _leaf(exc)  # calls that start peers fail inside a nursery
            if not isinstance(failure, HONEST_FAILURES):
                raise
            errors[type(failure).__name__] = errors.get(type(failure).__name__, 0) + 1
        await trio.sleep(0.05)
    out: dict[str, Any] = {
        "success": round(ok / n, 3),
        "median_ms": round(statistics.median(times), 2) if times else None,
    }
    if errors:
        out["errors"] = errors
    return out


class MemoryWatch:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0

    def rss(self) -> int:
        try:
            return int(self.process.memory_info().rss)
        except psutil.NoSuchProcess:
            return 0

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, self.rss())
            await trio.sleep(0.02)


def spawn(*args: str, cpu: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with contextlib.suppress(AttributeError, OSError):  # not on every OS, not every core
        os.sched_setaffinity(proc.pid, {cpu % (os.cpu_count() or 1)})
    return proc


async def read_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 120) -> str:
    assert proc.stdout is not None
    with trio.fail_after(timeout):
        while True:
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            if not line:
                raise RuntimeError(f"process exited before saying {prefix!r}")
            if line.startswith(prefix):
                return line.strip()


async def stop_attacker(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """SIGTERM the attacker; what it says it tried while the honest calls ran."""
    tried: dict[str, Any] = {}
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(RuntimeError, trio.TooSlowError):
            tried = json.loads((await read_line(proc, "TRIED", timeout=20)).split(" ", 1)[1])
    stop(proc)
    return tried


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


async def drive(attacks: list[str], calls: int, workdir: Path) -> dict[str, Any]:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
    target = spawn("target", "--workdir", str(workdir), cpu=0)
    results: dict[str, Any] = {}
    try:
        _, addr, circuit, project = (await read_line(target, "READY")).split()
        honest = Honest(addr, circuit, project)
        honest.workdir = workdir
        watch = MemoryWatch(target.pid)
        third_party = [0]  # connections on the amplifier's third party
        async with (
            honest.trainer.running(),
            honest.volunteer.running(),
            trio.open_nursery() as nursery,
        ):
            for host in (honest.trainer, honest.volunteer):
                host.remember(honest.target.peer_id, honest.addrs)
            nursery.start_soon(watch.run)
            await nursery.start(honest.auditor.run)
            ports = await nursery.start(count_connections, THIRD_PARTY_IP, 8, third_party)
            for _ in range(4):  # honest peers of the swarm, for the amplifier
                looker = Peer(Identity.generate(), PeerConfig(bootstrap=(addr,)))
                honest.lookers.append(await nursery.start(looker.run))
                # they dial back who asks (the target's reachability check)
                await nursery.start(DialBackService(looker.rpc, ReachabilityConfig()).run)
                await looker.host.connect(honest.target.peer_id, honest.addrs)
            for name in attacks:
                call = getattr(honest, HONEST_CALL[name])
                await call()  # warm: connections open, code paths loaded
                watch.peak = 0
                before = await measure(call, calls)
                rss_before = watch.peak
                extra = {
                    "silent_providers": [project],
                    "relay_squat": [circuit],
                    "relay_hog": [circuit],
                    "dht_amplifier": [",".join(map(str, ports))],
                    "holepunch_aim": [circuit, ",".join(map(str, ports))],
                }.get(name, [])
                aimed_before = third_party[0]
                refereed_before = honest.auditor.stats.refereed
                attacker = spawn("attack", name, addr, *extra, cpu=1)
                try:
                    if name == "quorum_framing":
                        for server in (await read_line(attacker, "SERVERS")).split()[1:]:
                            sybil = parse_peer_addr(server)
                            honest.trainer.remember(sybil.peer_id, [str(a) for a in sybil.addrs])
                            honest.servers.append(ExpertServerRef(sybil.peer_id))
                    await read_line(attacker, "ATTACKING")
                    watch.peak = 0
                    during = await measure(call, calls)
                    rss_peak = watch.peak
                finally:
                    tried = await stop_attacker(attacker)
                if name == "quorum_framing":  # the Sybils are gone: no more opinions
                    audits = honest.auditor.stats
                    tried["disputes_refereed"] = audits.refereed - refereed_before
                    tried["sybils_excluded"] = sum(
                        honest.auditor.is_excluded(s.peer_id) for s in honest.servers
                    )
                    tried["honest_excluded"] = honest.auditor.is_excluded(honest.target.peer_id)
                    honest.servers.clear()
                await trio.sleep(1.0)
                after = await measure(call, calls)
                ratio = (
                    round(during["median_ms"] / before["median_ms"], 2)
                    if during["median_ms"] and before["median_ms"]
                    else None
                )
                if name == "dht_amplifier":
                    await honest.lookups()  # what the swarm learnt, dialled once more
                    messages = max(1, int(tried.get("total_actions", 0)))
                    aimed = third_party[0] - aimed_before
                    tried["third_party_connections"] = aimed
                    tried["third_party_connections_per_message"] = round(aimed / messages, 3)
                if name == "holepunch_aim":
                    tried["third_party_connections"] = third_party[0] - aimed_before
                if name in ("poisoned_receipts", "relay_squat", "relay_hog", "holepunch_aim"):
                    tried.update(await honest.target_stats())
                results[name] = {
                    "honest_call": HONEST_CALL[name],
                    "before": before,
                    "during": during,
                    "after": after,
                    "latency_ratio": ratio,
                    "rss_mb_before": round(rss_before / MiB),
                    "rss_mb_peak_during": round(rss_peak / MiB),
                    "attacker": tried,
                    "target_running": target.poll() is None,
                }
                log.info("%s: %s", name, results[name])
                if target.poll() is not None:
                    break
            nursery.cancel_scope.cancel()
    finally:
        stop(target)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    t = sub.add_parser("target")
    t.add_argument("--workdir", type=Path, required=True)
    a = sub.add_parser("attack")
    a.add_argument("name", choices=ATTACKS)
    a.add_argument("target")
    a.add_argument("extra", nargs="*", help="what the attack needs (project, circuit, ports)")
    parser.add_argument("--quick", action="store_true", help="fewer honest calls per phase")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.role == "target":
        trio.run(run_target, args.workdir)
        return
    if args.role == "attack":
        logging.getLogger("libp2p").setLevel(logging.CRITICAL)
        logging.getLogger("net").setLevel(logging.CRITICAL)
        trio.run(run_attacker, args.name, args.target, args.extra)
        return
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as tmp:
        results = trio.run(drive, attacks, 8 if args.quick else 20, Path(tmp))
    budgets = {
        "rpc_payloads": RPC_BUDGET // MiB,
        "dht_store": 64,
        "kept_graphs": 64,
    }
    print(json.dumps({"attacks": results, "budgets_mb": budgets}))


if __name__ == "__main__":
    main()
