"""Seven of sixteen volunteers attacking, in each way a cheater would try: does the model
still train, and is every attacker banned?

The swarm is the emulated one (core/demo/emulated.py: the demo's project and model, an
aggregator, a trainer and 16 volunteers on loopback in this process, every code path
real: RPC, DHT, receipts, answer audits, contributions, contribution audits, bans),
because 16 volunteer processes and more do not fit two cores. Each attack runs with the
manifest's audit rates (5% of answers, 5% of contributions); the reference is the same
swarm with every volunteer honest, trained on as many samples in the same process.

    python benchmarks/attack_table.py [--samples 320] [--attacks sign-flip alie ...]

One JSON line per run: ``final_loss`` (validation, nats per byte) and ``loss_ratio``
over the clean run's, the attackers banned (of 7) and honest volunteers banned, the
trainer's answer audits and the aggregator's contribution audits; then a summary line
with ``max_loss_ratio`` and ``all_attackers_banned``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.demo.attacks import ATTACKS
from core.demo.cheats import ANSWER_CHEATS
from core.demo.emulated import EmulationOptions, run_emulated


def contribution_audits(trainer: dict[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for agg in trainer.get("aggregators", []):
        for what, n in (agg.get("audits") or {}).items():
            if isinstance(n, int):
                total[what] = total.get(what, 0) + n
    return total


def contribution_audit_problems(trainer: dict[str, Any]) -> dict[str, int]:
    """Why contribution audits came out unverifiable or failed, by kind, all aggregators."""
    total: dict[str, int] = {}
    for agg in trainer.get("aggregators", []):
        for kind, n in ((agg.get("audits") or {}).get("problems") or {}).items():
            total[kind] = total.get(kind, 0) + int(n)
    return total


async def run(options: EmulationOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="moehome-attacks-") as tmp:
        result = await run_emulated(options, Path(tmp))
    (trainer,) = result["trainers"]
    banned = set(trainer.get("banned", {}))
    attackers = set(result["attackers"])
    return {
        "attack": options.attack if options.attackers else None,
        "volunteers": options.volunteers,
        "attackers": options.attackers,
        "samples": result["samples"],
        "seconds": round(result["seconds"], 1),
        "final_loss": round(float(trainer["final_loss"]), 4),
        "attackers_banned": len(attackers & banned),
        "honest_banned": len(banned - attackers),
        "answer_audits": {
            k: trainer.get("audits", {}).get(k) for k in ("audited", "failed", "unverifiable")
        },
        "contribution_audits": contribution_audits(trainer),
        "contribution_audit_problems": contribution_audit_problems(trainer),
        "banned_for": sorted(
            {reason.split(" (")[0] for reason in trainer.get("banned", {}).values()}
        ),
    }


async def main_async(args: argparse.Namespace) -> None:
    base = EmulationOptions(
        volunteers=args.volunteers,
        samples=args.samples,
        samples_per_s=args.speed,
        # as benchmarks/swarm_scaling.py: two processes host the volunteers, which
        # declare their experts every 180 s (at 16 in one process, the event loop lags)
        volunteer_processes=2,
        announce_seconds=180.0,
    )
    clean = await run(base)
    print(json.dumps(clean), flush=True)
    lines = []
    for attack in args.attacks:
        opts = replace(base, attackers=args.attackers, attack=attack)
        line = await run(opts)
        line["loss_ratio"] = round(line["final_loss"] / clean["final_loss"], 4)
        print(json.dumps(line), flush=True)
        lines.append(line)
    print(
        json.dumps(
            {
                "summary": True,
                "volunteers": args.volunteers,
                "attackers": args.attackers,
                "clean_loss": clean["final_loss"],
                "max_loss_ratio": max(x["loss_ratio"] for x in lines),
                "worst_attack": max(lines, key=lambda x: x["loss_ratio"])["attack"],
                "all_attackers_banned": all(x["attackers_banned"] == args.attackers for x in lines),
                "honest_banned": sum(x["honest_banned"] for x in lines),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--volunteers", type=int, default=16, help="all of them, attackers too")
    parser.add_argument("--attackers", type=int, default=7)
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--speed", type=float, default=0.25, help="samples/s per volunteer")
    parser.add_argument(
        "--attacks", nargs="+", default=[*ATTACKS, *ANSWER_CHEATS], help="which, in order"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
