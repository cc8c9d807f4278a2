"""How much a volunteer's device takes on: which device to compute on (the GPUs the
volunteer allows) and how many experts fit in the memory they allow. Pure functions,
plus one helper that asks torch and psutil for the real figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psutil
import torch

from core.experts.registry import ExpertSpec, build_expert

#: Bytes an expert needs per parameter byte while it serves: the weights, the gradient
#: of a backward pass, the accumulated sums (fp32), the error-feedback residual of the
#: contribution codec, and one spare copy while new weights are swapped in.
FOOTPRINT_FACTOR = 5.0
#: Share of the free memory a node takes when the volunteer set no cap.
DEFAULT_SHARE = 0.5
#: Most experts one node serves whatever its memory (the most `--experts` allows): a small
#: project's experts are tiny, and each needs min_contributors servers to learn (with 16,
#: two volunteers left half of the template's 32 experts with one server each, never learning).
MOST_EXPERTS = 64
#: Share of the budget kept for forward graphs that wait for their backward pass (the
#: trainers' keep-forwards): counted here, so serving never outgrows what was allowed.
GRAPH_SHARE = 0.25


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cuda:N" or "cpu"
    budget_bytes: int
    why: str


def choose_device(allowed: Sequence[int] | Literal["all"], cuda_count: int) -> str:
    """The first GPU the volunteer allows, or the CPU when none is allowed or present."""
    usable = range(cuda_count) if allowed == "all" else [i for i in allowed if i < cuda_count]
    return f"cuda:{usable[0]}" if len(usable) else "cpu"


def memory_budget(free_bytes: int, cap_gb: float | None) -> int:
    """The volunteer's cap when set (never more than what is free), else a share of the
    free memory: a node must never push the volunteer's own programs out."""
    if cap_gb is not None:
        return int(min(cap_gb * 1e9, free_bytes))
    return int(free_bytes * DEFAULT_SHARE)


def experts_that_fit(
    params_per_expert: int, bytes_per_param: int, budget_bytes: int, wanted: int | None
) -> int:
    """How many experts to serve: what fits in the budget, at most ``wanted`` (None: as
    many as fit, up to MOST_EXPERTS). Zero when not even one fits."""
    footprint = max(1.0, params_per_expert * bytes_per_param * FOOTPRINT_FACTOR)
    fit = int(budget_bytes * (1 - GRAPH_SHARE) // footprint)
    return max(0, min(fit, wanted if wanted is not None else MOST_EXPERTS))


def graph_cache_bytes(budget_bytes: int, experts: int) -> int:
    """Bytes of kept forward graphs each of ``experts`` served experts may hold."""
    return int(budget_bytes * GRAPH_SHARE // max(1, experts))


def parameter_count(spec: ExpertSpec) -> int:
    """Parameters of one expert of ``spec`` (built on the meta device: no memory used)."""
    with torch.device("meta"):
        module = build_expert(spec)
    return sum(p.numel() for p in module.parameters())


def plan_device(allowed: Sequence[int] | Literal["all"], cap_gb: float | None) -> DevicePlan:
    """The real device and budget of this machine."""
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = choose_device(allowed, cuda_count)
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        where = f"{torch.cuda.get_device_name(torch.device(device))} ({free / 1e9:.1f} GB free)"
    else:
        free = psutil.virtual_memory().available
        where = f"CPU ({free / 1e9:.1f} GB of RAM free)"
    budget = memory_budget(free, cap_gb)
    cap = f"your cap of {cap_gb:g} GB" if cap_gb is not None else f"{DEFAULT_SHARE:.0%} of free"
    return DevicePlan(device, budget, f"{where}; experts may fill {budget / 1e9:.2f} GB ({cap})")
