"""How much a volunteer's device takes on: which device to compute on (the GPUs the
volunteer allows) and how many experts fit in the memory they allow. Pure functions,
plus one helper that asks torch and psutil for the real figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psutil
import torch

from core.node.compute_device import decide, this_machine

#: Bytes of gradient sums per parameter: float32 whatever the expert's dtype (16-bit sums
#: of many backward passes would lose the small ones).
SUM_BYTES = 4
#: Bytes per parameter the planner counted before the footprint followed the dtype
#: (float32 x 5: weights, a backward pass's gradient, the sums, the codec's residual and
#: a spare copy, all per expert): benchmarks/gpu_expert.py compares with it.
FORMER_BYTES_PER_PARAM = 20.0
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


@dataclass(frozen=True)
class Footprint:
    """Bytes a served expert holds on the compute device, per parameter.

    ``per_expert``: every served expert's weights (the project's dtype), its float32
    gradient sums and the weights of its previous version, kept while forward graphs
    made on them wait for their backward pass (older versions only within the kept-graph
    share: core/experts/backend.py). On the CPU the contribution codec's float32
    residual too; a GPU node keeps it in RAM. ``once``: held for one expert at a time, so
    counted once per device: a backward pass's parameter gradient (dtype) and the new
    weights being swapped in (dtype)."""

    per_expert: float
    once: float


def footprint(weight_bytes: int, *, on_gpu: bool) -> Footprint:
    residual = 0 if on_gpu else SUM_BYTES
    return Footprint(2 * weight_bytes + SUM_BYTES + residual, 2 * weight_bytes)


def experts_that_fit(
    params_per_expert: int,
    weight_bytes: int,
    budget_bytes: int,
    wanted: int | None,
    *,
    on_gpu: bool = False,
) -> int:
    """How many experts to serve: what fits in the budget beside the kept graphs' share,
    at most ``wanted`` (None: as many as fit, up to MOST_EXPERTS). Zero when not even one
    fits. ``weight_bytes``: bytes of one weight in the project's dtype."""
    bytes_of = footprint(weight_bytes, on_gpu=on_gpu)
    room = budget_bytes * (1 - GRAPH_SHARE) - params_per_expert * bytes_of.once
    fit = int(max(0.0, room) // max(1.0, params_per_expert * bytes_of.per_expert))
    return max(0, min(fit, wanted if wanted is not None else MOST_EXPERTS))


def params_per_gb(weight_bytes: int, *, on_gpu: bool) -> float:
    """Expert parameters a node serves per GB of its budget (large experts, many of
    them: the once-per-device part vanishes)."""
    return 1e9 * (1 - GRAPH_SHARE) / footprint(weight_bytes, on_gpu=on_gpu).per_expert


def graph_cache_bytes(budget_bytes: int, experts: int) -> int:
    """Bytes of kept forward graphs each of ``experts`` served experts may hold."""
    return int(budget_bytes * GRAPH_SHARE // max(1, experts))


def plan_device(allowed: Sequence[int] | Literal["all"], cap_gb: float | None) -> DevicePlan:
    """The real device and budget of this machine."""
    # the device the node says it computes on (core/node/compute_device.py)
    compute = decide(this_machine(), allowed)
    device = compute.device
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        where = f"{torch.cuda.get_device_name(torch.device(device))} ({free / 1e9:.1f} GB free)"
    else:  # the CPU, or an Apple GPU (it shares the RAM)
        free = psutil.virtual_memory().available
        where = f"{compute.line} ({free / 1e9:.1f} GB of RAM free)"
    budget = memory_budget(free, cap_gb)
    cap = f"your cap of {cap_gb:g} GB" if cap_gb is not None else f"{DEFAULT_SHARE:.0%} of free"
    return DevicePlan(device, budget, f"{where}; experts may fill {budget / 1e9:.2f} GB ({cap})")
