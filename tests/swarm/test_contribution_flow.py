"""Trainer -> volunteer -> aggregator: receipts, contributions and a new version, on real
peers; and the refusals a volunteer's server gives to requests without valid receipts."""

from __future__ import annotations

import pytest
import torch
import trio
from torch import nn

from core.aggregator.core import AggregatorCore, AggregatorSettings
from core.aggregator.service import AggregatorService
from core.contributing.puller import WeightsPuller
from core.contributing.sender import ContributionSender, SenderConfig
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import (
    ExpertCaller,
    ExpertCallError,
    ExpertServerRef,
    Portal,
    ReceiptSigner,
    RemoteExpert,
)
from core.namespaces import moehome_validator
from core.project.chunks import ChunkStore
from core.project.distribution import WeightsService
from core.protocol.aggregator_methods import STATS
from net.testing import open_swarm
from tests.reports import stats_of
from tests.waiting import eventually

SPEC = ExpertSpec("ffn", hidden=8, inner=16)
UID = "ffn0.0.0"
PROJECT = "0123456789abcdef0123456789abcdef"


async def test_gradients_travel_from_trainer_through_volunteer_to_a_new_version(tmp_path):
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer, aggregator = swarm.peers
        settings = AggregatorSettings(
            project=PROJECT,
            spec=SPEC,
            uids=(UID,),
            trainers=frozenset({trainer.identity.public_key}),
            optimizer="sgd",
            learning_rate=0.5,
            round_samples=16,
            round_seconds=3600,
        )
        core = AggregatorCore(settings, tmp_path / "agg", initial={UID: build_expert(SPEC, seed=1)})
        agg_store = ChunkStore(tmp_path / "agg-chunks")
        WeightsService.of(aggregator, agg_store)
        service = await nursery.start(AggregatorService(aggregator, core, store=agg_store).run)
        backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
        server = await nursery.start(
            ExpertServer(
                volunteer, {UID: backend}, ServerConfig(project=PROJECT, require_receipts=True)
            ).run
        )
        sender = await nursery.start(
            ContributionSender(
                volunteer,
                {UID: backend},
                [aggregator.peer_id],
                SenderConfig(project=PROJECT, every_samples=8, every_seconds=0.5),
            ).run
        )
        flushed_with_device_held: list[bool] = []

        async def flush_holding_the_device(uid: str) -> None:
            # no backward pass may add old-version receipts between the flush and the swap
            flushed_with_device_held.append(server.device.borrowed_tokens == 1)
            await sender.flush(uid)

        puller = WeightsPuller(
            volunteer,
            PROJECT,
            {UID: backend},
            [aggregator.identity.public_key],
            ChunkStore(tmp_path / "vol-chunks"),
            server.device,
            before_swap=flush_holding_the_device,
        )
        caller = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
        remote = RemoteExpert(
            UID, [ExpertServerRef(volunteer.peer_id, backend.sha256)], caller, Portal.current()
        )
        before = {k: v.clone() for k, v in core.modules[UID].state_dict().items()}

        def steps() -> None:
            for _ in range(4):
                x = torch.randn(4, 8, requires_grad=True)
                remote(x).pow(2).sum().backward()

        await trio.to_thread.run_sync(steps)
        with trio.fail_after(15):
            while core.versions[UID] < 1:
                await trio.sleep(0.1)
        assert sender.stats.accepted >= 1
        stats = stats_of((await trainer.rpc.call(aggregator.peer_id, STATS)).meta)
        assert stats["accepted"] >= 1
        assert stats["versions"] == {UID: 1}
        after = core.modules[UID].state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
        # the volunteer pulls version 1 from the aggregator and serves it
        with trio.fail_after(10):
            while not await puller.check(UID):
                await trio.sleep(0.2)
        assert backend.version == 1
        assert flushed_with_device_held == [True]
        assert backend.sha256 == core.weights_sha256(UID)
        newest = await puller.newest(UID)
        assert newest is not None
        assert newest.author == aggregator.peer_id
        core.close()
        nursery.cancel_scope.cancel()
        del service


async def test_a_volunteer_refuses_backward_requests_without_a_matching_receipt(tmp_path):
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
        await nursery.start(
            ExpertServer(
                volunteer, {UID: backend}, ServerConfig(project=PROJECT, require_receipts=True)
            ).run
        )
        ref = [ExpertServerRef(volunteer.peer_id, backend.sha256)]
        x, g = torch.randn(2, 8), torch.randn(2, 8)
        with pytest.raises(ExpertCallError, match="needs a signed receipt"):
            await ExpertCaller(trainer.rpc).backward(UID, ref, x, g)
        wrong_project = ExpertCaller(
            trainer.rpc, receipts=ReceiptSigner(trainer.identity, "f" * 32)
        )
        with pytest.raises(ExpertCallError, match="project"):
            await wrong_project.backward(UID, ref, x, g)
        good = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
        await good.backward(UID, ref, x, g)
        kept = await good.forward(UID, ref, x, keep=True)
        await good.backward(UID, ref, x, g, kept=kept)
        _, samples, receipts = backend.accumulator.take_with_receipts()
        assert samples == 4
        assert len(receipts) == 2
        assert all(r.trainer == trainer.identity.public_key for r in receipts)
        nursery.cancel_scope.cancel()


