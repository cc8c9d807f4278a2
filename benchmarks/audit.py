"""Answer audits: how often honest answers are wrongly accused, how surely cheaters are
caught, and what the audits cost beside the work they check.

Everything is the real code in this process: experts built by the registry, served by
ExpertBackend (forward passes keeping their graph, backward passes through it, as a
volunteer answers a trainer), answers sent through the project's activation codec, and
audited by core/moe/audit.py against core/experts/tolerance.py's bound.

- **Honest audits** (``--honest``, at least 10,000): answers computed the ways honest
  volunteers differ from the auditor: the same kernels; one row at a time (other GEMM
  kernels); in float64, rounded to float32 (a more precise device); on one thread
  against the auditor's several; forward and backward; every codec; weights of several
  scales (a fresh expert, and one whose weights grew as training makes them). An honest
  answer over the bound is a false accusation.
- **Cheats**: each kind of wrong answer a volunteer could send, audited
  ``--cheat-audits`` times per codec on calls of the sizes the demo sends (below), and
  again on calls of 1-64 rows (``calls: "1-64 rows"``: fewer values per audit);
  ``detected`` is the share of its audits that fail.
  With the manifest's audit rate r, a volunteer cheating on every answer is caught
  within 100 answers with probability ``1 - (1 - r x detected)^100``
  (``catch_probability_100``: the worst cheat's).
- **Overhead**: the seconds of an audit of a forward and of a backward answer, beside
  the seconds the volunteer spent computing them (the reference, timed in the same run
  on the same expert and batch), for calls of every size the demo's trainer sends: the
  demo's model (local experts, the same gating) trained on its data for a few steps,
  every expert call's rows counted and binned by powers of two. The swarm's extra
  compute is ``r x sum(audit seconds) / sum(served seconds)`` over those calls
  (``answer_audit_overhead``): a small call's audit costs more than its own compute (a
  fixed ~0.2-0.7 ms), but such calls are a small share of the work; the worst size's
  own figure is printed too (``answer_audit_overhead_worst_size``).

    python benchmarks/audit.py [--honest 10000] [--cheat-audits 200] [--rate 0.05]

Prints one JSON line per cheat and a summary line with ``catch_probability_100``,
``audit_overhead``, ``false_accusations``, ``honest_audits``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contribution_audits
from trainer_local import demo_model

from core.demo import DemoOptions
from core.experts import activations
from core.experts.backend import ExpertBackend
from core.experts.registry import ExpertSpec, build_expert
from core.experts.uid import ExpertUID
from core.moe.answer_checks import Answer, audit, recompute
from core.moe.audit import AnswerAuditor
from core.trainer.data import load_corpus
from core.trainer.model import LocalMixtureOfExperts, build_model
from core.trainer.session import SessionSettings, TrainingSession
from net import Identity

CODECS = ["raw", "f16", "bf16", "q8", "q4", "q4z", "q3"]
PEER = Identity.from_seed(b"v" * 32).peer_id
UID = "ffn0.0.0"


def grown(module: nn.Module, factor: float, seed: int) -> nn.Module:
    """The expert after training moved its weights: each weight plus noise of ``factor``
    times its own scale (weights grow and lose their initial symmetry as they learn)."""
    gen = torch.Generator().manual_seed(seed)
    state = {
        k: v + factor * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=gen)
        if v.numel() > 1
        else v
        for k, v in module.state_dict().items()
    }
    module.load_state_dict(state)
    return module


def experts(spec: ExpertSpec) -> list[nn.Module]:
    return [grown(build_expert(spec, seed=s), f, s) for s, f in ((1, 0.0), (2, 1.0), (3, 4.0))]


def serve(module: nn.Module, spec: ExpertSpec) -> ExpertBackend:
    return ExpertBackend(ExpertUID.parse(UID), spec, module, device="cpu")


def honest_answer(
    how: str,
    module: nn.Module,
    backend: ExpertBackend,
    kind: str,
    x: torch.Tensor,
    g: torch.Tensor,
) -> torch.Tensor:
    """What an honest volunteer answers, computed ``how``."""
    if how == "row by row":
        rows = [
            honest_answer("same", module, backend, kind, x[i : i + 1], g[i : i + 1])
            for i in range(x.shape[0])
        ]
        return torch.cat(rows)
    if how == "float64":
        wide = build_expert(backend.spec).double()
        wide.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
        answer = Answer(kind, UID, PEER, 0, x.double(), g.double(), x, "raw")  # type: ignore[arg-type]
        return recompute(wide, answer, torch.float64).float()
    threads = torch.get_num_threads()
    if how == "one thread":
        torch.set_num_threads(1)
    try:
        y, handle = backend.forward(x, keep=kind == "backward", owner="trainer")
        if kind == "forward":
            return y
        assert handle is not None
        return backend.backward_kept("trainer", handle, g)
    finally:
        torch.set_num_threads(threads)


HOW = ["same", "row by row", "float64", "one thread"]


def batch(
    rng: random.Random,
    hidden: int,
    scales: tuple[float, ...] = (0.01, 1.0, 50.0),
    sizes: dict[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and output gradients of a call: 1-64 rows, or drawn from ``sizes`` (rows:
    calls, as the demo sends them); inputs of tiny to large magnitudes (honest audits),
    or of the demo's hidden states (~1: cheats)."""
    if sizes:
        rows = rng.choices(list(sizes), weights=list(sizes.values()))[0]
    else:
        rows = rng.choice([1, 3, 16, 64])
    scale = rng.choice(scales)
    x = torch.randn(rows, hidden) * scale
    g = torch.randn(rows, hidden) * rng.choice([1e-6, 1e-3, 1.0])
    return x, g


