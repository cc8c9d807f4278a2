"""Contribution audits (docs/decisions/010-verified-compute.md): an aggregator that drew
an accepted contribution asks its volunteer to reveal what the contribution's receipts
commit to (each backward request's inputs and output gradients, which the trainers'
signed hashes pin) and the error-feedback residual it carried, then recomputes the
parameter gradients with the weights of the contribution's version and compares.

An honest contribution is ``encode(sum of its receipts' gradients + residual)``, where
the residual is what encoding the volunteer's previous contribution to this expert
dropped: at most half a step of that contribution's grid per value. Both bounds are
checked, each the codec's own rounding plus the compute slack of
core/experts/tolerance.py, so an honest contribution's excess is at most 1 by
construction, and a cheat on the gradient (flipped, scaled, copied from other data,
drifted) shows unless it is smaller than the codec's rounding.

Pure functions of tensors and a module: the service (core/aggregator/service.py) draws,
asks and acts; anyone holding the evidence can run :func:`audit` again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import torch
from torch import nn

from core.contributing.codecs import CodecError, codec
from core.contributing.reveal import Reveal
from core.experts.registry import ExpertSpec
from core.experts.tolerance import COMPUTE_RTOL, in_float32
from core.protocol.contributions import Contribution, MessageError, tensor_digest

#: margin on the codec's rounding: float32 arithmetic on either side of the bound
ROUNDING_MARGIN: Final = 2.0**-7
#: the smallest magnitude a bound allows (float32's smallest normal number)
_FLOOR: Final = 2.0**-126

Outcome = Literal["passed", "failed", "unverifiable"]


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    #: the worst ratio of a difference to its honest bound (<= 1: honest)
    excess: float = 0.0
    #: what failed or could not be checked, in words ("" when it passed)
    problem: str = ""


def parameter_gradients(
    module: nn.Module, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The sum over ``pairs`` of the parameter gradients of ``module``'s backward passes,
    flat float32 per parameter (what a volunteer's accumulator sums). Requests of one
    shape run as one batch, as a volunteer's server batches them (rows are independent,
    so the sum is the same up to rounding, which the bound allows). In float32 from the
    weights and tensors as the project's dtype holds them (tolerance.in_float32)."""
    module = in_float32(module)
    module.zero_grad(set_to_none=True)
    groups: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for x, g in pairs:
        groups.setdefault(tuple(x.shape[1:]), []).append((x, g))
    for group in groups.values():
        x = torch.cat([x for x, _ in group]).float().detach().requires_grad_(True)
        g = torch.cat([g for _, g in group]).float()
        with torch.enable_grad():
            torch.autograd.backward(module(x), g)  # gradients add up across groups
    sums = {
        name: p.grad.detach().to(torch.float32).reshape(-1)
        for name, p in module.named_parameters()
        if p.grad is not None
    }
    module.zero_grad(set_to_none=True)
    return sums


def audit(
    spec: ExpertSpec,
    module: nn.Module,
    contribution: Contribution,
    parts: Sequence[torch.Tensor],
    reveal: Reveal,
    *,
    carried_accepted: bool,
) -> Verdict:
    """Is ``contribution`` (its encoded ``parts``) what ``module`` (the weights of its
    base version) computes from what ``reveal`` shows? ``carried_accepted``: the
    contribution whose residual it carries was accepted here (a residual can only be
    bounded by a contribution whose grid is known to be the one the volunteer used)."""
    for i, (receipt, (x, g)) in enumerate(zip(contribution.receipts, reveal.pairs, strict=True)):
        if tensor_digest([x]) != receipt.inputs_sha256:
            return Verdict("failed", math.inf, f"revealed inputs {i} are not the receipt's")
        if tensor_digest([g]) != receipt.grads_sha256:
            return Verdict("failed", math.inf, f"revealed gradients {i} are not the receipt's")
    try:
        chosen = codec(contribution.codec)
        per_param = len(parts) // len(contribution.params)
        claimed, bounds = {}, {}
        for i, p in enumerate(contribution.params):
            own = parts[i * per_param : (i + 1) * per_param]
            claimed[p.name] = chosen.decode(own, p.numel)
            bounds[p.name] = chosen.rounding_bound(own, p.numel)
    except CodecError as exc:
        return Verdict("failed", math.inf, f"its parts do not decode: {exc}")
    residual = dict(reveal.residual or {})
    if residual:
        problem = _residual_problem(contribution, reveal, residual, carried_accepted)
        if problem is not None:
            return problem
    sums = parameter_gradients(module, reveal.pairs)
    rtol = COMPUTE_RTOL[spec.torch_dtype]
    worst = 0.0
    for p in contribution.params:
        expected = sums.get(p.name, torch.zeros(p.numel))
        if p.name in residual:
            expected = expected + residual[p.name]
        got = claimed[p.name]
        if not torch.isfinite(got).all():
            return Verdict("failed", math.inf, f"{p.name} is not finite")
        slack = rtol * (expected.abs() + expected.square().mean().sqrt())
        bound = bounds[p.name] * (1 + ROUNDING_MARGIN) + slack + _FLOOR
        worst = max(worst, float(((got - expected).abs() / bound).max()))
    if worst > 1:
        return Verdict(
            "failed", worst, f"its gradient is not what its receipts compute ({worst:.3g}x)"
        )
    return Verdict("passed", worst)


