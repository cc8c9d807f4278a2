"""Compressed activations between real peers: a trainer with a project's codecs and a
volunteer that requires receipts agree on every bit the receipts hash, and the expert
learns from exactly what the wire delivered."""

from __future__ import annotations

import copy

import pytest
import torch
import trio

from core.experts import activations
from core.experts.activations import WireCodecs
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import ExpertUID
from core.moe.client import ExpertCaller, ExpertServerRef, Portal, ReceiptSigner, RemoteExpert
from core.namespaces import moehome_validator
from core.protocol.expert_methods import FORWARD
from net import RemoteError, Tensor
from net.testing import open_swarm

SPEC = ExpertSpec("ffn", hidden=64, inner=128)
UID = "ffn0.0.0"
PROJECT = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("act", "grad"),
    [("raw", "raw"), ("f16", "bf16"), ("q8", "q8"), ("q4", "q3"), ("q4z", "q4z")],
)
async def test_an_expert_learns_from_what_the_wire_delivered(act, grad, monkeypatch):
    codecs = WireCodecs(act, grad)
    # the gradients' parts, as encoded (rounded at random) by the trainer
    gradient_parts: list[list[Tensor]] = []
    encode = activations.encode

    def recording(t, name, *, stochastic=False):
        parts = encode(t, name, stochastic=stochastic)
        if stochastic and not gradient_parts:
            gradient_parts.append(parts)
        return parts

    monkeypatch.setattr(activations, "encode", recording)
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
        local = copy.deepcopy(backend.module)
        config = ServerConfig(
            project=PROJECT,
            require_receipts=True,
            trainers=frozenset({trainer.identity.public_key}),
        )
        await nursery.start(ExpertServer(volunteer, {UID: backend}, config).run)
        caller = ExpertCaller(
            trainer.rpc, receipts=ReceiptSigner(trainer.identity, PROJECT), codecs=codecs
        )
        remote = RemoteExpert(
            UID, [ExpertServerRef(volunteer.peer_id, backend.sha256)], caller, Portal.current()
        )
        x = torch.randn(40, 64, generator=torch.Generator().manual_seed(2))
        weights = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            xi = x.clone().requires_grad_(True)
            y = remote(xi)
            (y * weights).sum().backward()
            assert xi.grad is not None
            return y.detach(), xi.grad

        # the backward pass goes through the kept graph; its receipt must match what the
        # server decoded in the forward pass, bit for bit, or the server refuses it
        y, grad_x = await trio.to_thread.run_sync(step)
        sums, samples = backend.accumulator.take()
        assert samples == 40

        # what the server computed: the expert on the decoded inputs, its gradient from
        # the decoded output gradients
        seen_x = activations.roundtrip(x, act).requires_grad_(True)
        y_local = local(seen_x)
        (parts,) = gradient_parts
        y_local.backward(activations.decode(parts, grad, width=64, dtype=torch.float32))
        for name, p in local.named_parameters():
            torch.testing.assert_close(sums[name], p.grad, msg=name)
        assert seen_x.grad is not None
        for got, want, codec in ((y, y_local.detach(), act), (grad_x, seen_x.grad, grad)):
            # within one quantization step of the codec (a value on a rounding boundary
            # may land on either side; a gradient is rounded up or down at random)
            levels = {"q4": 7, "q4z": 7, "q3": 3}.get(codec, 127)
            step_size = want.abs().max() / levels
            tolerance = (
                float(step_size) if codec.startswith("q") else 1e-2 * float(want.abs().max())
            )
            torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
        # the caller counted the bytes: 4 tensors of 40 x 64 values
        assert caller.stats.float32_bytes == 4 * 40 * 64 * 4
        ratio = caller.stats.wire_bytes / caller.stats.float32_bytes
        expected = {
            "raw": 1.0,
            "f16": 0.5,
            "q8": (1 + 2 / 64) / 4,
            "q4": (0.5 + 2 / 64 + 3 / 8 + 2 / 64) / 8,
        }
        if act == "q4z":  # deflated: under q4's bytes, by how much depends on the values
            assert ratio < (0.5 + 2 / 64) / 4
        else:
            assert ratio == pytest.approx(expected[act])
        nursery.cancel_scope.cancel()


async def test_a_request_with_parts_that_do_not_fit_is_refused_and_the_server_goes_on():
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, volunteer = swarm.peers
        backend = ExpertBackend(ExpertUID.parse(UID), SPEC, build_expert(SPEC, seed=1))
        await nursery.start(ExpertServer(volunteer, {UID: backend}, ServerConfig()).run)
        x = torch.randn(3, 64)
        q4 = activations.encode(x, "q4")
        wrong: list[tuple[dict[str, object], list[Tensor], str]] = [
            ({"uid": UID, "codecs": ["q4"]}, q4[:1], "expected 2 tensor"),
            ({"uid": UID, "codecs": ["q9"]}, q4, "unknown activation codec"),
            ({"uid": UID, "codecs": "q4"}, q4, "codecs must name 1"),
            (
                {"uid": UID, "codecs": ["q4"]},
                activations.encode(torch.randn(3, 48), "q4"),
                "do not fit",
            ),
            ({"uid": UID, "codecs": ["q4"], "answer": "zip"}, q4, "unknown activation codec"),
        ]
        for meta, parts, words in wrong:
            with pytest.raises(RemoteError, match=words):
                await trainer.rpc.call(volunteer.peer_id, FORWARD, meta, parts)
        reply = await trainer.rpc.call(
            volunteer.peer_id, FORWARD, {"uid": UID, "codecs": ["q4"], "answer": "q3"}, q4
        )
        assert reply.meta["codec"] == "q3"
        y = activations.decode(reply.tensors, "q3", width=64, dtype=torch.float32)
        assert y.shape == (3, 64)
        nursery.cancel_scope.cancel()
