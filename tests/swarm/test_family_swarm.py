"""A Mixtral-style model (transformers' own attention, norms and rotary embeddings) whose
sparse blocks are volunteers' servers, on real peers: the same logits and router logits
as the model with every expert in this process, and it trains through the swarm (the
experts' gradients land in the volunteers' accumulators, the gate learns, the
load-balancing loss reaches it)."""

from __future__ import annotations

import pytest
import torch
import trio
from transformers import MixtralConfig

from core.experts.backend import ExpertBackend
from core.experts.server import ExpertServer, ServerConfig
from core.experts.uid import Grid
from core.families.mixtral import build_model, expert_spec, local_mixture
from core.families.remote import RemoteSparseBlock
from core.families.routing import GridGate, load_balancing_loss
from core.moe.client import ExpertCaller, Portal
from core.moe.finder import ExpertFinder
from core.moe.mixture import MoEConfig, RemoteMixtureOfExperts
from core.namespaces import moehome_validator
from net.testing import open_swarm

WEIGHTS_SEED = 7
CONFIG = MixtralConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    initializer_range=0.1,
)
GRIDS = [Grid(f"ffn{layer}", (2, 2)) for layer in range(CONFIG.num_hidden_layers)]


def tokens(batch: int = 4, seq: int = 16) -> torch.Tensor:
    """A sequence a model can learn: each token the previous one plus 3."""
    start = torch.arange(batch).unsqueeze(1) * 5
    return (start + 3 * torch.arange(seq)) % CONFIG.vocab_size


@pytest.mark.slow
async def test_a_mixtral_model_runs_and_trains_through_the_swarm():
    spec = expert_spec(CONFIG)
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        trainer, *volunteers = swarm.peers
        servers = []
        for volunteer in volunteers:  # both serve every expert, with the published weights
            backends = {
                str(uid): ExpertBackend(
                    uid, spec, local_mixture(CONFIG, grid, weights_seed=WEIGHTS_SEED).experts[i]
                )
                for grid in GRIDS
                for i, uid in enumerate(grid)
            }
            config = ServerConfig(announce_interval=1.0, announce_ttl=30.0)
            servers.append(await nursery.start(ExpertServer(volunteer, backends, config).run))
        caller = ExpertCaller(trainer.rpc, forward_timeout=10.0, backward_timeout=20.0)
        moe = MoEConfig(k_best=CONFIG.num_experts_per_tok, k_min=2, timeout_after_k_min=2.0)

        def remote_block(layer: int) -> RemoteSparseBlock:
            finder = ExpertFinder(trainer.dht, "demo", GRIDS[layer], cache_ttl=5.0)
            mixture = RemoteMixtureOfExperts(
                in_features=CONFIG.hidden_size,
                grid=GRIDS[layer],
                finder=finder,
                caller=caller,
                portal=Portal.current(),
                config=moe,
                own_gate=False,
            )
            return RemoteSparseBlock(GridGate(CONFIG.hidden_size, (2, 2)), mixture)

        local = build_model(
            CONFIG,
            lambda layer: local_mixture(
                CONFIG, GRIDS[layer], weights_seed=WEIGHTS_SEED, beam_search=True
            ),
            seed=1,
        )
        remote = build_model(CONFIG, remote_block, seed=1)
        missing, unexpected = remote.load_state_dict(local.state_dict(), strict=False)
        assert missing == []  # every trainer-side weight, the gates included
        assert all(".mlp.experts." in key for key in unexpected)  # the volunteers' part
        ids = tokens()

        def same_as_local() -> tuple[float, float]:
            with torch.no_grad():
                want, got = local(ids), remote(ids)
            logits = (want.logits - got.logits).abs().max().item()
            router = max(
                (a - b).abs().max().item()
                for a, b in zip(want.router_logits, got.router_logits, strict=True)
            )
            return logits, router

        logits_diff, router_diff = await trio.to_thread.run_sync(same_as_local)
        assert logits_diff < 1e-4
        assert router_diff < 1e-5

        optimizer = torch.optim.Adam(remote.parameters(), lr=3e-3)
        first = remote.blocks()[0]
        assert isinstance(first, RemoteSparseBlock)
        gate = first.gate.proj.weight
        before = gate.detach().clone()

        def train(steps: int) -> list[float]:
            losses = []
            for _ in range(steps):
                optimizer.zero_grad()
                out = remote(ids[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    out.logits.reshape(-1, CONFIG.vocab_size), ids[:, 1:].reshape(-1)
                )
                aux = load_balancing_loss(out.router_logits, CONFIG.num_experts_per_tok)
                torch.autograd.backward([loss + 0.02 * aux])
                optimizer.step()
                losses.append(float(loss.detach()))
            return losses

        losses = await trio.to_thread.run_sync(train, 15)
        assert losses[-1] < 0.8 * losses[0], losses
        assert not torch.equal(gate.detach(), before)  # the gate learned
        # the experts' gradients went to the volunteers, as contributions to come
        samples = sum(b.accumulator.samples for s in servers for b in s.backends.values())
        assert samples >= 15 * ids[:, :-1].numel() * CONFIG.num_experts_per_tok
        nursery.cancel_scope.cancel()