def _residual_problem(
    contribution: Contribution,
    reveal: Reveal,
    residual: Mapping[str, torch.Tensor],
    carried_accepted: bool,
) -> Verdict | None:
    """None when the residual is what encoding the carried contribution can have left."""
    carried = reveal.carried
    if carried is None or not contribution.carried:
        return Verdict("failed", math.inf, "a residual was revealed but no contribution carried")
    same = (
        carried.nonce == contribution.carried
        and carried.contributor == contribution.contributor
        and carried.uid == contribution.uid
        and carried.project == contribution.project
        and [p.name for p in carried.params] == [p.name for p in contribution.params]
        and [p.numel for p in carried.params] == [p.numel for p in contribution.params]
    )
    if not same or not carried.verify_signature():
        return Verdict("failed", math.inf, "the carried contribution is not the one it named")
    if tensor_digest(reveal.carried_parts) != carried.payload_sha256:
        return Verdict("failed", math.inf, "the carried contribution's parts are not its own")
    if not carried_accepted:
        # its grid could be anything the volunteer made up: nothing bounds the residual
        return Verdict("unverifiable", 0.0, "the contribution it carries was not accepted here")
    try:
        chosen = codec(carried.codec)
        per_param = len(reveal.carried_parts) // len(carried.params)
        for i, p in enumerate(carried.params):
            own = reveal.carried_parts[i * per_param : (i + 1) * per_param]
            bound = chosen.rounding_bound(own, p.numel) * (1 + ROUNDING_MARGIN) + _FLOOR
            r = residual[p.name]
            if not torch.isfinite(r).all() or bool((r.abs() > bound).any()):
                return Verdict("failed", math.inf, f"the residual of {p.name} exceeds its rounding")
    except CodecError as exc:
        return Verdict("failed", math.inf, f"the carried parts do not decode: {exc}")
    return None


@dataclass(frozen=True)
class ContributionEvidence:
    """What shows that a contribution failed its audit, to anyone holding the weights of
    its version: the contribution as its volunteer signed it, its parts and what the
    volunteer revealed (each tensor pinned by a hash the trainers signed)."""

    header: bytes
    parts: tuple[torch.Tensor, ...]
    reveal: Reveal
    excess: float


def check_contribution_evidence(
    evidence: ContributionEvidence, spec: ExpertSpec, module: nn.Module
) -> str | None:
    """None when the evidence shows a cheat (the contribution is signed by its
    contributor, and is not what ``module``, its version's weights, computes from what
    was revealed); otherwise why not."""
    try:
        contribution = Contribution.decode(evidence.header)
    except MessageError as exc:
        return f"not a contribution: {exc}"
    if not contribution.verify_signature():
        return "the contribution is not signed by its contributor"
    if tensor_digest(evidence.parts) != contribution.payload_sha256:
        return "the parts are not the contribution's"
    verdict = audit(
        spec, module, contribution, evidence.parts, evidence.reveal, carried_accepted=True
    )
    if verdict.outcome != "failed":
        return f"the contribution passes its audit (excess {verdict.excess:.3g})"
    return None
