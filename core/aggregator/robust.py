"""Robust aggregation rules. Pure functions of flat gradient vectors (no I/O, no state
beyond what is passed in), so they are tested with tables and simulated attacks.

The default is centered clipping (Karimireddy, He, Jaggi, ICML 2021) around the previous
round's aggregate (its "history", which is what makes it resist attacks spread over
time), after bucketing (Karimireddy et al., ICLR 2022): inputs are shuffled into buckets
of ``bucket_size`` and averaged, which shrinks honest variance and so the room an attacker
has to hide in. Coordinate-wise median and trimmed mean are options; the plain mean is for
comparison only (one attacker can move it anywhere).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.aggregator.compact import Q8
from core.project.manifest import RuleName

Rule = Callable[[torch.Tensor, "RoundContext"], torch.Tensor]


@dataclass
class RoundContext:
    """What a rule may know besides this round's inputs."""

    previous: torch.Tensor | None = None  # last round's aggregate (the CC center)
    clip_radius: float = 1.0
    #: When True, the radius is clip_radius x the median distance to the center.
    adaptive_radius: bool = True
    clip_iterations: int = 3
    trim_fraction: float = 0.2
    bucket_size: int = 2
    generator: torch.Generator | None = None


def mean(x: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
    return x.mean(dim=0)


def coordinate_median(x: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
    # torch.median picks the lower middle value for an even count; average the two
    # middle values instead, so that two inputs give their mean
    n = x.shape[0]
    ordered = x.sort(dim=0).values
    if n % 2:
        return ordered[n // 2]
    return 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def trimmed_mean(x: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
    n = x.shape[0]
    k = min(int(ctx.trim_fraction * n), (n - 1) // 2)
    ordered = x.sort(dim=0).values
    return ordered[k : n - k].mean(dim=0)


def centered_clip(x: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
    """v <- v + mean_i clip(x_i - v, radius), a few times, from the previous aggregate;
    on the first round from the coordinate median when there are three inputs or more,
    else from zero: the median of two inputs is their mean, so an attacker meeting one
    honest contributor in an expert's first round moved the result half its way (x1000
    gradients gave a 500x aggregate, and the attack test failed now and then)."""
    n = x.shape[0]
    if ctx.previous is not None:
        v = ctx.previous.clone()
    elif n >= 3:
        v = coordinate_median(x, ctx)
    else:
        v = torch.zeros_like(x[0])
    for _ in range(ctx.clip_iterations):
        diff = x - v
        norms = diff.norm(dim=1).clamp_min(1e-12)
        radius = ctx.clip_radius
        if ctx.adaptive_radius:
            # a multiple of the median distance: with fewer than half attackers, that
            # median is an honest input's, so the radius follows the gradients' scale
            radius = ctx.clip_radius * float(norms.median())
        scale = (radius / norms).clamp(max=1.0)
        v = v + (scale @ diff) / n  # mean of the clipped differences, as one product
    return v


RULES: dict[RuleName, Rule] = {
    "centered_clip": centered_clip,
    "median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "mean": mean,
}


def bucket(x: torch.Tensor, size: int, generator: torch.Generator | None) -> torch.Tensor:
    """Shuffle the rows into groups of ``size`` and average each group."""
    if size <= 1 or x.shape[0] < 2:
        return x
    order = torch.randperm(x.shape[0], generator=generator)
    groups = [order[i : i + size] for i in range(0, x.shape[0], size)]
    return torch.stack([x[g].mean(dim=0) for g in groups])


def aggregate(rule: RuleName, inputs: Sequence[torch.Tensor], ctx: RoundContext) -> torch.Tensor:
    """The robust aggregate of flat vectors (each one contribution's per-sample gradient).
    Bucketing applies to every rule but the plain mean."""
    if not inputs:
        raise ValueError("nothing to aggregate")
    flat = [t.reshape(-1).to(torch.float32) for t in inputs]
    # bucketing needs enough inputs: with two buckets or fewer, a bucket holding an
    # attacker is half the vote and the rule cannot tell it from the honest one (two
    # inputs in one bucket would even make it the plain mean)
    if rule != "mean" and ctx.bucket_size > 1 and -(-len(flat) // ctx.bucket_size) >= 3:
        # bucket straight from the list: no full copy of every input first
        order = torch.randperm(len(flat), generator=ctx.generator).tolist()
        groups = [order[i : i + ctx.bucket_size] for i in range(0, len(order), ctx.bucket_size)]
        x = torch.stack([sum(flat[j] for j in g) / len(g) for g in groups])
    else:
        x = torch.stack(flat)
    return RULES[rule](x, ctx)


@dataclass(frozen=True)
class RobustSettings:
    rule: RuleName = "centered_clip"
    #: with the adaptive radius (default), a multiple of the median distance to the center
    clip_radius: float = 1.0
    adaptive_radius: bool = True
    momentum: float = 0.9
    bucket_size: int = 2
    trim_fraction: float = 0.2
    #: contributors not heard from for this many rounds lose their momentum state
    forget_after_rounds: int = 50


@dataclass
class ExpertRoundState:
    """What the robust aggregation of one expert remembers between rounds. At rest an
    aggregator keeps the center in bfloat16 and the momenta as Q8 blocks
    (core/aggregator/rounds.py ``ExpertRounds``); a round works on them in float32."""

    previous: torch.Tensor | None = None
    momenta: dict[str, torch.Tensor | Q8] | None = None
    last_seen: dict[str, int] | None = None
    rounds: int = 0
    #: how far honest inputs lie from the aggregate: the median distance (the lower
    #: middle) of the last round that had two contributors or more. A round with one
    #: contributor has nothing to compare it with, so its step is clipped to this.
    scale: float | None = None
    #: each momentum's weight in samples (what its past contributions carried, decayed
    #: by ``momentum`` at each of its rounds); absent for a momentum kept before weights
    #: were (it then blends as the plain rule would)
    weights: dict[str, float] | None = None


def save_round_state(
    state: ExpertRoundState, prefix: str, tensors: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """``state`` for a checkpoint: its tensors into ``tensors`` under ``prefix``, the
    rest returned."""
    if state.previous is not None:
        tensors[f"{prefix}/previous"] = state.previous
    for who, m in (state.momenta or {}).items():
        if isinstance(m, Q8):
            tensors[f"{prefix}/m/{who}"] = m.codes
            tensors[f"{prefix}/ms/{who}"] = m.scales
        else:
            tensors[f"{prefix}/m/{who}"] = m
    return {
        "rounds": state.rounds,
        "last_seen": state.last_seen or {},
        "weights": state.weights or {},
        "scale": state.scale,
    }


def load_round_state(
    meta: dict[str, Any], prefix: str, tensors: dict[str, torch.Tensor]
) -> ExpertRoundState:
    """The state :func:`save_round_state` saved."""
    momenta: dict[str, torch.Tensor | Q8] = {}
    for key, value in tensors.items():
        if key.startswith(f"{prefix}/m/"):
            who = key[len(prefix) + 3 :]
            scales = tensors.get(f"{prefix}/ms/{who}")
            momenta[who] = value if scales is None else Q8(value, scales, value.numel())
    return ExpertRoundState(
        tensors.get(f"{prefix}/previous"),
        momenta,
        dict(meta["last_seen"]),
        meta["rounds"],
        meta.get("scale"),
        {who: float(w) for who, w in meta.get("weights", {}).items()},
    )


def momentum_share(beta: float, weight: float | None, samples: int | None) -> float:
    """The share of a contributor's momentum that its new mean gradient takes. Without
    sample counts (or for a momentum kept without its weight), CC+momentum's 1 - beta.
    With them, the momentum is the samples' mean, each past round's decayed by beta:
    samples / (beta x weight + samples). Equal rounds give 1 - beta again; a momentum
    begun on 2 samples no longer outweighs 2,048 nine to one (a noisy honest input the
    rule clipped to a tenth: the credit of its samples with it, stop 67)."""
    if samples is None or weight is None:
        return 1.0 - beta
    return samples / (beta * weight + samples) if samples > 0 else 0.0


def robust_round(
    state: ExpertRoundState,
    contributions: dict[str, torch.Tensor],
    settings: RobustSettings,
    generator: torch.Generator | None = None,
    fallback_scale: float | None = None,
    samples: Mapping[str, int] | None = None,
) -> torch.Tensor:
    """One round: contributor -> per-sample mean gradient (flat) in, the aggregate out;
    ``samples``: contributor -> the samples its mean is over.

    Momentum is kept per contributor (the aggregator does, for each volunteer, what
    CC+momentum asks of workers): an attacker cannot make its inputs noisier than what it
    sent before, and honest inputs cluster tighter, so attacks have less room to hide.
    With ``samples``, each momentum is the decayed mean of its samples
    (:func:`momentum_share`): volunteers' rounds carry 1 to thousands of samples."""
    if not contributions:
        raise ValueError("nothing to aggregate")
    momenta = state.momenta if state.momenta is not None else {}
    last_seen = state.last_seen if state.last_seen is not None else {}
    weights = state.weights if state.weights is not None else {}
    beta = settings.momentum if settings.rule != "mean" else 0.0
    for who, g in contributions.items():
        g = g.reshape(-1).to(torch.float32)
        m = momenta.get(who)
        n = None if samples is None else samples[who]
        if m is None or beta == 0.0:
            momenta[who] = g.clone()
            weight = None if n is None else float(n)
        else:
            m = m.decode() if isinstance(m, Q8) else m
            share = momentum_share(beta, weights.get(who), n)
            momenta[who] = m.mul_(1.0 - share).add_(g, alpha=share)
            # a weight-less momentum joins the weighted ones at the plain rule's weight
            old = weights.get(who, n / (1.0 - beta) if n is not None else 0.0)
            weight = None if n is None else beta * old + n
        if weight is None:
            weights.pop(who, None)
        else:
            weights[who] = weight
        last_seen[who] = state.rounds
    previous = None if state.previous is None else state.previous.to(torch.float32)
    ctx = RoundContext(
        previous=previous,
        clip_radius=settings.clip_radius,
        adaptive_radius=settings.adaptive_radius,
        trim_fraction=settings.trim_fraction,
        bucket_size=settings.bucket_size,
        generator=generator,
    )
    inputs = [dense(momenta[w]) for w in contributions]
    if len(inputs) == 1 and settings.rule != "mean":
        result = lone_step(inputs[0], previous, state.scale or fallback_scale, settings)
    else:
        result = aggregate(settings.rule, inputs, ctx)
        state.scale = lower_median_distance(inputs, result)
    state.previous = result
    state.rounds += 1
    for who in [w for w, r in last_seen.items() if state.rounds - r > settings.forget_after_rounds]:
        del last_seen[who]
        momenta.pop(who, None)
        weights.pop(who, None)
    state.momenta, state.last_seen, state.weights = momenta, last_seen, weights
    return result


def dense(m: torch.Tensor | Q8) -> torch.Tensor:
    """A momentum as float32, whatever form it rests in."""
    return m.decode() if isinstance(m, Q8) else m


def distances(inputs: Sequence[torch.Tensor], center: torch.Tensor) -> list[float]:
    flat = center.reshape(-1).to(torch.float32)
    return [float((x.reshape(-1).to(torch.float32) - flat).norm()) for x in inputs]


def lower_median(values: Sequence[float]) -> float:
    """The lower middle: with two values, the smaller, so one attacker in two cannot
    make it larger; an honest one's while most are honest."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def lower_median_distance(inputs: Sequence[torch.Tensor], center: torch.Tensor) -> float:
    return lower_median(distances(inputs, center))


def lone_step(
    x: torch.Tensor, previous: torch.Tensor | None, scale: float | None, settings: RobustSettings
) -> torch.Tensor:
    """A round with one contributor: any rule returns its input, so a lone attacker used
    to set the aggregate (a x1000 step) and become the center that later rounds clip
    around, so that honest inputs looked like the outliers. Its step from the previous
    aggregate is clipped to clip_radius x the scale honest inputs had (this expert's last
    compared round, else what the caller knows from other experts). With no scale at all
    (an expert only ever trained by one contributor) there is nothing to judge it by."""
    if scale is None:
        return x.clone()
    center = previous if previous is not None else torch.zeros_like(x)
    diff = x - center
    radius = settings.clip_radius * scale
    norm = float(diff.norm())
    if norm <= radius:
        return x.clone()
    return center + diff * (radius / norm)


def influence(
    inputs: dict[str, torch.Tensor], aggregate: torch.Tensor, settings: RobustSettings
) -> dict[str, float]:
    """How much of each contributor's input the rule kept, in [0, 1]: the centered-clip
    scale min(1, radius / distance to the aggregate), radius = clip_radius x the median
    distance (as the rule computes it). An input a thousand times too large keeps ~0.1%;
    honest inputs keep most. For the other rules, the same measure of how far out an
    input lies. It explains rounds for people; it does not change them."""
    if not inputs:
        return {}
    if settings.rule == "mean":
        return dict.fromkeys(inputs, 1.0)
    dist = dict(zip(inputs, distances(list(inputs.values()), aggregate), strict=True))
    median = lower_median(list(dist.values()))
    radius = settings.clip_radius * median if settings.adaptive_radius else settings.clip_radius
    return {w: 1.0 if d <= radius or d == 0 else radius / d for w, d in dist.items()}
