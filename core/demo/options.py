"""What ``moehome demo`` runs: how many volunteers, steps, churn, attackers, slow links."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.experts.activations import ACTIVATION_CODECS


@dataclass(frozen=True)
class DemoOptions:
    volunteers: int = 4
    steps: int = 200
    churn: bool = False
    attackers: int = 0
    #: what the attackers do (core/demo/attacks.py, core/demo/cheats.py);
    #: several, comma-separated: the attackers take turns
    attack: str = "sign-flip"
    slow: int = 0
    slow_ms: float = 100.0
    rule: str = "centered_clip"
    data: str = "stdlib"
    batch_size: int = 16
    #: batches the trainer carries through the swarm at once: with 2, every volunteer
    #: 100 ms late keeps 0.87 of the demo's speed (0.61 with 1), for +2.5% loss at 200
    #: steps (benchmarks/trainer_local.py; docs/decisions/009-throughput.md)
    in_flight: int = 2
    #: the manifest's [model.wire]: one codec for activations and gradients, or
    #: "ACTIVATIONS/GRADIENTS". q4z: 4-bit blockwise codes deflated, ~0.1 of float32's
    #: bytes for ~1% of loss at equal samples
    wire: str = "q4z"
    workdir: Path | None = None
    #: at the end, the model exported and sampled (owner export, generate)
    sample: bool = True
    #: the demo model's family: "mixtral" (transformers' Mixtral layers, SwiGLU experts)
    #: or "byte" (moehome's small byte model)
    architecture: str = "mixtral"
    #: mixtral: a BPE tokenizer of this many tokens trained on the demo's data first
    #: (0: bytes, 257 tokens)
    vocab_size: int = 1024
    #: the demo model: hidden width, experts per layer as a grid, experts per volunteer
    hidden: int = 64
    grid: tuple[int, ...] = (2, 4)
    mixture_layers: int = 2
    #: every volunteer serves every expert (16): each expert then has several servers,
    #: so each aggregation round compares several volunteers' gradients
    experts_per_volunteer: int = 16
    learning_rate: float = 3e-3
    #: the manifest's ``[training] trainer_optimizer``: the trainer-side layers' (adamw
    #: or muon: core/trainer/optimizers.py)
    trainer_optimizer: str = "adamw"
    #: the manifest's rounds: volunteers contribute every so many seconds (or 2048
    #: samples), the aggregator steps every so many (or 6144 samples)
    contribution_seconds: float = 4.0
    round_seconds: float = 8.0
    eval_every: int = 100
    #: the share of expert answers the trainer recomputes (manifest [training.audit])
    answer_audit_rate: float = 0.05
    #: the share of accepted contributions the aggregators recompute
    contribution_audit_rate: float = 0.05
    #: with several trainers: steps between a trainer's changes of the shared trunk
    #: (core/trainer/trunk.py), and how long a round of them waits for every trainer
    trunk_sync_every: int = 2
    trunk_round_seconds: float = 5.0
    trunk_outer_learning_rate: float = 1.0
    trunk_outer_momentum: float = 0.0
    #: volunteers and the trainer behind NAT routers in network namespaces (net/testing/lab.py)
    nat: bool = False
    #: with ``nat``: the volunteers' second home has a symmetric NAT, where hole punching
    #: fails (they are reached through relays)
    symmetric: bool = False
    #: with ``nat``: the bootstrap peer, one of the relays the volunteers hold places
    #: on, is killed halfway (SIGKILL); a second public relay joins the swarm
    kill_relay: bool = False
    #: the public relays' limit of bytes per circuit one way, MiB (None: theirs, 64)
    relay_circuit_mib: float | None = None


def wire_codecs(wire: str) -> tuple[str, str]:
    """``"q4"`` -> (q4, q4); ``"q4/q3"`` -> (q4, q3); ValueError naming the known codecs."""
    names = wire.split("/")
    if len(names) == 1:
        names *= 2
    if len(names) != 2 or any(n not in ACTIVATION_CODECS for n in names):
        raise ValueError(
            f"{wire!r}: one codec or ACTIVATIONS/GRADIENTS, of {', '.join(ACTIVATION_CODECS)}"
        )
    return names[0], names[1]
