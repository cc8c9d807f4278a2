"""Contribution audits, measured (run by benchmarks/audit.py, which prints the lines).

Contributions are built by the real volunteer path: ExpertBackend's backward passes
(the server's pool batches several trainers' requests into one), the accumulator keeping
their tensors, the sender's error feedback and codec, its reveal. They are judged by
core/aggregator/audit.py, as an aggregator does.

- **Honest**: chains of contributions (each carrying the residual of the one before) in
  every codec, their requests batched as a server batches them (the auditor recomputes
  one request at a time), computed on one thread against the auditor's several or in
  float64 (a more precise device), on experts of several weight scales.
- **Cheats**: the gradient attacks of core/demo/attacks.py (sign flip, ALIE,
  copied from other data, a small drift), plus a gradient scaled by 1.05 and one with 1%
  noise; ``detected`` is the share of audits that fail. Every cheating contribution fails
  its audit or is not audited, so with rate r, ``catch_probability_100 = 1 - (1 - r x
  detected)^100``.
- **Overhead**: the volunteer's seconds for a contribution's requests (forward keeping
  the graph, backward through it, as it serves a trainer) beside the aggregator's for
  auditing it; ``audit_overhead = r x audit / served``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from core.aggregator.audit import Verdict, audit
from core.contributing.sender import ContributionSender, SenderConfig, _Kept
from core.demo.attacks import ATTACKS, Attack
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.uid import ExpertUID
from core.protocol.contributions import Contribution, Receipt
from net import Identity

CODECS = ["fp32", "fp16", "int8_block"]
UID = "ffn0.0.0"
PROJECT = "0" * 32
TRAINER = Identity.from_seed(b"t" * 32)
VOLUNTEER = Identity.from_seed(b"v" * 32)
#: cheats beyond core/demo/attacks.py's: what a careful cheater might shade
EXTRA_CHEATS = {
    "scaled x1.05": lambda g, gen: g * 1.05,
    "noised 1%": lambda g, gen: (
        g + 0.01 * g.norm() / g.numel() ** 0.5 * torch.randn(g.shape, generator=gen)
    ),
}


class Volunteer:
    """One served expert, its accumulator and its contribution sender (real code)."""

    def __init__(
        self,
        module: nn.Module,
        spec: ExpertSpec,
        codec: str,
        *,
        attack: str | None = None,
        precise: bool = False,
        seed: int = 0,
    ) -> None:
        self.spec = spec
        self.backend = ExpertBackend(ExpertUID.parse(UID), spec, module, device="cpu")
        peer: Any = SimpleNamespace(identity=VOLUNTEER)
        self.sender = ContributionSender(
            peer,
            {UID: self.backend},
            [TRAINER.peer_id],
            SenderConfig(project=PROJECT, codec=codec, kept_bytes=2**30),
            sums_hook=Attack(attack) if attack in ATTACKS else None,
        )
        self.extra = EXTRA_CHEATS.get(attack or "")
        self.precise = precise
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def serve(self, rows: int) -> None:
        """Backward requests totalling ``rows`` rows, batched as a busy server does."""
        sizes: list[int] = []
        while sum(sizes) < rows:
            sizes.append(min(self.rng.choice([1, 2, 4, 8, 16]), rows - sum(sizes)))
        while sizes:
            take = self.rng.randint(1, len(sizes))
            batch, sizes = sizes[:take], sizes[take:]
            xs = [torch.randn(n, self.spec.hidden, generator=self.gen) for n in batch]
            gs = [torch.randn(n, self.spec.hidden, generator=self.gen) * 1e-3 for n in batch]
            receipts = [
                Receipt.sign(TRAINER, PROJECT, UID, 0, [x], [g], x.shape[0])
                for x, g in zip(xs, gs, strict=True)
            ]
            x, g = torch.cat(xs), torch.cat(gs)
            if self.precise:
                self._precise_backward(x, g, receipts)
            else:
                self.backend.backward(x, g, receipts=receipts)

    def _precise_backward(self, x: torch.Tensor, g: torch.Tensor, receipts: list[Any]) -> None:
        """The gradients computed in float64 and rounded to float32 (another device)."""
        module = self.backend.module
        wide = build_expert(self.spec).double()
        wide.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
        xd = x.double().requires_grad_(True)
        wide(xd).backward(g.double())
        for (_, p), (_, pd) in zip(module.named_parameters(), wide.named_parameters(), strict=True):
            assert pd.grad is not None
            p.grad = pd.grad.float()
        self.backend.accumulator.add(
            module, x.shape[0], receipts, tensors=(x, g), budget=self.backend.kept_budget
        )

    def contribute(self) -> tuple[Contribution, list[torch.Tensor], _Kept]:
        ((module, accumulator),) = self.backend.accumulators()
        if self.extra is not None:
            sums = accumulator.sums
            for name in list(sums):
                sums[name] = self.extra(sums[name], self.gen)
        built = self.sender._build(UID, self.backend, module, accumulator)
        assert built is not None
        if self.sender.kept_budget is not None:
            self.sender.kept_budget.give_back(built[2].nbytes)
        return built


def judge(
    spec: ExpertSpec, weights: nn.Module, built: tuple[Contribution, list[torch.Tensor], _Kept]
) -> Verdict:
    contribution, parts, kept = built
    assert kept.reveal is not None
    return audit(spec, weights, contribution, parts, kept.reveal, carried_accepted=True)


def weights_of(spec: ExpertSpec, seed: int, factor: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    module = build_expert(spec, seed=seed)
    return {
        k: v + factor * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=gen)
        if v.numel() > 1
        else v
        for k, v in module.state_dict().items()
    }


def module_of(spec: ExpertSpec, state: dict[str, torch.Tensor]) -> nn.Module:
    module = build_expert(spec)
    module.load_state_dict(state)
    return module


def honest_contribution_audits(
    spec: ExpertSpec, n: int, seed: int, rows: int = 64, chain: int = 10
) -> dict[str, Any]:
    """``n`` honest contributions audited; the worst excess and how many went over."""
    variants = [(codec, w, way) for codec in CODECS for w in range(3) for way in range(3)]
    worst, accused, done = 0.0, 0, 0
    threads = torch.get_num_threads()
    i = 0
    while done < n:
        codec, w, way = variants[i % len(variants)]
        state = weights_of(spec, seed + w, (0.0, 1.0, 4.0)[w])
        auditor = module_of(spec, state)
        volunteer = Volunteer(
            module_of(spec, state), spec, codec, precise=way == 2, seed=seed * 7919 + i
        )
        for _ in range(min(chain, n - done)):
            if way == 1:  # the volunteer on one thread, the auditor on all
                torch.set_num_threads(1)
            volunteer.serve(rows)
            built = volunteer.contribute()
            torch.set_num_threads(threads)
            verdict = judge(spec, auditor, built)
            worst = max(worst, verdict.excess)
            accused += verdict.outcome != "passed"
            done += 1
        i += 1
    return {
        "contribution_honest_audits": done,
        "contribution_false_accusations": accused,
        "contribution_worst_honest_excess": round(worst, 4),
    }


def cheat_detection(
    spec: ExpertSpec, audits: int, seed: int, rows: int = 64
) -> list[dict[str, Any]]:
    out = []
    state = weights_of(spec, seed, 1.0)
    auditor = module_of(spec, state)
    for cheat in ["sign-flip", "alie", "copied", "drift", *EXTRA_CHEATS]:
        for codec in CODECS:
            volunteer = Volunteer(module_of(spec, state), spec, codec, attack=cheat, seed=seed)
            if cheat == "copied":  # its first contribution has nothing to copy: honest
                volunteer.serve(rows)
                volunteer.contribute()
            failed = 0
            for _ in range(audits):
                volunteer.serve(rows)
                failed += judge(spec, auditor, volunteer.contribute()).outcome == "failed"
            out.append({"contribution_cheat": cheat, "codec": codec, "detected": failed / audits})
    return out


def overhead(
    spec: ExpertSpec, rows: int, rate: float, timed_pairs: Any, per_request: int = 8
) -> dict[str, float]:
    """A contribution of ``rows`` rows (requests of ``per_request``): the volunteer's
    seconds serving them (forward keeping the graph, then backward through it) and
    building it, beside the aggregator's auditing it."""
    state = weights_of(spec, 0, 1.0)
    auditor = module_of(spec, state)
    volunteer = Volunteer(module_of(spec, state), spec, "fp16")
    backend = volunteer.backend
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(per_request, spec.hidden, generator=gen) for _ in range(rows // per_request)]
    gs = [torch.randn(x.shape, generator=gen) * 1e-3 for x in xs]
    receipts = [
        Receipt.sign(TRAINER, PROJECT, UID, 0, [x], [g], x.shape[0])
        for x, g in zip(xs, gs, strict=True)
    ]
    built: list[tuple[Contribution, list[torch.Tensor], _Kept]] = []

    def served() -> None:
        for x, g, r in zip(xs, gs, receipts, strict=True):
            _, handle = backend.forward(x, keep=True, owner="t")
            assert handle is not None
            backend.backward_kept("t", handle, g, receipts=[r])
        built[:] = [volunteer.contribute()]

    served()

    def audited() -> None:
        judge(spec, auditor, built[0])

    served_s, audit_s = timed_pairs(served, audited, 50)
    return {
        "contribution_rows": rows,
        "served_seconds": served_s,
        "audit_seconds": audit_s,
        "contribution_audit_overhead": rate * audit_s / served_s,
    }
