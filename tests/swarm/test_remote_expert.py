"""A remote expert behaves like the same module run locally."""

from __future__ import annotations

import copy
import threading
import time
from contextlib import asynccontextmanager

import pytest
import torch
import trio

from core.experts.backend import ExpertBackend
from core.experts.records import ExpertAnnouncement, expert_key
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertCallError, ExpertServerRef, Portal, RemoteExpert
from core.namespaces import moehome_validator
from core.protocol.expert_methods import INFO
from net import Identity, Peer
from net.testing import open_swarm

FFN = ExpertSpec("ffn", hidden=16, inner=32)


@asynccontextmanager
async def served(
    specs: dict[str, ExpertSpec], peer: Peer, config: ServerConfig | None = None, seed: int = 0
):
    backends = {
        uid: ExpertBackend(ExpertUID.parse(uid), spec, build_expert(spec, seed=seed + i))
        for i, (uid, spec) in enumerate(specs.items())
    }
    async with trio.open_nursery() as nursery:
        server = await nursery.start(ExpertServer(peer, backends, config or ServerConfig()).run)
        yield server
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("spec", "shape"),
    [(FFN, (5, 16)), (ExpertSpec("swiglu", hidden=16, inner=32, activation="silu"), (5, 16))],
)
async def test_remote_expert_matches_the_local_module(spec, shape):
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        served({"ffn.0.1": spec}, swarm.node(0)) as server,
    ):
        backend = server.backends["ffn.0.1"]
        local = copy.deepcopy(backend.module).cpu()  # the server's may be on a GPU
        remote = RemoteExpert(
            "ffn.0.1",
            [ExpertServerRef(swarm.node(0).peer_id, backend.sha256)],
            ExpertCaller(swarm.node(1).rpc),
            Portal.current(),
        )
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))

        def run(module) -> tuple[torch.Tensor, torch.Tensor | None]:
            xi = x.clone().requires_grad_(True)
            y = module(xi)
            (y * torch.arange(y.numel()).reshape(y.shape).float().sin()).sum().backward()
            return y.detach(), xi.grad

        y_remote, gx_remote = await trio.to_thread.run_sync(run, remote)
        y_local, gx_local = run(local)
        torch.testing.assert_close(y_remote, y_local)
        torch.testing.assert_close(gx_remote, gx_local)
        sums, samples = backend.accumulator.take()
        assert samples == shape[0]
        for name, p in local.named_parameters():
            torch.testing.assert_close(sums[name].cpu(), p.grad, msg=name)


async def test_failover_to_another_server_of_the_same_expert():
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        served({"ffn.0.0": FFN}, swarm.node(0)) as s0,
        served({"ffn.0.0": FFN}, swarm.node(1)) as s1,
    ):
        dead = ExpertServerRef(Identity.generate().peer_id, s0.backends["ffn.0.0"].sha256)
        live = ExpertServerRef(swarm.node(1).peer_id, s1.backends["ffn.0.0"].sha256)
        caller = ExpertCaller(swarm.node(2).rpc)
        remote = RemoteExpert("ffn.0.0", [dead, live], caller, Portal.current())
        y = await trio.to_thread.run_sync(remote, torch.randn(2, 16))
        assert y.shape == (2, 16)
        assert caller.stats.failovers == 1


async def test_bad_inputs_get_clear_errors_and_the_server_goes_on():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        served({"ffn.0.0": FFN}, swarm.node(0)) as server,
    ):
        ref = ExpertServerRef(swarm.node(0).peer_id, server.backends["ffn.0.0"].sha256)
        caller = ExpertCaller(swarm.node(1).rpc)
        # a caller that sends another dtype than the expert's (the manifest's) is told
        wrong_dtype = ExpertCaller(swarm.node(1).rpc, dtype=torch.float64)
        with pytest.raises(ExpertCallError, match="float32"):
            await wrong_dtype.forward("ffn.0.0", [ref], torch.randn(2, 16))
        bad = [
            (torch.randn(2, 15), "hidden=16"),
            (torch.randn(2, 3, 16), r"\[batch, hidden\]"),
            (torch.full((2, 16), float("nan")), "NaN"),
            (torch.randn(5000, 16), "outside"),
        ]
        for x, words in bad:
            with pytest.raises(ExpertCallError, match=words):
                await caller.forward("ffn.0.0", [ref], x)
        with pytest.raises(ExpertCallError, match="not served here"):
            await caller.forward("ffn.9.9", [ref], torch.randn(2, 16))
        with pytest.raises(ExpertCallError, match="must match"):
            await caller.backward("ffn.0.0", [ref], torch.randn(2, 16), torch.randn(3, 16))
        y = (await caller.forward("ffn.0.0", [ref], torch.randn(2, 16))).outputs
        assert torch.isfinite(y).all()


