"""What a swarm of 1,000 or 100,000 home volunteers could train, from the costs of one
sample (docs/scaling.md): a model, not a measurement. Its measured inputs come from
benchmarks/swarm_scaling.py (scheduling utilization, bytes on the wire per value).

    python benchmarks/scaling_model.py [--utilization 0.9] [--wire-bytes 0.38]
                                       [--uplink-mbit 20] [--volunteer-tflops 33]

Prints one JSON line per (model, volunteers): tokens/s of a decentralized mixture of
experts and what bounds it (the volunteers' compute or their uplinks), bytes per
volunteer per second, trainers needed, and aggregator bytes per round; beside it the
same volunteers training the largest dense model one of them holds, data-parallel
(gradients all-reduced every step) and DiLoCo-style (every ``H`` steps).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class MoEModel:
    name: str
    hidden: int
    inner: int
    #: feed-forward blocks in one expert (1: one FFN; more: a thicker expert, as a
    #: pipeline stage of SWARM parallelism, doing more compute per byte it receives)
    depth: int
    k: int  # experts per token and mixture layer
    layers: int  # mixture layers
    experts: int  # per mixture layer

    def expert_params(self) -> int:
        return 2 * self.hidden * self.inner * self.depth

    def flops_per_token_expert(self) -> float:
        """Forward and backward of one token through one expert (2 + 4 FLOPs per weight)."""
        return 6.0 * self.expert_params()

    def values_per_token_expert(self) -> int:
        """Values on the wire per token and expert: inputs and outputs, and their
        gradients (each ``hidden``); half of them leave the volunteer."""
        return 4 * self.hidden

    def active_params(self) -> int:
        return self.k * self.layers * self.expert_params()

    def total_params(self) -> int:
        return self.experts * self.layers * self.expert_params()


@dataclass(frozen=True)
class Links:
    #: measured: scheduling utilization of the volunteers' capacity
    utilization: float
    #: bytes per activation value on the wire (float32: 4; q4z measured: see docs)
    wire_bytes: float
    #: bytes per gradient value in a contribution, and per weight in an all-reduce
    gradient_bytes: float
    uplink: float  # bytes/s of a volunteer
    trainer_link: float  # bytes/s of a trainer, each way
    volunteer_flops: float  # effective FLOP/s of a volunteer's GPU
    volunteer_memory: float  # bytes of a volunteer's GPU
    #: the share of a volunteer's uplink its contributions may take (the rest carries
    #: activations): sets how often it contributes
    contribution_share: float = 0.25


#: bytes a volunteer holds per expert parameter: bfloat16 weights and a float32
#: gradient accumulator (the optimizer's state lives at the aggregator)
BYTES_PER_SERVED_PARAM = 6


def experts_per_volunteer(model: MoEModel, links: Links, most: int = 4) -> int:
    """Experts one volunteer serves: up to ``most``, in 60% of its GPU's memory (the rest
    for activations and kept graphs)."""
    fits = int(0.6 * links.volunteer_memory // (BYTES_PER_SERVED_PARAM * model.expert_params()))
    return min(most, fits)


def moe(model: MoEModel, links: Links, volunteers: int) -> dict[str, Any]:
    served = experts_per_volunteer(model, links)
    compute = links.volunteer_flops / model.flops_per_token_expert()
    up_per = model.values_per_token_expert() / 2 * links.wire_bytes
    link = (1 - links.contribution_share) * links.uplink / up_per
    per_volunteer = min(compute, link)  # token-experts per second
    units_per_token = model.k * model.layers
    tokens = volunteers * per_volunteer * links.utilization / units_per_token
    contribution = served * model.expert_params() * links.gradient_bytes
    servers_per_expert = volunteers * served / (model.experts * model.layers)
    trainer_bytes_per_token = units_per_token * up_per  # what the volunteers send
    return {
        "experts_per_volunteer": served,
        "tokens_per_s": round(tokens),
        "bound": "compute" if compute <= link else "uplink",
        "gpu_busy": round(per_volunteer / compute, 4),
        "volunteer_activation_up_bytes_per_s": round(per_volunteer * up_per),
        "contribution_bytes": round(contribution),
        "contribution_every_s": round(contribution / (links.contribution_share * links.uplink)),
        "trainer_bytes_per_token_each_way": round(trainer_bytes_per_token),
        "trainers_needed": round(tokens * trainer_bytes_per_token / links.trainer_link, 1),
        "servers_per_expert": round(servers_per_expert, 1),
        "aggregator_bytes_per_round_per_expert": round(
            servers_per_expert * model.expert_params() * links.gradient_bytes
        ),
    }


def dense(links: Links, volunteers: int, sync_every: int, tokens_per_step: int) -> dict[str, Any]:
    """The largest dense model one volunteer trains alone (weights, gradients and Adam's
    two moments in float32: 16 bytes per parameter), all-reduced (ring: each sends about
    twice the gradient) every ``sync_every`` steps of ``tokens_per_step`` tokens each."""
    params = links.volunteer_memory / 16
    compute_s = 6 * params * tokens_per_step * sync_every / links.volunteer_flops
    comm_s = 2 * params * links.gradient_bytes / links.uplink
    busy = compute_s / (compute_s + comm_s)  # no overlap
    return {
        "params": round(params),
        "sync_every": sync_every,
        "tokens_per_s": round(volunteers * links.volunteer_flops / (6 * params) * busy),
        "gpu_busy": round(busy, 4),
        "volunteer_up_bytes_per_s": round(comm_s * links.uplink / (compute_s + comm_s)),
    }


MODELS = [
    # 32 mixture layers of one-FFN experts at hidden 4096 (275B parameters, 17B active)
    MoEModel("ffn-4096", hidden=4096, inner=16384, depth=1, k=4, layers=32, experts=64),
    # 4 mixture layers of thick experts, 8 FFN blocks each, as pipeline stages (275B
    # parameters, 8.6B active)
    MoEModel("stage-4096x8", hidden=4096, inner=16384, depth=8, k=2, layers=4, experts=64),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--wire-bytes", type=float, nargs="+", default=[4.0, 0.38, 0.04])
    parser.add_argument("--gradient-bytes", type=float, default=1.0)
    parser.add_argument("--uplink-mbit", type=float, default=20.0)
    parser.add_argument("--trainer-gbit", type=float, default=1.0)
    parser.add_argument("--volunteer-tflops", type=float, default=33.0)
    parser.add_argument("--volunteer-gib", type=float, default=24.0)
    args = parser.parse_args()
    for wire in args.wire_bytes:
        links = Links(
            utilization=args.utilization,
            wire_bytes=wire,
            gradient_bytes=args.gradient_bytes,
            uplink=args.uplink_mbit * 1e6 / 8,
            trainer_link=args.trainer_gbit * 1e9 / 8,
            volunteer_flops=args.volunteer_tflops * 1e12,
            volunteer_memory=args.volunteer_gib * 2**30,
        )
        for model in MODELS:
            for volunteers in (1_000, 100_000):
                line = {
                    "model": model.name,
                    "wire_bytes": wire,
                    "volunteers": volunteers,
                    "active_params": model.active_params(),
                    "total_params": model.total_params(),
                    **moe(model, links, volunteers),
                }
                print(json.dumps({"benchmark": "scaling_model", **line}), flush=True)
    links = replace(links, gradient_bytes=2.0)  # bfloat16 gradients all-reduced
    for sync_every in (1, 500):
        for volunteers in (1_000, 100_000):
            line = {
                "model": "dense",
                "volunteers": volunteers,
                **dense(links, volunteers, sync_every, tokens_per_step=65_536),
            }
            print(json.dumps({"benchmark": "scaling_model", **line}), flush=True)


if __name__ == "__main__":
    main()
