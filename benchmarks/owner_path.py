"""The README's owner path for real: its commands, one process each on this computer,
with the template's defaults and N volunteer nodes (the README's `node` line, once per
volunteer), trained for a while; then the demo's swarm trained for the same steps in
this process, as the reference.

    python benchmarks/owner_path.py [--minutes 10] [--volunteers 3]

Prints one JSON line:
- ``expert_versions_min``: the lowest version of any expert at the end (each version is
  a round of the aggregator, made from min_contributors volunteers' gradients);
- ``bans``: contributor bans by the aggregator plus "banning" lines in any log;
- ``contributions_sent_per_accepted``: over all volunteers (their control API's counts);
- ``volunteer_log_mb_per_hour``: the volunteers' logs, per volunteer;
- ``trainer_error_lines``: ERROR, Traceback and warning lines of the trainer's log;
- ``steps``, ``trainer_loss`` (its validation loss at the end) beside ``demo_loss``
  (`moehome demo`'s swarm, as many volunteers, the same steps) and both initial losses.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.demo import DemoOptions, run_demo
from tests.child_processes import stop_processes
from tests.readme_walk import OwnerWalk, Running, command_words, is_long_running, readme_blocks


def owner_run(home: Path, minutes: float, volunteers: int) -> dict[str, Any]:
    walk, more = readme_blocks("For project owners")[:2]
    status_json = next(c for c, _ in more if c.endswith("--json"))
    owner = OwnerWalk(home)
    node_line = next(c for c, _ in walk if command_words(c)[:1] == ["node"])
    trainer: Running | None = None
    nodes: list[Running] = []
    try:
        for command, _ in walk:
            words = command_words(command)
            if words[:1] == ["node"]:
                if command != node_line:
                    continue  # the README's second volunteer: started below, N of them
                for i in range(1, volunteers + 1):
                    nodes.append(owner.start(command.replace("=v1", f"=v{i}")))
                continue
            if not is_long_running(words):
                owner.run(command)
                continue
            if words[:2] == ["owner", "train"]:  # JSON lines to read its losses from
                command = f"{command} --json --steps 1000000"
            role = owner.start(command)  # and waited for, as the owner would
            if words[:2] == ["owner", "train"]:
                trainer = role
        assert trainer is not None
        started = time.monotonic()
        deadline = started + minutes * 60
        while time.monotonic() < deadline and trainer.proc.poll() is None:
            time.sleep(5)
        status = json.loads(owner.run(status_json))
        counts = [volunteer_counts(owner, i) for i in range(1, volunteers + 1)]
        hours = (time.monotonic() - started) / 3600
        trainer.proc.send_signal(signal.SIGINT)
        trainer.proc.wait(timeout=300)
        events = [json.loads(line) for line in trainer.lines if line.startswith("{")]
        summary = next(e for e in reversed(events) if e.get("event") == "summary")
        versions = {u: v for agg in status["aggregators"] for u, v in agg["versions"].items()}
        log_bytes = sum(n.stderr.stat().st_size for n in nodes)
        bans = sum(agg.get("banned_peers", 0) for agg in status["aggregators"])
        bans += sum(r.stderr.read_text(errors="replace").count("banning") for r in owner.running)
        trainer_errors = [
            line
            for line in trainer.stderr.read_text(errors="replace").splitlines()
            if any(word in line for word in ("ERROR", "Traceback", "WARNING"))
        ]
        sent = sum(c["sent"] for c in counts)
        accepted = sum(c["accepted"] for c in counts)
        return {
            "minutes": round(hours * 60, 1),
            "experts": len(versions),
            "expert_versions_min": min(versions.values()) if versions else 0,
            "expert_versions_max": max(versions.values()) if versions else 0,
            "bans": bans,
            "contributions_sent": sent,
            "contributions_accepted": accepted,
            "contributions_sent_per_accepted": round(sent / max(accepted, 1), 3),
            "refused": refused_by_reason(counts),
            "volunteer_log_mb_per_hour": round(log_bytes / 2**20 / volunteers / hours, 3),
            "trainer_error_lines": len(trainer_errors),
            "trainer_error_examples": trainer_errors[:3],
            "experts_waiting": status["experts_waiting"],
            "steps": summary["steps"],
            "trainer_initial_loss": summary["initial_loss"],
            "trainer_loss": summary["final_loss"],
        }
    finally:
        for role in owner.running:
            if role.proc.poll() is None:
                role.proc.send_signal(signal.SIGINT)
        stop_processes(role.proc for role in owner.running)


def refused_by_reason(counts: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for reason, n in c["refused"].items():
            out[reason] = out.get(reason, 0) + n
    return out


def volunteer_counts(owner: OwnerWalk, i: int) -> dict[str, Any]:
    """A volunteer's contributions, from its control API (`moehome status --json`)."""
    argv, env = owner.argv(f"MOEHOME_DATA_DIR=v{i} MOEHOME_CONFIG_DIR=v{i} moehome status --json")
    done = subprocess.run(argv, cwd=owner.home, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return {"sent": 0, "accepted": 0, "refused": {}}
    contributions = json.loads(done.stdout)["contributions"]
    return {
        "sent": contributions["sent"],
        "accepted": contributions["accepted"],
        "refused": contributions["refused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--volunteers", type=int, default=3)
    parser.add_argument("--no-demo", action="store_true", help="skip the reference run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "owner"
        home.mkdir()
        result = owner_run(home, args.minutes, args.volunteers)
    if not args.no_demo:
        options = DemoOptions(
            volunteers=args.volunteers, steps=result["steps"], eval_every=result["steps"]
        )
        demo = trio.run(lambda: run_demo(options, quiet=True, handle_signals=False))
        result["demo_initial_loss"] = demo["initial_loss"]
        result["demo_loss"] = demo["final_loss"]
    print(json.dumps({"benchmark": "owner_path", **result}))


if __name__ == "__main__":
    main()
