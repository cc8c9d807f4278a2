"""What ``moehome demo`` runs: how many volunteers, steps, churn, attackers, slow links."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoOptions:
    volunteers: int = 4
    steps: int = 200
    churn: bool = False
    attackers: int = 0
    attack: str = "sign-flip"
    slow: int = 0
    slow_ms: float = 100.0
    rule: str = "centered_clip"
    data: str = "stdlib"
    batch_size: int = 16
    workdir: Path | None = None
    #: the demo model: hidden width, experts per layer as a grid, experts per volunteer
    hidden: int = 64
    grid: tuple[int, ...] = (2, 4)
    mixture_layers: int = 2
    #: every volunteer serves every expert (16): each expert then has several servers,
    #: so each aggregation round compares several volunteers' gradients
    experts_per_volunteer: int = 16
    learning_rate: float = 3e-3
    eval_every: int = 100
    #: volunteers and the trainer behind NAT routers in network namespaces (net/lab.py)
    nat: bool = False
    #: with ``nat``: the volunteers' second home has a symmetric NAT, where hole punching
    #: fails (they are reached through relays)
    symmetric: bool = False
    #: with ``nat``: the bootstrap peer, one of the relays the volunteers hold places
    #: on, is killed halfway (SIGKILL); a second public relay joins the swarm
    kill_relay: bool = False
