"""RemoteMixtureOfExperts over real serving peers: routing, training, churn, failures."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import torch
import trio
from torch import nn

from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID, Grid
from core.moe.client import ExpertCaller, Portal
from core.moe.finder import ExpertFinder, advance_beams
from core.moe.load import ServerLoads
from core.moe.mixture import MoEConfig, MoEError, RemoteMixtureOfExperts
from core.namespaces import moehome_validator
from core.protocol.expert_methods import FORWARD
from net import Peer
from net.testing import Swarm, open_swarm
from tests.waiting import eventually

HIDDEN = 8
SPEC = ExpertSpec("ffn", hidden=HIDDEN, inner=16)
GRID = Grid("ffn", (2, 2))


@pytest.mark.parametrize(
    ("beams", "scores", "alive", "k", "last", "expected"),
    [
        (
            [("ffn.", 0.0)],
            [0.1, 0.9, 0.5],
            {"ffn.": frozenset({0, 1, 2})},
            2,
            False,
            [("ffn.1.", 0.9), ("ffn.2.", 0.5)],
        ),
        (
            [("ffn.", 0.0)],
            [0.1, 0.9, 0.5],
            {"ffn.": frozenset({0})},
            2,
            False,
            [("ffn.0.", 0.1)],
        ),  # only live ones
        (
            [("ffn.1.", 1.0), ("ffn.0.", 0.5)],
            [0.0, 0.2],
            {"ffn.1.": frozenset({0}), "ffn.0.": frozenset({1})},
            2,
            True,
            [("ffn.1.0", 1.0), ("ffn.0.1", 0.7)],
        ),
        (
            [("ffn.", 0.0)],
            [0.3, 0.3],
            {"ffn.": frozenset({0, 1, 7})},
            3,
            True,
            [("ffn.0", 0.3), ("ffn.1", 0.3)],
        ),  # off-grid 7 ignored
        ([("ffn.", 0.0)], [1.0], {}, 2, True, []),
    ],
)
def test_advance_beams(beams, scores, alive, k, last, expected):
    assert advance_beams(beams, scores, alive, k, last=last) == expected


#: Declarations outlive many announce rounds: these swarms share one trio loop with a
#: training thread, which on two busy cores held the loop for 3 s, so a 3 s ttl let a live
#: server's records expire between two rounds (a dead server's records linger instead:
#: the finder skips a server whose call failed).
ANNOUNCE_TTL = 30.0


def make_server(
    peer: Peer, uids: list[str], *, seed: int = 0, config: ServerConfig | None = None
) -> ExpertServer:
    backends = {
        uid: ExpertBackend(ExpertUID.parse(uid), SPEC, build_expert(SPEC, seed=seed + i))
        for i, uid in enumerate(uids)
    }
    return ExpertServer(
        peer, backends, config or ServerConfig(announce_interval=1.0, announce_ttl=ANNOUNCE_TTL)
    )


@dataclass
class Harness:
    swarm: Swarm
    nursery: trio.Nursery
    servers: list[ExpertServer]
    layer: RemoteMixtureOfExperts


@asynccontextmanager
async def moe_swarm(layout: list[list[str]], **moe_config):
    """Peers 0..n-1 serve the given uids; the last peer is the trainer."""
    async with (
        open_swarm(len(layout) + 1, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        servers = []
        for i, uids in enumerate(layout):
            servers.append(await nursery.start(make_server(swarm.node(i), uids, seed=10 * i).run))
        trainer = swarm.node(len(layout))
        finder = ExpertFinder(trainer.dht, "demo", GRID, cache_ttl=0.5, failure_backoff=0.5)
        caller = ExpertCaller(trainer.rpc, forward_timeout=3.0, backward_timeout=3.0)
        config = MoEConfig(
            **{
                "k_best": 2,
                "k_min": 1,
                "timeout_after_k_min": 0.5,
                "forward_timeout": 5.0,
                **moe_config,
            }
        )
        layer = RemoteMixtureOfExperts(
            in_features=HIDDEN,
            grid=GRID,
            finder=finder,
            caller=caller,
            portal=Portal.current(),
            config=config,
        )
        yield Harness(swarm, nursery, servers, layer)
        nursery.cancel_scope.cancel()


class Model(nn.Module):
    def __init__(self, moe: RemoteMixtureOfExperts) -> None:
        super().__init__()
        self.inp = nn.Linear(4, HIDDEN)
        self.moe = moe
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x):
        return self.out(self.moe(torch.tanh(self.inp(x))))


def train_steps(model, opt, data, steps):
    x, y = data
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def task(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, :1] * 2 - x[:, 1:2]).tanh()


async def test_mixture_routes_to_live_experts_and_gradients_flow():
    async with moe_swarm([["ffn.0.0", "ffn.0.1"], ["ffn.1.0", "ffn.1.1"]]) as h:
        x = torch.randn(16, HIDDEN, requires_grad=True)

        def step():
            out = h.layer(x)
            out.sum().backward()
            return out

        out = await trio.to_thread.run_sync(step)
        assert out.shape == (16, HIDDEN)
        assert x.grad is not None
        assert x.grad.abs().sum() > 0
        assert h.layer.proj.weight.grad is not None
        assert h.layer.proj.weight.grad.abs().sum() > 0
        assert sum(h.layer.stats.called.values()) == h.layer.stats.expert_calls > 0
        samples = sum(b.accumulator.samples for s in h.servers for b in s.backends.values())
        assert samples > 0  # parameter gradients landed in the servers' accumulators


@pytest.mark.slow
async def test_training_goes_on_when_a_node_dies_and_picks_up_a_new_server():
    layout = [["ffn.0.0", "ffn.0.1"], ["ffn.1.0", "ffn.1.1"], ["ffn.0.0", "ffn.1.1"]]
    async with moe_swarm(layout) as h:
        model = Model(h.layer)
        opt = torch.optim.Adam([p for n, p in model.named_parameters()], lr=0.03)
        data = task()
        first = await trio.to_thread.run_sync(train_steps, model, opt, data, 10)

        h.swarm.stop(h.swarm.node(1))  # the only server of ffn.1.0 dies mid-run
        after_death = await trio.to_thread.run_sync(train_steps, model, opt, data, 10)
        assert all(torch.isfinite(torch.tensor(after_death)))

        # a new volunteer starts serving ffn.1.0
        newcomer = await h.swarm.add()
        new_server = await h.nursery.start(make_server(newcomer, ["ffn.1.0"], seed=99).run)
        # the trainer's beam search sees ffn.1.0 again, served by the newcomer, once the
        # finder's cache expired (the dead server's declaration may linger; calls skip it)
        finder = h.layer.finder

        async def found() -> bool:
            return newcomer.peer_id in [s.peer_id for s in await finder.servers("ffn.1.0")]

        async def routed_to() -> bool:
            # the grid's prefix records are cached apart from the expert's own (and the
            # newcomer stores them after it): routing may see the expert a cache_ttl later
            return "ffn.1.0" in (await finder.beam_search([[[0.0, 0.0]], [[0.0, 0.0]]], 4))[0]

        await eventually(found, 10)
        await eventually(routed_to, 2 * finder.cache_ttl)
        last = await trio.to_thread.run_sync(train_steps, model, opt, data, 10)
        assert min(last) < first[0] * 0.7, (first, after_death, last)
        # and it answers calls: ask it directly through the layer's own caller
        result = await h.layer.caller.forward(
            "ffn.1.0", await finder.servers("ffn.1.0"), torch.randn(2, HIDDEN)
        )
        assert result.server.peer_id == newcomer.peer_id
        assert new_server.backends["ffn.1.0"].uid.coords == (1, 0)


async def test_an_expert_that_answers_nan_is_masked_out():
    async with moe_swarm([["ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"]], k_best=4) as h:
        with torch.no_grad():
            for p in h.servers[0].backends["ffn.0.1"].module.parameters():
                p.fill_(float("nan"))
        out = await trio.to_thread.run_sync(h.layer, torch.randn(8, HIDDEN))
        assert torch.isfinite(out).all()
        assert h.layer.stats.anomalies >= 1


async def test_a_node_that_stops_answering_costs_only_the_grace_period():
    async with moe_swarm(
        [["ffn.0.0", "ffn.0.1"], ["ffn.1.0", "ffn.1.1"]], k_best=4, timeout_after_k_min=0.3
    ) as h:

        async def hang(ctx):
            await trio.sleep(60)

        h.swarm.node(1).rpc._handlers[FORWARD] = hang  # alive, connected, silent
        t0 = trio.current_time()
        out = await trio.to_thread.run_sync(h.layer, torch.randn(8, HIDDEN))
        assert trio.current_time() - t0 < 3
        assert torch.isfinite(out).all()
        assert h.layer.stats.late_calls == 2
        # 8 samples x 4 experts: the silent node's two experts' rows computed for nothing
        assert (h.layer.stats.forward_rows, h.layer.stats.late_rows) == (16, 16)
        # the batch's time in its forward calls: the grace it gave the silent node too
        waited = h.layer.stats.forward_s
        assert 0.3 <= waited < 3
        await trio.to_thread.run_sync(lambda: out.sum().backward())
        assert h.layer.stats.backward_rows == 16  # only the answered calls' rows
        assert h.layer.stats.backward_s > 0
        # an evaluation's pass (no backward follows) is not a training batch's time
        spent = (h.layer.stats.plan_s, h.layer.stats.forward_s, h.layer.stats.backward_s)
        await trio.to_thread.run_sync(torch.no_grad()(h.layer), torch.randn(8, HIDDEN))
        assert (h.layer.stats.plan_s, h.layer.stats.forward_s, h.layer.stats.backward_s) == spent


async def test_k_min_not_reached_raises_unless_zero_outputs_are_allowed():
    async with moe_swarm([["ffn.0.0"]], k_best=2, k_min=2) as h:
        with pytest.raises(MoEError, match="k_min=2"):
            await trio.to_thread.run_sync(h.layer, torch.randn(4, HIDDEN))
    async with moe_swarm([["ffn.0.0"]], k_best=2, k_min=2, allow_zero_outputs=True) as h:
        out = await trio.to_thread.run_sync(h.layer, torch.randn(4, HIDDEN))
        assert out.shape == (4, HIDDEN)


async def test_withdrawn_experts_are_not_chosen():
    async with moe_swarm([["ffn.0.0", "ffn.0.1"], ["ffn.1.0", "ffn.1.1"]], k_best=4) as h:
        await h.servers[1].pause()
        h.layer.finder.forget()  # the withdrawal is stored; drop what the trainer cached
        await trio.to_thread.run_sync(h.layer, torch.randn(8, HIDDEN))
        assert h.layer.stats.called["ffn.1.0"] == 0
        assert h.layer.stats.called["ffn.1.1"] == 0
        assert h.layer.stats.called["ffn.0.0"] >= 1


async def test_a_long_call_is_split_over_an_experts_servers_and_put_back_together():
    """With the servers' speed and links known, an expert's rows go in parts to several of
    its servers (core/moe/load.py ``ServerLoads.plan``); outputs and input gradients are
    those of one call per expert."""
    uids = [str(u) for u in GRID]
    slow = ServerConfig(
        announce_interval=1.0, announce_ttl=ANNOUNCE_TTL, pace=lambda rows: 0.005 * rows
    )
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        for i in (0, 1):  # the same weights on both
            await nursery.start(make_server(swarm.node(i), uids, config=slow).run)
        trainer = swarm.node(2)
        loads = ServerLoads()
        layer = RemoteMixtureOfExperts(
            in_features=HIDDEN,
            grid=GRID,
            finder=ExpertFinder(trainer.dht, "demo", GRID, cache_ttl=0.2),
            caller=ExpertCaller(trainer.rpc, forward_timeout=30.0, backward_timeout=30.0),
            portal=Portal.current(),
            config=MoEConfig(k_best=1, k_min=1, forward_timeout=60.0, timeout_after_k_min=30.0),
        )
        # equal gating scores: every sample takes the same expert (ties go by name), 256
        # rows, ~3.8 s of work (random gating left some expert too few rows to split, now
        # and then; two experts of 256 rows each on two servers are one call each: the
        # phase's work is levelled, not each expert cut)
        assert layer.proj is not None
        with torch.no_grad():
            layer.proj.weight.zero_()
            layer.proj.bias.zero_()
        x = torch.randn(256, HIDDEN)

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            leaf = x.clone().requires_grad_(True)
            out = layer(leaf)
            out.square().sum().backward()
            assert leaf.grad is not None
            return out.detach(), leaf.grad

        await eventually(lambda: _all_found(layer, uids))
        whole, whole_grad = await trio.to_thread.run_sync(run)  # no loads: one call each
        assert layer.stats.expert_calls == 1
        layer.caller.loads = loads
        await trio.to_thread.run_sync(run)  # the servers' speeds and links become known
        peers = [swarm.node(i).peer_id for i in (0, 1)]
        assert loads.parts(peers, 256, 3.0) == 2
        before = layer.stats.expert_calls
        split, split_grad = await trio.to_thread.run_sync(run)
        assert layer.stats.expert_calls - before == 2
        assert torch.allclose(split, whole, atol=1e-5)
        assert torch.allclose(split_grad, whole_grad, atol=1e-5)
        answered = layer.stats.answered_by
        assert all(answered[str(p)] > 0 for p in peers)
        nursery.cancel_scope.cancel()


async def _all_found(layer: RemoteMixtureOfExperts, uids: list[str]) -> bool:
    found = [len(await layer.finder.servers(u)) for u in uids]
    return found == [2] * len(uids)