async def test_kept_forward_graphs_serve_the_backward_pass_once_and_only_for_their_owner():
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        served({"ffn.0.0": FFN}, swarm.node(0)) as server,
    ):
        backend = server.backends["ffn.0.0"]
        ref = ExpertServerRef(swarm.node(0).peer_id, backend.sha256)
        caller = ExpertCaller(swarm.node(1).rpc)
        x, g = torch.randn(4, 16), torch.randn(4, 16)

        kept = await caller.forward("ffn.0.0", [ref], x, keep=True)
        assert kept.handle is not None
        grad_kept = await caller.backward("ffn.0.0", [ref], x, g, kept=kept)
        assert backend.graphs.hits == 1
        assert caller.stats.graph_misses == 0
        grad_recomputed = await caller.backward("ffn.0.0", [ref], x, g)
        torch.testing.assert_close(grad_kept, grad_recomputed)

        # a handle is used once: the second time the caller falls back to recomputing
        again = await caller.backward("ffn.0.0", [ref], x, g, kept=kept)
        torch.testing.assert_close(again, grad_recomputed)
        assert caller.stats.graph_misses == 1

        # another peer cannot use someone else's graph
        kept = await caller.forward("ffn.0.0", [ref], x, keep=True)
        thief = ExpertCaller(swarm.node(2).rpc)
        await thief.backward("ffn.0.0", [ref], x, g, kept=kept)
        assert thief.stats.graph_misses == 1
        assert len(backend.graphs) == 1  # still there for its owner
        _, samples = backend.accumulator.take()
        assert samples == 4 * 4


async def test_forward_without_grad_keeps_nothing():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        served({"ffn.0.0": FFN}, swarm.node(0)) as server,
    ):
        backend = server.backends["ffn.0.0"]
        remote = RemoteExpert(
            "ffn.0.0",
            [ExpertServerRef(swarm.node(0).peer_id, backend.sha256)],
            ExpertCaller(swarm.node(1).rpc),
            Portal.current(),
        )

        def infer():
            with torch.no_grad():
                return remote(torch.randn(2, 16))

        await trio.to_thread.run_sync(infer)
        assert len(backend.graphs) == 0


async def test_the_network_keeps_answering_while_a_batch_computes():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        served({"ffn.0.0": FFN}, swarm.node(0)) as server,
    ):
        backend = server.backends["ffn.0.0"]
        slow_forward = backend.forward
        computing = trio.Event()
        computed = threading.Event()  # set by the batch's thread when it ends
        token = trio.lowlevel.current_trio_token()

        def slow(x, keep=False, owner=None):
            trio.from_thread.run_sync(computing.set, trio_token=token)
            time.sleep(1.0)  # a long batch on the device
            computed.set()
            return slow_forward(x, keep, owner)

        backend.forward = slow
        ref = ExpertServerRef(swarm.node(0).peer_id, backend.sha256)
        caller = ExpertCaller(swarm.node(1).rpc)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller.forward, "ffn.0.0", [ref], torch.randn(2, 16))
            await computing.wait()
            info = await swarm.node(1).rpc.call(swarm.node(0).peer_id, INFO, {"uid": "ffn.0.0"})
            # answered while the batch still computed (an order, not a time: the answer's
            # round trip is this machine's load)
            assert not computed.is_set()
        assert info.meta["spec"] == FFN.to_dict()
        assert info.meta["sha256"] == backend.sha256
        assert info.meta["uid"] == "ffn.0.0"


async def test_declarations_are_withdrawn_on_shutdown():
    async with open_swarm(3, validator=moehome_validator()) as swarm:
        key = expert_key("demo", "ffn.0.0")
        async with served({"ffn.0.0": FFN}, swarm.node(0)):
            (record,) = await swarm.node(2).dht.get(key)
            assert ExpertAnnouncement.decode(record.value).state == "serving"
        (record,) = await swarm.node(2).dht.get(key)
        assert ExpertAnnouncement.decode(record.value).state == "withdrawn"