def honest_audits(spec: ExpertSpec, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    modules = experts(spec)
    backends = [serve(m, spec) for m in modules]
    accused: list[dict[str, Any]] = []
    worst = 0.0
    by: dict[str, float] = {}
    for i in range(n):
        k = rng.randrange(len(modules))
        module, backend = modules[k], backends[k]
        kind = rng.choice(["forward", "backward"])
        how, codec = rng.choice(HOW), rng.choice(CODECS)
        x, g = batch(rng, spec.hidden)
        x = activations.roundtrip(x, codec)  # what the server decoded
        g = activations.roundtrip(g, codec, stochastic=True)
        claimed = activations.roundtrip(honest_answer(how, module, backend, kind, x, g), codec)
        answer = Answer(kind, UID, PEER, 0, x, g if kind == "backward" else None, claimed, codec)  # type: ignore[arg-type]
        over = audit(module, answer, spec.torch_dtype)
        worst = max(worst, over)
        key = f"{kind}/{how}/{codec}"
        by[key] = max(by.get(key, 0.0), over)
        if over > 1:
            accused.append({"i": i, "case": key, "excess": over})
    return {
        "honest_audits": n,
        "false_accusations": len(accused),
        "worst_honest_excess": worst,
        "accused": accused[:5],
        "worst_by_case": dict(sorted(by.items(), key=lambda kv: -kv[1])[:5]),
    }


Cheat = Callable[[nn.Module, nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def _forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = module(x)
    return out


def _cheaper(module: Any, x: torch.Tensor) -> torch.Tensor:
    """A cheaper model: the feed-forward block at half its width, doubled."""
    inner = int(module.fc1.out_features)
    keep = (torch.arange(inner) < inner // 2).float() * 2
    with torch.no_grad():
        out: torch.Tensor = x + module.fc2(module.act(module.fc1(module.norm(x))) * keep)
    return out


CHEATS: dict[str, Cheat] = {
    "scaled x1.05": lambda m, old, x, y: y * 1.05,
    "scaled x1.01": lambda m, old, x, y: y * 1.01,
    "noised 5%": lambda m, old, x, y: y + 0.05 * y.pow(2).mean().sqrt() * torch.randn_like(y),
    "noised 1%": lambda m, old, x, y: y + 0.01 * y.pow(2).mean().sqrt() * torch.randn_like(y),
    "older version": lambda m, old, x, y: _forward(old, x),
    "lazy: inputs back": lambda m, old, x, y: x.clone(),
    "lazy: half the width": lambda m, old, x, y: _cheaper(m, x),
    "sign flip": lambda m, old, x, y: -y,
}


def older_version(module: nn.Module, spec: ExpertSpec) -> nn.Module:
    """The weights one optimizer step before: Adam moves every weight by about the
    learning rate (the demo's 3e-3)."""
    old = build_expert(spec)
    old.load_state_dict(
        {k: v - 3e-3 * torch.randn_like(v).sign() for k, v in module.state_dict().items()}
    )
    return old


def subset(rows: int, share: float, rng: random.Random) -> list[int]:
    """The rows of an answer an auditor recomputes (core/moe/audit.py's draw)."""
    auditor = AnswerAuditor(_NoWeights(), torch.float32, rate=1.0, row_share=share, rng=rng)
    return auditor.rows(rows)


class _NoWeights:
    async def module(self, uid: str, version: int) -> nn.Module | None:
        return None


def cheat_detection(
    spec: ExpertSpec, audits: int, seed: int, share: float, sizes: dict[int, int] | None = None
) -> list[dict[str, Any]]:
    """Each cheat's share of audits failed, on calls of ``sizes`` (default: 1-64 rows)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    modules = experts(spec)
    olds = [older_version(m, spec) for m in modules]
    lines = []
    for name, cheat in CHEATS.items():
        for codec in ("raw", "q8", "q4z"):
            failed = 0
            for _ in range(audits):
                k = rng.randrange(len(modules))
                x, _ = batch(rng, spec.hidden, (0.5, 1.0, 2.0), sizes)
                x = activations.roundtrip(x, codec)
                wrong = cheat(modules[k], olds[k], x, _forward(modules[k], x))
                claimed = activations.roundtrip(wrong, codec)
                rows = subset(x.shape[0], share, rng)
                answer = Answer("forward", UID, PEER, 0, x[rows], None, claimed[rows], codec)
                failed += audit(modules[k], answer, spec.torch_dtype) > 1
            lines.append(
                {"cheat": name, "codec": codec, "audits": audits, "detected": failed / audits}
            )
    return lines


def timed_pairs(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median seconds of each, timed in turn (a noisy machine slows both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 5):
        for fn, out in ((first, times[0]), (second, times[1])):
            started = time.perf_counter()
            fn()
            if i >= 5:  # warmed
                out.append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def demo_call_sizes(steps: int) -> dict[int, int]:
    """How many expert calls of each size (rows, rounded up to a power of two) the
    demo's trainer sends: its model, experts local but gated and routed as in the swarm,
    trained ``steps`` steps on the demo's data (the gate learns, and its choices
    spread or gather as it does)."""
    m, seed = demo_model()
    spec = m.expert_spec()
    sizes: dict[int, int] = {}

    class Counted(LocalMixtureOfExperts):
        def _through_wire(self, expert: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():  # a training call: evaluation is not audited
                size = 1 << max(0, (x.shape[0] - 1).bit_length())
                sizes[size] = sizes.get(size, 0) + 1
            return super()._through_wire(expert, x)

    model = build_model(
        m,
        lambda _i, grid: Counted(
            in_features=m.hidden, grid=grid, spec=spec, k_best=m.k_best, weights_seed=seed
        ),
        seed=seed,
    )
    options = DemoOptions()
    session = TrainingSession(
        model,
        load_corpus(),
        SessionSettings(
            project="local", batch_size=options.batch_size, learning_rate=options.learning_rate
        ),
    )
    for _ in range(steps):
        session.step_on(0)
    return sizes


def overhead(
    spec: ExpertSpec, rows: int, rate: float, codec: str, share: float
) -> dict[str, float]:
    """Seconds a volunteer spends on a forward and a backward answer of ``rows`` rows,
    and what auditing each costs the trainer (recomputing the drawn share of the rows,
    and the bound's check)."""
    torch.manual_seed(0)
    module = experts(spec)[1]
    backend = serve(module, spec)
    x = torch.randn(rows, spec.hidden)
    g = torch.randn(rows, spec.hidden) * 1e-3

    def served() -> None:
        _, handle = backend.forward(x, keep=True, owner="t")
        assert handle is not None
        backend.backward_kept("t", handle, g)
        backend.accumulator.take()

    claimed_y = activations.roundtrip(_forward(module, x), codec)
    xk = x.clone().requires_grad_(True)
    module(xk).backward(g)
    assert xk.grad is not None
    claimed_g = activations.roundtrip(xk.grad, codec)
    r = subset(rows, share, random.Random(0))
    forward_answer = Answer("forward", UID, PEER, 0, x[r], None, claimed_y[r], codec)
    backward_answer = Answer("backward", UID, PEER, 0, x[r], g[r], claimed_g[r], codec)

    def audited() -> None:
        audit(module, forward_answer, spec.torch_dtype)
        audit(module, backward_answer, spec.torch_dtype)

    served_s, audit_s = timed_pairs(served, audited, 300)
    return {
        "rows": rows,
        "audited_rows": len(r),
        "served_seconds": served_s,
        "audit_seconds": audit_s,
        "audit_overhead": rate * audit_s / served_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--honest", type=int, default=10000)
    parser.add_argument("--cheat-audits", type=int, default=200)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--row-share", type=float, default=0.25)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--call-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contribution-honest", type=int, default=10000)
    parser.add_argument("--contribution-cheat-audits", type=int, default=40)
    parser.add_argument("--contribution-rate", type=float, default=0.05)
    args = parser.parse_args()
    spec = ExpertSpec("ffn", hidden=args.hidden, inner=4 * args.hidden)

    calls = demo_call_sizes(args.call_steps)
    print(json.dumps({"demo_calls": {str(k): v for k, v in sorted(calls.items())}}), flush=True)
    # on calls of the sizes the demo sends, and on small calls only (1-64 rows: fewer
    # values per audit, the hardest case for a cheat that hides in the codec's rounding)
    detection = cheat_detection(spec, args.cheat_audits, args.seed, args.row_share, calls)
    small = cheat_detection(spec, args.cheat_audits, args.seed, args.row_share)
    for line in detection:
        line["catch_probability_100"] = 1 - (1 - args.rate * float(line["detected"])) ** 100
        print(json.dumps(line), flush=True)
    for line in small:
        line["catch_probability_100"] = 1 - (1 - args.rate * float(line["detected"])) ** 100
        print(json.dumps({"calls": "1-64 rows", **line}), flush=True)
    worst_small = min(small, key=lambda d: float(d["detected"]))
    costs = [overhead(spec, rows, args.rate, "q4z", args.row_share) for rows in sorted(calls)]
    for line in costs:
        line["calls"] = calls[int(line["rows"])]
        print(json.dumps({"overhead": line}), flush=True)
    honest = honest_audits(spec, args.honest, args.seed)
    worst = min(detection, key=lambda d: float(d["detected"]))

    c_rate = args.contribution_rate
    c_detection = contribution_audits.cheat_detection(
        spec, args.contribution_cheat_audits, args.seed
    )
    for line in c_detection:
        line["catch_probability_100"] = 1 - (1 - c_rate * float(line["detected"])) ** 100
        print(json.dumps(line), flush=True)
    c_costs = [
        contribution_audits.overhead(spec, rows, c_rate, timed_pairs)
        for rows in (16, 64, 256, 1024)
    ]
    for line in c_costs:
        print(json.dumps({"overhead": line}), flush=True)
    c_honest = contribution_audits.honest_contribution_audits(
        spec, args.contribution_honest, args.seed
    )
    c_worst = min(c_detection, key=lambda d: float(d["detected"]))
    # the swarm's extra compute: over the calls the demo sends, by how often each size is
    answer_overhead = (
        args.rate
        * sum(c["calls"] * c["audit_seconds"] for c in costs)
        / sum(c["calls"] * c["served_seconds"] for c in costs)
    )
    worst_size = max(costs, key=lambda c: c["audit_overhead"])
    # at the largest size measured: a contribution of the demo's carries ~1,100 rows (a
    # 40-step run: 640 samples x 64 tokens x 4 experts x 2 layers over ~290 of them);
    # smaller ones pay a fixed ~3 ms per audit (every size is printed above)
    contribution_overhead = c_costs[-1]["contribution_audit_overhead"]
    summary = {
        "summary": True,
        "hidden": args.hidden,
        "rate": args.rate,
        "row_share": args.row_share,
        "contribution_rate": c_rate,
        # the worst over every cheat on answers and on contributions
        "catch_probability_100": min(
            float(worst["catch_probability_100"]), float(c_worst["catch_probability_100"])
        ),
        "answer_catch_probability_100": float(worst["catch_probability_100"]),
        "contribution_catch_probability_100": float(c_worst["catch_probability_100"]),
        "hardest_cheat": f"{worst['cheat']} ({worst['codec']})",
        # on calls of 1-64 rows only
        "answer_catch_probability_100_small_calls": float(worst_small["catch_probability_100"]),
        "hardest_cheat_small_calls": f"{worst_small['cheat']} ({worst_small['codec']})",
        "hardest_contribution_cheat": f"{c_worst['contribution_cheat']} ({c_worst['codec']})",
        # both kinds of audit, as a share of the volunteers' work they check
        "audit_overhead": answer_overhead + contribution_overhead,
        "answer_audit_overhead": answer_overhead,
        "answer_audit_overhead_worst_size": worst_size["audit_overhead"],
        "answer_audit_worst_size_rows": worst_size["rows"],
        "contribution_audit_overhead": contribution_overhead,
        "contribution_audit_overhead_rows": c_costs[-1]["contribution_rows"],
        **honest,
        **c_honest,
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
