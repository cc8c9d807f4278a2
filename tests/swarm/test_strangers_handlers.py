"""Every RPC handler of every role, fed requests whose meta and tensors are of any type
(issue 14): each answers or refuses with a typed error; none fails internally (an
internal failure is a bug a stranger can find and, with luck, turn into a crash)."""

from __future__ import annotations

import random
from typing import Any

import trio

from core.aggregator.service import AggregatorService
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.distribution import WeightsService
from net import Identity, Peer, PeerConfig, RemoteError, RequestHead
from net.rpc import CallContext, InternalError
from net.rpc.frames import DTYPE_SIZES, Request, Tensor
from tests.unit.test_aggregator_core import make_core, settings

FFN = ExpertSpec("ffn", hidden=8, inner=16)
KEYS = ["uid", "keep", "handle", "receipt", "target", "key", "addrs", "hash", "header", "x"]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["none", "bool", "int", "float", "str", "bytes"]
    if depth < 3:
        kinds += ["list", "map"]
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, -1, 7, 2**31, 2**63 - 1, -(2**63), rng.randrange(-100, 100)])
    if kind == "float":
        return rng.choice([0.0, -1.5, float("nan"), float("inf"), 1e308])
    if kind == "str":
        return rng.choice(["", "ffn.0.0", "ffn.9.9", "a" * 300, "/moehome/demo/x", "\x00"])
    if kind == "bytes":
        return rng.randbytes(rng.choice([0, 1, 16, 32, 64, 300]))
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_tensors(rng: random.Random) -> tuple[Tensor, ...]:
    out = []
    for _ in range(rng.randrange(3)):
        dtype = rng.choice(sorted(DTYPE_SIZES))
        shape = tuple(rng.randrange(0, 5) for _ in range(rng.randrange(0, 4)))
        n = DTYPE_SIZES[dtype]
        for d in shape:
            n *= d
        out.append(Tensor(dtype, shape, rng.randbytes(n)))
    return tuple(out)


async def test_every_handler_refuses_requests_of_any_type_with_a_typed_error(tmp_path):
    rng = random.Random(14)
    backends = {
        uid: ExpertBackend(ExpertUID.parse(uid), FFN, build_expert(FFN, seed=i))
        for i, uid in enumerate(("ffn.0.0", "ffn.0.1"))
    }
    core = make_core(settings(), tmp_path / "agg")
    async with trio.open_nursery() as nursery:
        peer: Peer = await nursery.start(
            Peer(Identity.generate(), PeerConfig(), validator=moehome_validator()).run
        )
        await nursery.start(
            ExpertServer(peer, backends, ServerConfig(project="demo", require_receipts=True)).run
        )
        service = AggregatorService(peer, core)
        WeightsService.of(peer, ChunkStore(tmp_path / "chunks"))
        caller = Identity.generate().peer_id
        handlers = dict(peer.rpc._handlers)
        assert {"moe.forward", "dht.store", "agg.contribute", "weights.chunk"} <= set(handlers)
        failures: list[str] = []
        for method, handler in sorted(handlers.items()):
            for _ in range(100):
                meta = {rng.choice(KEYS): random_value(rng) for _ in range(rng.randrange(5))}
                if rng.random() < 0.3:
                    meta["uid"] = rng.choice(["ffn.0.0", "ffn.0.1"])
                tensors = random_tensors(rng)
                request = Request(method, 1, meta, tensors)
                try:
                    with trio.fail_after(10):
                        await handler(CallContext(caller, request, "198.18.0.9"))
                except InternalError as exc:
                    failures.append(f"{method} {meta!r}: {exc}")
                except RemoteError:
                    pass
                except Exception as exc:
                    failures.append(f"{method} {meta!r}: {type(exc).__name__}: {exc}")
            head = RequestHead(caller, "198.18.0.9", method, {}, 0)
            assert service._screen(head) is not None or method != "agg.contribute"
        for _ in range(300):  # the aggregator's screen sees every head
            meta = {rng.choice(KEYS): random_value(rng) for _ in range(rng.randrange(5))}
            refusal = service._screen(
                RequestHead(caller, f"198.18.1.{rng.randrange(250)}", "agg.contribute", meta, 0)
            )
            assert isinstance(refusal, RemoteError)
        assert not failures, "\n".join(failures[:10])
        nursery.cancel_scope.cancel()