async def test_kept_graphs_of_two_experts_on_one_server_and_a_new_version(tmp_path):
    """Handles are numbered per expert (both experts' first graph is handle 1): the
    server must not mix up their inputs; and receipts name the version that answered."""
    uids = ["ffn0.0.0", "ffn0.0.1"]
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        backends = {
            uid: ExpertBackend(ExpertUID.parse(uid), SPEC, build_expert(SPEC, seed=i))
            for i, uid in enumerate(uids)
        }
        for backend in backends.values():
            backend.version = 3
        await nursery.start(
            ExpertServer(
                volunteer, backends, ServerConfig(project=PROJECT, require_receipts=True)
            ).run
        )
        caller = ExpertCaller(trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT))
        kept, inputs = {}, {uid: torch.randn(3, 8) for uid in uids}
        for uid in uids:
            ref = [ExpertServerRef(volunteer.peer_id, backends[uid].sha256, version=0)]
            kept[uid] = await caller.forward(uid, ref, inputs[uid], keep=True)
            assert kept[uid].handle is not None
            assert kept[uid].version == 3  # from the answer, not the (stale) declaration
        assert kept[uids[0]].handle == kept[uids[1]].handle
        for uid in uids:  # the receipt covers the inputs the server kept for this expert
            await caller.backward(
                uid, [kept[uid].server], inputs[uid], torch.randn(3, 8), kept=kept[uid]
            )
        assert caller.stats.graph_misses == 0
        for backend in backends.values():
            _, samples, receipts = backend.accumulator.take_with_receipts()
            assert samples == 3
            assert [r.version for r in receipts] == [3]
        nursery.cancel_scope.cancel()


async def backward_equals_local(remote: RemoteExpert, module: nn.Module, rows: int) -> None:
    """One step through ``remote`` (in a thread, as a trainer runs it): the input
    gradient is what ``module`` gives in this process."""
    x = torch.randn(rows, 8, requires_grad=True)

    def step() -> torch.Tensor:
        remote(x).pow(2).sum().backward()
        assert x.grad is not None
        return x.grad

    grad = await trio.to_thread.run_sync(step)
    local_x = x.detach().clone().requires_grad_(True)
    module(local_x).pow(2).sum().backward()
    assert local_x.grad is not None
    torch.testing.assert_close(grad, local_x.grad, atol=1e-5, rtol=1e-4)


async def test_a_kept_backward_that_timed_out_is_recomputed_on_another_server():
    """The kept-graph backward pass times out on the trainer's side after its server took
    the receipt; the recomputation goes to the other server with the same weights (the
    first would refuse the receipt as a batch used before), and the gradient is right."""
    rows = 4
    slow_kept = float(2 * rows)  # the pace sees a kept backward as 2 forward passes a row

    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, first, second = swarm.peers
        trainers = frozenset({trainer.identity.public_key})
        module = build_expert(SPEC, seed=1)
        backends = {}
        for volunteer, pace in [
            (first, lambda work: 3.0 if work == slow_kept else 0.0),
            (second, None),
        ]:
            backends[volunteer] = ExpertBackend(
                ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1)
            )
            config = ServerConfig(
                project=PROJECT, require_receipts=True, trainers=trainers, pace=pace
            )
            await nursery.start(ExpertServer(volunteer, {UID: backends[volunteer]}, config).run)
        caller = ExpertCaller(
            trainer.rpc,
            backward_timeout=1.0,
            receipts=ReceiptSigner(trainer.identity, PROJECT),
        )
        servers = [ExpertServerRef(p.peer_id, backends[p].sha256) for p in (first, second)]
        remote = RemoteExpert(UID, servers, caller, Portal.current())
        await backward_equals_local(remote, module, rows)
        # the second server recomputed; the first finishes the kept call it took
        assert backends[second].accumulator.samples == rows
        await eventually(lambda: backends[first].accumulator.samples == rows)
        nursery.cancel_scope.cancel()


async def test_a_kept_backward_that_timed_out_on_the_only_server_gets_its_first_answer():
    """The same with one server: the recomputation can only go back to it, with the same
    receipt. It waits for the first answer and gets it (it was refused as a batch used
    before, and the trainer lost its step); the batch is counted once."""
    rows = 4
    slow_kept = float(2 * rows)
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        module = build_expert(SPEC, seed=1)
        backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
        config = ServerConfig(
            project=PROJECT,
            require_receipts=True,
            trainers=frozenset({trainer.identity.public_key}),
            pace=lambda work: 3.0 if work == slow_kept else 0.0,
        )
        server = await nursery.start(ExpertServer(volunteer, {UID: backend}, config).run)
        # the kept call times out at 2 s (3 s of work); its repeat gets the answer at 3 s
        caller = ExpertCaller(
            trainer.rpc, backward_timeout=2.0, receipts=ReceiptSigner(trainer.identity, PROJECT)
        )
        servers = [ExpertServerRef(volunteer.peer_id, backend.sha256)]
        remote = RemoteExpert(UID, servers, caller, Portal.current())
        await backward_equals_local(remote, module, rows)
        assert server._answered.repeats == 1
        assert backend.accumulator.samples == rows  # counted once
        nursery.cancel_scope.cancel()
